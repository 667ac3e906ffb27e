"""One exception base for the project (`gpufleet/errors.py`), and the kinds the lifecycle relies
on: a job's own errors are verdicts, a transient one never is."""

from __future__ import annotations

import ast
import functools
import importlib
import inspect
from pathlib import Path

import gpufleet
from gpufleet.adapters.aws import transactions
from gpufleet.domain.settlement import JOB_ERRORS
from gpufleet.errors import Conflict, GpufleetError, NotFound, RefusedInput, TransientError

PACKAGE = Path(gpufleet.__file__).parent


def lambda_entry(path: Path) -> bool:
    """A Lambda entry point: importing it starts Powertools' tracer, which a unit test may not
    (no sockets). They define event models only, which is checked on their source."""
    return path.parent.name == "handlers" and (path.name.startswith("on_") or path.stem == "common")


@functools.cache
def defined_exceptions() -> dict[str, type[BaseException]]:
    """Every exception class a gpufleet module defines, by qualified name (importing the
    modules that define classes)."""
    found: dict[str, type[BaseException]] = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        tree = ast.parse(path.read_text(encoding="utf-8"))
        classes = [node for node in ast.walk(tree) if isinstance(node, ast.ClassDef)]
        if lambda_entry(path):
            bases = {ast.unparse(base) for node in classes for base in node.bases}
            assert all(base.endswith("Model") for base in bases), (path, bases)
            continue
        if path.name == "__main__.py" or not classes:
            continue
        relative = path.relative_to(PACKAGE.parent).with_suffix("")
        module = importlib.import_module(".".join(relative.parts).removesuffix(".__init__"))
        for name, value in vars(module).items():
            if (
                inspect.isclass(value)
                and issubclass(value, BaseException)
                and value.__module__ == module.__name__
            ):
                found[f"{module.__name__}.{name}"] = value
    return found


def test_every_exception_the_project_defines_is_a_gpufleet_error() -> None:
    exceptions = defined_exceptions()
    assert len(exceptions) >= 20  # the walk found them
    strays = sorted(name for name, cls in exceptions.items() if not issubclass(cls, GpufleetError))
    assert strays == []


def test_a_jobs_own_errors_are_verdicts_and_no_transient_error_is() -> None:
    """Step Functions matches a failed step by its error's class name; `JOB_ERRORS` are those
    the lifecycle takes as the job's own (retrying would fail the same way)."""
    by_name = {cls.__name__: cls for cls in defined_exceptions().values()}
    assert set(by_name) >= JOB_ERRORS  # every name the lifecycle matches still exists
    for name in JOB_ERRORS:
        assert issubclass(by_name[name], RefusedInput | NotFound | Conflict), name
        assert not issubclass(by_name[name], TransientError), name
    transient = {name for name, cls in by_name.items() if issubclass(cls, TransientError)}
    assert {transactions.QueueContended.__name__, transactions.WriteContended.__name__} <= transient
    assert not transient & JOB_ERRORS
