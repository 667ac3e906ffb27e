"""docs/iam/submitter.json and operator.json against the calls the CLI really makes.

Each persona's commands run in-process against the embedded account, found through the stack
it publishes (`--stack`, as against AWS); every boto3 call the CLI makes (not the handlers it
sets off) is recorded and turned into the IAM actions it needs. Then, both ways:

- every action a persona's commands called is one its policy grants;
- every action a policy grants was called by one of its commands, or is in `NOT_REACHED` with
  the code path that calls it and this test does not take.

And every call that names its resource (a table or index, an object, the bus, an instance, the
topic) is on one its policy names, the placeholders filled in from the published stack as
docs/deploy.md fills them.

`gpufleet run` makes the calls of `submit`, `status` and `logs` (it is built of them); `doctor
--smoke` those of `submit` and `cancel`.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from fnmatch import fnmatchcase
from pathlib import Path
from typing import Any

import pytest

from gpufleet.cli import main
from gpufleet.domain.config import FleetConfig
from gpufleet.domain.queueing import QueuePolicy, TeamQuota
from gpufleet.emulator.account import Account, embedded_account
from gpufleet.emulator.nodes import AGENT_LOG_GROUP
from gpufleet.emulator.patches import EMULATOR, ApiCall, acting_as
from gpufleet.emulator.server import STACK_NAME, deployment, publish_stack
from tests.helpers import stop_running_executions

IAM = Path(__file__).resolve().parents[2] / "docs" / "iam"
CONFIG = FleetConfig(
    queue=QueuePolicy(
        max_gpus=16,
        max_instances=8,
        reserve_share=0.0,
        teams={"vision": TeamQuota(gpus=4), "parked": TeamQuota(gpus=0, borrow=0)},
    )
)
SPEC = "name: {name}\nteam: {team}\nimage: img\ncommand: [x]\nresources: {{gpus: 1}}\n"
# The IAM action of a transaction's item (IAM checks each item as its own call).
_ITEM_ACTIONS = {
    "Put": "PutItem",
    "Update": "UpdateItem",
    "Delete": "DeleteItem",
    "ConditionCheck": "ConditionCheckItem",
}
# Calls no permission governs.
_UNGOVERNED = {"sts:GetCallerIdentity"}
# Grants the commands below do not reach, per policy: action -> the path that needs it.
_REFUSED_AT_INTAKE = (
    "`submit` looks for intake's error report of an upload it refused (a spec the CLI passes "
    "and intake refuses: none here)"
)
_LOGS_WRITTEN = "`logs` reads the agent's stream once a node wrote one (no node runs here)"
_USAGE_WRITTEN = (
    "`status` and `report` read a run's usage once its node wrote some (no node runs here)"
)
NOT_REACHED: dict[str, dict[str, str]] = {
    "submitter.json": {
        "s3:ListBucketVersions": _REFUSED_AT_INTAKE,
        "logs:FilterLogEvents": _LOGS_WRITTEN,
        "s3:GetObject": _USAGE_WRITTEN,
    },
    "operator.json": {
        "s3:ListBucketVersions": _REFUSED_AT_INTAKE,
        "logs:FilterLogEvents": _LOGS_WRITTEN,
        "states:GetExecutionHistory": "`doctor --smoke` times the smoke job's steps from its "
        "execution (it launches a real instance: not run here)",
    },
}


Request = tuple[str, str | None]  # an IAM action and the resource it is on (None: not named)


def iam_requests(call: ApiCall, region: str, account_id: str) -> list[Request]:
    """What IAM judges a call as: each action with its resource; a transaction's items one by
    one, S3's own action names."""
    params = call.params

    def table(request: dict[str, Any]) -> str:
        index = f"/index/{request['IndexName']}" if request.get("IndexName") else ""
        return f"arn:aws:dynamodb:{region}:{account_id}:table/{request['TableName']}{index}"

    if call.action == "dynamodb:TransactWriteItems":
        return [
            (f"dynamodb:{_ITEM_ACTIONS[kind]}", table(request))
            for entry in params["TransactItems"]
            for kind, request in entry.items()
        ]
    if call.service == "dynamodb":
        return [(call.action, table(params) if "TableName" in params else None)]
    if call.service == "s3":
        version = "Version" if params.get("VersionId") else ""
        named = {
            "HeadObject": f"s3:GetObject{version}",
            "GetObject": f"s3:GetObject{version}",
            "ListObjectVersions": "s3:ListBucketVersions",
            "ListObjectsV2": "s3:ListBucket",
        }
        key = f"/{params['Key']}" if "Key" in params else ""
        return [(named.get(call.operation, call.action), f"arn:aws:s3:::{params['Bucket']}{key}")]
    if call.action == "events:PutEvents":
        return [
            (call.action, f"arn:aws:events:{region}:{account_id}:event-bus/{e['EventBusName']}")
            for e in params["Entries"]
        ]
    if call.action == "ec2:TerminateInstances":
        return [
            (call.action, f"arn:aws:ec2:{region}:{account_id}:instance/{instance}")
            for instance in params["InstanceIds"]
        ]
    if "TopicArn" in params:
        return [(call.action, params["TopicArn"])]
    return [] if call.action in _UNGOVERNED else [(call.action, None)]


