"""What a Lambda function's cold start loads (issue 16, "Cold start"): importing a handler
builds no boto3 client and reads no YAML; a service's builder imports its own service and no
other. Each check runs in a fresh interpreter, as a cold start does."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from gpufleet import topology

FUNCTIONS = Path(__file__).resolve().parents[2] / "functions"

# Counts the boto3 clients built, then imports every handler module and reports what loaded.
_IMPORT_HANDLERS = """
import importlib, json, sys
import boto3.session
built = []
original = boto3.session.Session.client
def counted(self, *args, **kwargs):
    built.append(args[0] if args else kwargs.get("service_name"))
    return original(self, *args, **kwargs)
boto3.session.Session.client = counted
for name in sys.argv[1:]:
    importlib.import_module(name)
print(json.dumps({"clients": built, "modules": sorted(sys.modules)}))
"""

# Builds one service of handlers/common.py and reports the gpufleet services then imported.
_BUILD_SERVICE = """
import json, sys
from gpufleet.handlers import common
getattr(common, sys.argv[1])()
print(json.dumps(sorted(m for m in sys.modules if m.startswith("gpufleet.services."))))
"""

SERVICES = {
    "intake": "gpufleet.services.intake",
    "dispatcher": "gpufleet.services.dispatcher",
    "metric_watch": "gpufleet.services.metric_watch",
    "reconciler": "gpufleet.services.reconciler",
    "backstop": "gpufleet.services.backstop",
}
# The services a service is made of (the reconciler ends abandoned jobs as the backstop does).
USES = {"reconciler": {"backstop"}}


def _run(probe: str, *argv: str) -> object:
    env = {
        "PATH": os.environ.get("PATH", ""),
        "PYTHONPATH": str(FUNCTIONS),
        "PYTHONDONTWRITEBYTECODE": "1",
        "AWS_REGION": "us-east-1",
        "AWS_ACCESS_KEY_ID": "cold",
        "AWS_SECRET_ACCESS_KEY": "cold",
        "AWS_LAMBDA_FUNCTION_NAME": "cold-start",
        topology.ENV_EVENT_BUS: "bus",
        topology.ENV_INTAKE_BUCKET: "bucket",
        **{table.env_var: f"table-{table.construct_id}" for table in topology.TABLES},
    }
    # This interpreter, a probe above and module names from the topology.
    out = subprocess.run(
        [sys.executable, "-c", probe, *argv], env=env, capture_output=True, text=True, check=True
    ).stdout
    return json.loads(out)


def test_importing_the_handlers_builds_no_client_and_reads_no_yaml() -> None:
    handlers = sorted({function.handler.rsplit(".", 1)[0] for function in topology.FUNCTIONS})
    loaded = _run(_IMPORT_HANDLERS, *handlers)
    assert isinstance(loaded, dict)
    assert loaded["clients"] == []  # the idempotency layer's DynamoDB client included
    assert set(handlers) <= set(loaded["modules"])
    assert "yaml" not in loaded["modules"]
    assert "gpufleet.services.factory" not in loaded["modules"]


# What a handler's first event brings, not its import: the domain's code and models, the
# services, the idempotency utility, Powertools' parser (its models of every AWS event).
_FIRST_EVENT = (
    "gpufleet.domain",
    "gpufleet.services",
    "gpufleet.adapters",
    "gpufleet.handlers.models",
    "aws_lambda_powertools.utilities.idempotency",
    "aws_lambda_powertools.utilities.parser",
)


@pytest.mark.parametrize(
    "handler", sorted({function.handler.rsplit(".", 1)[0] for function in topology.FUNCTIONS})
)
def test_a_handler_imports_no_domain_code_until_its_first_event(handler: str) -> None:
    loaded = _run(_IMPORT_HANDLERS, handler)
    assert isinstance(loaded, dict)
    assert handler in loaded["modules"]
    early = [m for m in loaded["modules"] if m.startswith(_FIRST_EVENT)]
    assert early == []


@pytest.mark.parametrize("builder", sorted(SERVICES))
def test_a_builder_imports_its_own_service_and_no_other(builder: str) -> None:
    imported = _run(_BUILD_SERVICE, builder)
    assert isinstance(imported, list)
    assert SERVICES[builder] in imported
    others = {SERVICES[name] for name in SERVICES.keys() - {builder} - USES.get(builder, set())}
    assert others.isdisjoint(imported)
