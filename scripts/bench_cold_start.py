"""Cold start of every Lambda handler, against a bare `import boto3`.

Each function's environment is the one the synthesized stack gives it (tokens such as table
names become placeholder strings), plus what the Lambda runtime sets (region, function name,
task root: the X-Ray SDK takes a cheaper path inside Lambda). Each figure is the median of
fresh interpreters, in CPU seconds (a busy machine's other processes do not count), its ratio
over the bare imports run alternately with the handler's:

- import: the handler module imported, as Lambda's init phase does;
- init: the import plus what its first event builds before any AWS call (settings, the ports,
  the idempotency layer and the services the handler calls) and the modules its handler imports
  when called (the domain's code and models it parses its event with).

Both with the gpufleet package as the code zip ships it (no bytecode: on Lambda it is compiled
at every cold start) and compiled beforehand (pyc); the libraries keep their bytecode.

    python scripts/bench_cold_start.py [--runs 5]

Target (issue 16): the worst handler's import at most 2x a bare `import boto3`.
"""

from __future__ import annotations

import argparse
import ast
import compileall
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
TARGET_RATIO = 2.0

# Run in a fresh interpreter: prints the import time, then the init time, in seconds of the
# interpreter's CPU time. Importing is CPU work (reading files the page cache holds, compiling,
# building classes): on an idle machine its CPU time is its wall time, and unlike the wall
# time it does not count the other processes of a busy machine.
_PROBE = """
import sys, time
start = time.process_time()
import importlib
module = importlib.import_module(sys.argv[1])
imported = time.process_time() - start
from gpufleet.handlers import common
for name in sys.argv[2:]:
    if "." in name:
        importlib.import_module(name)
    else:
        getattr(common, name)()
print(imported, time.process_time() - start)
"""
_BARE = "import time; s = time.process_time(); import boto3; print(time.process_time() - s)"


def _stack_environments() -> dict[str, dict[str, str]]:
    """Each gpufleet function's handler path and environment variables, from a synthesized
    template (CDK's own helper functions are left out)."""
    sys.path[:0] = [str(ROOT / "functions"), str(ROOT)]
    os.environ.setdefault("JSII_SILENCE_WARNING_END_OF_LIFE_NODE_VERSION", "20")
    from infra.app import build_app

    from gpufleet import topology

    handlers = {function.handler for function in topology.FUNCTIONS}
    with tempfile.TemporaryDirectory() as outdir:
        app, stack = build_app(outdir=outdir)
        artifact = app.synth().get_stack_artifact(stack.artifact_id)
        template: dict[str, Any] = json.loads(Path(artifact.template_full_path).read_text())
    environments = {}
    for logical_id, resource in template["Resources"].items():
        properties = resource.get("Properties", {})
        if resource["Type"] != "AWS::Lambda::Function" or properties.get("Handler") not in handlers:
            continue
        variables = properties.get("Environment", {}).get("Variables", {})
        env = {name: _placeholder(value, name) for name, value in variables.items()}
        env.update(
            AWS_REGION="us-east-1",
            AWS_DEFAULT_REGION="us-east-1",
            AWS_LAMBDA_FUNCTION_NAME=logical_id,
            LAMBDA_TASK_ROOT="/var/task",
        )
        environments[properties["Handler"]] = env
    return environments


def _placeholder(value: Any, name: str) -> str:
    """A variable's value with its tokens made strings: a join stays a join (a variable such as
    `KEY=id,KEY=id` keeps its form), a reference or attribute names what it refers to."""
    if isinstance(value, str):
        return value
    if isinstance(value, dict) and "Fn::Join" in value:
        separator, parts = value["Fn::Join"]
        return str(separator).join(_placeholder(part, name) for part in parts)
    if isinstance(value, dict) and "Ref" in value:
        return f"placeholder-{str(value['Ref']).lower()}"
    if isinstance(value, dict) and "Fn::GetAtt" in value:
        return "placeholder-" + "-".join(str(part) for part in value["Fn::GetAtt"]).lower()
    return f"placeholder-{name.lower()}"


def _builders(handler_module: str) -> list[str]:
    """The services of handlers/common.py that the handler module calls."""
    from gpufleet.handlers import common

    source = (ROOT / "functions" / (handler_module.replace(".", "/") + ".py")).read_text()
    names = (
        "settings",
        "ports",
        "idempotency",
        "idempotency_store",
        "intake",
        "lifecycle",
        "dispatcher",
        "actions",
        "reconciler",
        "backstop",
        "metric_watch",
    )
    called = [name for name in names if hasattr(common, name) and f"{name}()" in source]
    if "once_per_delivery" in source:  # its first delivery builds the persistence layer
        called.append("idempotency_store")
    return called