def granted(policy: dict[str, Any]) -> set[str]:
    return {
        action
        for statement in policy["Statement"]
        if statement["Effect"] == "Allow"
        for action in statement["Action"]
    }


def allows(grants: set[str], action: str) -> bool:
    return any(fnmatchcase(action, grant) for grant in grants)


def filled(name: str, persona: Persona) -> dict[str, Any]:
    """A policy of docs/iam with its placeholders filled in as docs/deploy.md does, from the
    stack the embedded account publishes."""
    text = (IAM / name).read_text()
    values = {
        "ACCOUNT_ID": persona.account_id,
        "REGION": persona.account.region,
        "STACK_NAME": STACK_NAME,
        **deployment(persona.account),
    }
    for placeholder, value in values.items():
        text = text.replace(placeholder, value)
    document: dict[str, Any] = json.loads(text)
    return document


def on_resources(statement: dict[str, Any]) -> list[str]:
    resources = statement["Resource"]
    return [resources] if isinstance(resources, str) else list(resources)


@pytest.fixture(scope="module")
def account(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Account]:
    with embedded_account(config=CONFIG) as created:
        with acting_as(EMULATOR):
            publish_stack(created)
            # The node simulator makes it when a node first writes; none runs here.
            created.client("logs").create_log_group(logGroupName=AGENT_LOG_GROUP)
        yield created
        stop_running_executions(created)


class Persona:
    """Runs commands as a user with only the stack's name, recording the CLI's calls."""

    def __init__(self, account: Account, workdir: Path) -> None:
        self.account = account
        self.workdir = workdir
        self.calls: list[ApiCall] = []
        self.account_id: str = account.client("sts").get_caller_identity()["Account"]
        (workdir / "gpufleet.yaml").write_text(json.dumps(CONFIG.model_dump(mode="json")))

    def __call__(self, *argv: str) -> tuple[int, Any]:
        recorder = self.account.recorder
        start = len(recorder.calls)
        config = ["--config", str(self.workdir / "gpufleet.yaml")]
        with _captured() as out:
            code = main([*argv, "--stack", STACK_NAME, *config, "--json"])
        # The CLI's own calls: those no handler made (a handler's carry its function's name).
        self.calls += [c for c in recorder.calls[start:] if c.function is None]
        return code, _document(out.getvalue())

    def spec(self, name: str, team: str, extra: str = "") -> str:
        path = self.workdir / f"{name}.yaml"
        path.write_text(SPEC.format(name=name, team=team) + extra)
        return str(path)

    def requests(self) -> set[Request]:
        account_id = self.account_id
        region = self.account.region
        return {r for call in self.calls for r in iam_requests(call, region, account_id)}

    def actions(self) -> set[str]:
        return {action for action, _ in self.requests()}


def _document(text: str) -> Any:
    """What a command printed with --json: one document, or JSON lines (the last one)."""
    if not text.strip():
        return None
    try:
        return json.loads(text)
    except json.JSONDecodeError:
        return json.loads(text.splitlines()[-1])


class _captured:
    """stdout into a buffer (module fixtures cannot use capsys)."""

    def __enter__(self) -> Any:
        import io
        from contextlib import redirect_stdout

        self._buffer = io.StringIO()
        self._redirect = redirect_stdout(self._buffer)
        self._redirect.__enter__()
        return self._buffer

    def __exit__(self, *exc: object) -> None:
        self._redirect.__exit__(None, None, None)


