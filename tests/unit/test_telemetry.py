"""The functions' metrics are telemetry's definitions, published through one function.

tests/integration/test_spot_demo.py checks what the demo publishes against what the
stack reads; these check the code paths the demo does not take: every definition has a handler
that publishes it, and no handler names a metric of its own.
"""

from __future__ import annotations

import ast
from pathlib import Path

from gpufleet import handlers, telemetry
from gpufleet.handlers import common

HANDLERS = sorted(Path(handlers.__file__).parent.glob("on_*.py"))
PUBLISHING_CALLS = {"add_metric", "single_metric", "put_metric_data"}


def _calls(path: Path) -> set[str]:
    tree = ast.parse(path.read_text(encoding="utf-8"))
    return {
        node.func.attr if isinstance(node.func, ast.Attribute) else getattr(node.func, "id", "")
        for node in ast.walk(tree)
        if isinstance(node, ast.Call)
    }


def _telemetry_names(path: Path) -> set[str]:
    """The `telemetry.X` a module refers to."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    return {
        node.attr
        for node in ast.walk(tree)
        if isinstance(node, ast.Attribute)
        and isinstance(node.value, ast.Name)
        and node.value.id == "telemetry"
    }


def test_handlers_publish_only_through_count() -> None:
    """`count` takes a telemetry definition: a handler cannot publish a name of its own."""
    offenders = {path.name: _calls(path) & PUBLISHING_CALLS for path in HANDLERS}
    assert not {name: calls for name, calls in offenders.items() if calls}


def test_every_metric_defined_has_a_handler_that_publishes_it() -> None:
    constants = {
        name for name, value in vars(telemetry).items() if isinstance(value, telemetry.Metric)
    }
    # common.py's helpers (count_submission) publish for the handlers that call them.
    modules = [*HANDLERS, Path(common.__file__)]
    referred = set().union(*(_telemetry_names(path) for path in modules))
    assert constants - referred == set()
    assert {value.name for value in telemetry.ALL} == {
        getattr(telemetry, name).name for name in constants
    }


def test_metric_names_are_unique() -> None:
    names = [metric.name for metric in telemetry.ALL]
    assert len(names) == len(set(names))
