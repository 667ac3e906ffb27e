"""Cold start of every Lambda handler, against a bare `import boto3`.

Each function's environment is the one the synthesized stack gives it (tokens such as table
names become placeholder strings), plus what the Lambda runtime sets (region, function name,
task root: the X-Ray SDK takes a cheaper path inside Lambda). Each figure is the median of
fresh interpreters:

- import: the handler module imported, as Lambda's init phase does;
- init: the import plus what its first event builds before any AWS call (settings, the ports
  and the services the handler calls).

    python scripts/bench_cold_start.py [--runs 5]

Target (issue 16): the worst handler's import at most 2x a bare `import boto3`.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
TARGET_RATIO = 2.0

# Run in a fresh interpreter: prints the import time, then the init time, in seconds.
_PROBE = """
import sys, time
start = time.perf_counter()
import importlib
module = importlib.import_module(sys.argv[1])
imported = time.perf_counter() - start
from gpufleet.handlers import common
for builder in sys.argv[2:]:
    getattr(common, builder)()
print(imported, time.perf_counter() - start)
"""
_BARE = "import time; s = time.perf_counter(); import boto3; print(time.perf_counter() - s)"


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
        env = {
            name: value if isinstance(value, str) else f"placeholder-{name.lower()}"
            for name, value in variables.items()
        }
        env.update(
            AWS_REGION="us-east-1",
            AWS_DEFAULT_REGION="us-east-1",
            AWS_LAMBDA_FUNCTION_NAME=logical_id,
            LAMBDA_TASK_ROOT="/var/task",
        )
        environments[properties["Handler"]] = env
    return environments


def _builders(handler_module: str) -> list[str]:
    """The services of handlers/common.py that the handler module calls."""
    from gpufleet.handlers import common

    source = (ROOT / "functions" / (handler_module.replace(".", "/") + ".py")).read_text()
    names = ("settings", "ports", "intake", "lifecycle", "dispatcher", "actions", "reconciler")
    return [name for name in names if hasattr(common, name) and f"{name}()" in source]


def _median_of(runs: int, argv: list[str], env: dict[str, str]) -> list[float]:
    samples = []
    for _ in range(runs):
        # argv is this interpreter, the probe above and module names from the topology.
        out = subprocess.run(  # noqa: S603
            argv, env=env, capture_output=True, text=True, check=True
        ).stdout
        samples.append([float(x) for x in out.split()])
    return [statistics.median(column) for column in zip(*samples, strict=True)]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--runs", type=int, default=5, help="fresh interpreters per figure")
    args = parser.parse_args()
    base = {
        "PATH": os.environ.get("PATH", ""),
        "PYTHONPATH": os.pathsep.join([str(ROOT / "functions"), str(ROOT)]),
        "PYTHONDONTWRITEBYTECODE": "1",
        "AWS_ACCESS_KEY_ID": "bench",
        "AWS_SECRET_ACCESS_KEY": "bench",
    }
    (bare,) = _median_of(args.runs, [sys.executable, "-c", _BARE], base)
    print(f"cold start, median of {args.runs} fresh interpreters")
    print(f"bare `import boto3`: {bare:.3f} s")
    print(f"{'handler':40} {'import s':>9} {'x boto3':>8} {'init s':>8}")
    worst = 0.0
    for handler, env in sorted(_stack_environments().items()):
        module = handler.rsplit(".", 1)[0]
        argv = [sys.executable, "-c", _PROBE, module, *_builders(module)]
        imported, init = _median_of(args.runs, argv, {**base, **env})
        worst = max(worst, imported / bare)
        print(f"{module:40} {imported:9.3f} {imported / bare:8.2f} {init:8.3f}")
    verdict = "met" if worst <= TARGET_RATIO else "NOT met"
    print(f"worst handler import: {worst:.2f}x bare boto3 (target {TARGET_RATIO:.0f}x: {verdict})")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