def _admitted(account: Account, run: Persona, job_id: str) -> None:
    """Admission passes (the one-minute schedule's), until the job has left the queue."""
    import time

    deadline = time.monotonic() + 60
    while run("status", job_id)[1]["status"] == "QUEUED":
        assert time.monotonic() < deadline, f"{job_id} was never admitted"
        account.client("lambda").invoke(FunctionName=account.function_arns["Dispatch"])
        time.sleep(0.2)


@pytest.fixture(scope="module")
def submitter(account: Account, tmp_path_factory: pytest.TempPathFactory) -> Persona:
    run = Persona(account, tmp_path_factory.mktemp("submitter"))
    code, submitted = run("submit", run.spec("first", "vision"))
    assert code == 0
    job_id = submitted["job_id"]
    assert run("status", job_id)[0] == 0
    assert run("list")[0] == 0
    assert run("list", "--status", "QUEUED")[0] == 0
    assert run("list", "--team", "vision")[0] == 0
    assert run("logs", job_id)[0] == 0
    assert run("cost", "--by", "team")[0] == 0
    assert run("review")[0] == 0
    assert run("report", job_id, "--out", str(tmp_path_factory.mktemp("page")))[0] == 0
    code, _ = run("submit", run.spec("Not-A-Name", "vision"))
    assert code == 2  # refused here, before any upload: no call
    return run


@pytest.fixture(scope="module")
def operator(account: Account, tmp_path_factory: pytest.TempPathFactory) -> Persona:
    run = Persona(account, tmp_path_factory.mktemp("operator"))
    window = ("--from", "2099-01-01T00:00Z", "--to", "2099-01-01T01:00Z")
    assert run("book", "--team", "parked", "--gpus", "1", *window)[0] == 0
    waiting = run("submit", run.spec("waits", "parked"))[1]["job_id"]
    running = run("submit", run.spec("runs", "vision"))[1]["job_id"]
    assert run("status", waiting)[0] == 0
    assert run("queue")[0] == 0
    assert run("resize", waiting, "--gpus", "2")[0] == 0
    assert run("cancel", waiting)[0] == 0
    _admitted(account, run, running)
    assert run("resize", running, "--gpus", "2")[0] == 0  # a running job checkpoints
    assert run("cancel", running)[0] == 0
    assert run("list")[0] == 0
    # An array's progress: its children's statuses, read in batches.
    array = run("submit", run.spec("shards", "parked", "array: {size: 3}\n"))[1]["job_id"]
    assert run("list", "--array", array)[0] == 0
    assert run("cancel", array)[0] == 0
    assert run("logs", running)[0] == 0
    assert run("cost")[0] == 0
    assert run("review", "--team", "vision")[0] == 0
    assert run("report", running, "--out", str(tmp_path_factory.mktemp("page")))[0] == 0
    assert run("doctor")[0] in (0, 2)  # a verdict either way: its reads are what counts
    return run


@pytest.mark.parametrize("name", ["submitter.json", "operator.json"])
def test_every_call_a_persona_makes_is_granted_and_every_grant_is_used(
    request: pytest.FixtureRequest, name: str
) -> None:
    persona: Persona = request.getfixturevalue(name.removesuffix(".json"))
    policy = json.loads((IAM / name).read_text())
    grants = granted(policy)
    called = persona.actions()
    assert called, "no call was recorded"
    not_granted = sorted(a for a in called if not allows(grants, a))
    assert not_granted == [], f"{name} lacks {not_granted}"
    unused = sorted(g for g in grants if not any(fnmatchcase(a, g) for a in called))
    assert unused == sorted(NOT_REACHED[name]), f"{name} grants {unused}, never called"


@pytest.mark.parametrize("name", ["submitter.json", "operator.json"])
def test_every_call_is_on_a_resource_its_policy_names(
    request: pytest.FixtureRequest, name: str
) -> None:
    persona: Persona = request.getfixturevalue(name.removesuffix(".json"))
    statements = [s for s in filled(name, persona)["Statement"] if s["Effect"] == "Allow"]
    named = [(action, resource) for action, resource in persona.requests() if resource]
    assert named, "no call named its resource"
    outside = sorted(
        (action, resource)
        for action, resource in named
        if not any(
            allows(set(s["Action"]), action)
            and any(fnmatchcase(resource, r) for r in on_resources(s))
            for s in statements
        )
    )
    assert outside == [], f"{name} does not cover {outside}"


def test_the_operator_may_do_all_a_submitter_may() -> None:
    submitter = granted(json.loads((IAM / "submitter.json").read_text()))
    operator = granted(json.loads((IAM / "operator.json").read_text()))
    assert submitter <= operator