def _first_event_imports(handler_module: str) -> list[str]:
    """The modules the handler module imports inside its functions: its first event's."""
    path = ROOT / "functions" / (handler_module.replace(".", "/") + ".py")
    tree = ast.parse(path.read_text())
    return sorted(
        {
            node.module
            for function in ast.walk(tree)
            if isinstance(function, ast.FunctionDef)
            for node in ast.walk(function)
            if isinstance(node, ast.ImportFrom) and node.module
        }
    )


def _samples(argv: list[str], env: dict[str, str]) -> list[float]:
    # argv is this interpreter, a probe above and module names from the topology.
    done = subprocess.run(argv, env=env, capture_output=True, text=True, check=False)  # noqa: S603
    if done.returncode != 0:
        raise SystemExit(f"{' '.join(argv[3:])} failed:\n{done.stderr}")
    return [float(x) for x in done.stdout.split()]


@dataclass(frozen=True)
class Figure:
    """One handler's medians, and the median of the bare imports run between its own."""

    imported: float
    init: float
    bare: float

    @property
    def ratio(self) -> float:
        return self.imported / self.bare


def _figure(runs: int, argv: list[str], env: dict[str, str], base: dict[str, str]) -> Figure:
    """Bare and handler interpreters alternate, so that both meet the same state of the
    machine (its caches, its load)."""
    bare, handler = [], []
    for _ in range(runs):
        bare.extend(_samples([sys.executable, "-c", _BARE], base))
        handler.append(_samples(argv, env))
    imported, init = (statistics.median(column) for column in zip(*handler, strict=True))
    return Figure(imported, init, statistics.median(bare))


def _package_copy(into: Path, compiled: bool) -> Path:
    """The gpufleet package as the stack's code zip holds it (no bytecode: on Lambda every cold
    start compiles it, /var/task being read-only), or compiled beforehand (`compiled`). The
    installed libraries keep the bytecode they have either way."""
    shutil.copytree(
        ROOT / "functions" / "gpufleet",
        into / "gpufleet",
        ignore=shutil.ignore_patterns("__pycache__", "*.pyc"),
    )
    if compiled:
        compileall.compile_dir(into, quiet=1)
    return into


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--runs", type=int, default=5, help="fresh interpreters per figure")
    args = parser.parse_args()
    environments = _stack_environments()
    print(f"cold start in CPU seconds, median of {args.runs} fresh interpreters (x boto3: over")
    print("the bare imports run alternately with the handler's; source: gpufleet compiled at")
    print("every start, as on Lambda; pyc: gpufleet compiled beforehand)")
    print(
        f"{'handler':34} {'import s':>9} {'x boto3':>8} {'init s':>7}"
        f" {'pyc import s':>13} {'x boto3':>8}"
    )
    worst = {"source": 0.0, "pyc": 0.0}
    bare_seconds: list[float] = []
    with tempfile.TemporaryDirectory() as source, tempfile.TemporaryDirectory() as pyc:
        folders = {
            "source": _package_copy(Path(source), compiled=False),
            "pyc": _package_copy(Path(pyc), compiled=True),
        }
        for handler, env in sorted(environments.items()):
            module = handler.rsplit(".", 1)[0]
            first_event = [*_first_event_imports(module), *_builders(module)]
            argv = [sys.executable, "-c", _PROBE, module, *first_event]
            figures = {}
            for mode, folder in folders.items():
                base = {
                    "PATH": os.environ.get("PATH", ""),
                    "PYTHONPATH": str(folder),
                    "PYTHONDONTWRITEBYTECODE": "1",
                    "AWS_ACCESS_KEY_ID": "bench",
                    "AWS_SECRET_ACCESS_KEY": "bench",
                }
                figures[mode] = _figure(args.runs, argv, {**base, **env}, base)
                worst[mode] = max(worst[mode], figures[mode].ratio)
            bare_seconds.append(figures["source"].bare)
            src, compiled = figures["source"], figures["pyc"]
            print(
                f"{module.removeprefix('gpufleet.handlers.'):34} {src.imported:9.3f}"
                f" {src.ratio:8.2f} {src.init:7.3f} {compiled.imported:13.3f} {compiled.ratio:8.2f}"
            )
    print(f"bare `import boto3`: {statistics.median(bare_seconds):.3f} s (median)")
    for mode, ratio in worst.items():
        verdict = "met" if ratio <= TARGET_RATIO else "NOT met"
        print(
            f"worst handler import ({mode}): {ratio:.2f}x bare boto3"
            f" (target {TARGET_RATIO:.0f}x: {verdict})"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
