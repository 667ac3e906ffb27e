"""Least privilege, checked both ways against what the functions really do.

The spot, preemption, stages and sweep demos (the stages demo with the basic demo's event
submission and broken upload added; the sweep's evaluation waits for an array) run the real
handlers on the embedded account, which logs each function's API calls with the parameters that
name what they touch. The stack is synthesized and each function's role read from the template.
Then:

- every call a function made is one its role allows, judged as IAM would: each action the call
  needs (a transaction's items one by one, a launch's tagging), on the template's resource
  (tables, index, bucket prefix, bus), with the conditions the request meets;
- every action a role grants was used by its function in one of the demos, or is listed in
  `NOT_REACHED` with the code path that uses it and the demos do not take. A grant no code path
  uses does not belong in `PERMISSIONS` / `JOBS_ACCESS` / `QUEUE_ACCESS`
  (infra/constructs/functions.py): remove it there, never list it here.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass
from fnmatch import fnmatchcase
from typing import Any

import boto3
import pytest
from moto import mock_aws

from gpufleet import topology
from gpufleet.adapters.aws.fleet import Ec2Fleet
from gpufleet.domain.launch import CapacityType, LaunchOverride, LaunchRequest
from gpufleet.emulator.account import ACCOUNT_ID, BUCKET_NAME, BUS_NAME, REGION
from gpufleet.emulator.demo import DemoResult
from gpufleet.emulator.patches import ApiCall
from gpufleet.topology import execution_arn
from tests.infrastructure.conftest import Synth
from tests.integration.demo_runs import SpotRun, SweepRun

pytestmark = pytest.mark.long  # whole demos: scheduled first (tests/conftest.py)

FUNCTIONS = [f.construct_id for f in topology.FUNCTIONS]

# Used by the Lambda service and runtime, never by handler code: trace segments, the runtime's
# log lines, failed asynchronous events sent to the dead-letter queue.
RUNTIME_ACTIONS = frozenset(
    {
        "xray:PutTraceSegments",
        "xray:PutTelemetryRecords",
        "logs:CreateLogStream",
        "logs:PutLogEvents",
        "sqs:SendMessage",
    }
)
# Conditions on the tags of the resource acted on (an instance, a placement group): the request
# does not carry them. Those tags are the ones CreateFleet and CreatePlacementGroup set, and
# their `aws:RequestTag` conditions are judged here.
ON_EXISTING_TAGS = frozenset({f"aws:ResourceTag/{topology.TAG_MANAGED}"})

# Grants the demos may not use, by function: "<Sid> <action>" -> the code path that uses it
# (paths the demos do not take, or take only when a race goes one way).
_IDEMPOTENCY = {
    "IdempotencyIdempotencyTable dynamodb:GetItem": "Powertools reads a record only when a "
    "duplicate delivery's conditional put does not return the existing one",
    "IdempotencyIdempotencyTable dynamodb:DeleteItem": "Powertools deletes the record of a "
    "delivery whose handling raised, so that a retry runs",
}
_BUDGET_ALERTS = "budgets reached (none in the demos' config)"
_HELD = (
    "a job that waits for a job submitted before it (by id) is held on it as intake queues it, "
    "the dependency read (the sweep demo's evaluation waits for an array of its own submission)"
)
_NO_RESERVATIONS = "planning reads live jobs only with capacity reservations (none configured)"
_BOOKINGS = {
    "QueueState dynamodb:Query": "a job larger than its team's quota can hold: intake reads "
    "the team's bookings (the demos' jobs fit their quotas)",
}
NOT_REACHED: dict[str, dict[str, str]] = {
    topology.INTAKE_FROM_S3.construct_id: {
        **_IDEMPOTENCY,
        **_BOOKINGS,
        "Jobs dynamodb:BatchGetItem": _HELD,
    },
    topology.INTAKE_FROM_EVENT.construct_id: {
        **_IDEMPOTENCY,
        **_BOOKINGS,
        "Jobs dynamodb:BatchGetItem": _HELD,
        "Jobs dynamodb:Query": "the sample event's spec gives expected_duration, so no past "
        "runs are read; " + _NO_RESERVATIONS,
    },
    topology.ENQUEUE.construct_id: {
        "Jobs dynamodb:Query": "admitting a job as it arrives totals the spend of teams with "
        "a monthly budget (none in the demos' config)",
    },
    topology.DISPATCH.construct_id: {
        "AdmissionQueue dynamodb:GetItem": "frees the share of a job that ended while its "
        "admission was being told",
        "Jobs dynamodb:Query": "only for teams with a monthly budget (none in the demos' config)",
        "PublishAlerts sns:Publish": _BUDGET_ALERTS,
        "EncryptAlerts kms:Decrypt": _BUDGET_ALERTS,
        "EncryptAlerts kms:GenerateDataKey": _BUDGET_ALERTS,
        "TerminateManagedInstances ec2:TerminateInstances": "victims that overstay the "
        "preemption grace period, and jobs stopped at their budget",
    },
    topology.LAUNCH.construct_id: {
        "Jobs dynamodb:Query": _NO_RESERVATIONS,
        "TerminateManagedInstances ec2:TerminateInstances": "instances an earlier, crashed "
        "attempt of the launch left behind",
    },
    topology.NODE_REPORT.construct_id: {
        "CompleteLifecycleTask states:SendTaskHeartbeat": "nodes report a heartbeat every "
        "minute; the demos' runs are shorter",
    },
    topology.INSTANCE_EVENT.construct_id: {
        # The spot demo's node checkpoints on its own warning (IMDS) and is usually requeued
        # before EventBridge's warning reaches InstanceEvent: the job no longer holds the
        # instance, and the event is ignored. When the event wins the race, it drains the job.
        "Jobs dynamodb:UpdateItem": "drains a job only when the warning wins the race with the "
        "node's own checkpoint",
        "WriteRunManifests s3:PutObject": "the drain's control object, as above",
        "CompleteLifecycleTask states:SendTaskSuccess": "ends the run of an instance that "
        "stopped or terminated while its job still held it",
    },
    topology.METRIC_WATCH.construct_id: {
        "AdmissionQueue dynamodb:ConditionCheckItem": "resizing a job that waits in the queue "
        "(an alarm racing a requeue): its entry is enqueued again",
        "AdmissionQueue dynamodb:DeleteItem": "as above: its old entry is removed",
        "AdmissionQueue dynamodb:PutItem": "as above",
        "AdmissionQueue dynamodb:UpdateItem": "as above (the waiting counters)",
        "Jobs dynamodb:ConditionCheckItem": "as above (the job must still be QUEUED)",
    },
    topology.RECONCILE.construct_id: {
        # Some passes of the demos find a job's instances running, some none: timing.
        "Jobs dynamodb:GetItem": "the job of each running instance gpufleet tagged, to tell "
        "orphans (its job ended) from live ones",
        "TerminateManagedInstances ec2:TerminateInstances": "orphans: the demos' releases leave "
        "none",
        "DeleteManagedPlacementGroups ec2:DeletePlacementGroup": "groups of ended jobs that "
        "Release did not delete: the demos' releases leave none",
    },
    topology.RELEASE.construct_id: {
        "Jobs dynamodb:Query": "planning a stage's run on the previous stage's instances reads "
        "past runs only for specs without expected_duration; " + _NO_RESERVATIONS,
    },
    topology.WORKFLOW_ENDED.construct_id: {
        "DeleteManagedPlacementGroups ec2:DeletePlacementGroup": "a multi-node job's group: "
        "the stopped job has one node",
        "AdmissionQueue dynamodb:Query": "a job whose workflow ended while it waited in the "
        "queue: its entry is looked up and removed",
        "AdmissionQueue dynamodb:DeleteItem": "as above, and its share of the quotas when it "
        "held one (the stopped job's is released in a transaction)",
    },
}
# The reconciler ends runs and jobs only after minutes (lost events): the demos' passes find
# none; whether a pass comes at all during a demo is timing.
_LOST_EVENTS_ONLY = {
    "ListLifecycles states:ListExecutions": "every pass (when one comes during the demo)",
    "CompleteLifecycleTask states:SendTaskSuccess": "the run of an instance that went away "
    "unheard (its state-change event lost)",
    "PublishControlPlaneEvents events:PutEvents": "the final status of a job whose workflow "
    "ended unheard",
    "Jobs dynamodb:UpdateItem": "as above, and the end of a run whose instance went away",
    "Jobs dynamodb:Query": "the live jobs, by status (every pass)",
    **{
        f"AdmissionQueue dynamodb:{action}": "as above: its wait in the queue, its share"
        for action in ("GetItem", "Query", "UpdateItem", "DeleteItem")
    },
}
NOT_REACHED[topology.RECONCILE.construct_id].update(_LOST_EVENTS_ONLY)
# No demo runs on a Capacity Block: its drains (the reconciler's before its end, BlockEnding's on
# EC2's warning) run in tests/integration/test_block_warning.py and test_blocks_and_windows.py.
_BLOCK_DRAINS = "a run on a Capacity Block drained before its end (no demo runs on a block)"
NOT_REACHED[topology.RECONCILE.construct_id]["WriteRunManifests s3:PutObject"] = _BLOCK_DRAINS
NOT_REACHED[topology.BLOCK_ENDING.construct_id] = dict.fromkeys(
    (
        "WriteRunManifests s3:PutObject",
        "Jobs dynamodb:Query",
        "Jobs dynamodb:GetItem",
        "Jobs dynamodb:UpdateItem",
        "QueueState dynamodb:UpdateItem",
        "CapacityMemory dynamodb:PutItem",
    ),
    _BLOCK_DRAINS,
)
# Daily: no demo lasts a day. tests/integration/test_catalog_refresh.py runs it on the
# embedded account and checks its calls against this role.
NOT_REACHED[topology.CATALOG_REFRESH.construct_id] = {
    "WriteRefreshedCatalog s3:PutObject": "the daily schedule (no demo lasts a day)",
    "ReadPrices pricing:GetProducts": "as above",
}
# Each Lambda function reads the refreshed catalog when it first plans, once per process. The
# embedded account runs every function in one process: the first to plan (intake) reads it.
for _planner in (
    topology.INTAKE_FROM_EVENT,
    topology.DISPATCH,  # it plans an array's child as it starts the child's workflow
    topology.LAUNCH,
    topology.REQUEUE,
    topology.METRIC_WATCH,
    topology.RELEASE,
):
    NOT_REACHED.setdefault(_planner.construct_id, {})["ReadRefreshedCatalog s3:GetObject"] = (
        "the embedded account's functions share one process, whose first plan (intake's) "
        "read the catalog"
    )


def _arn(service: str, resource: str) -> str:
    """An ARN of the stack's account and region, as the template renders `Stack.format_arn`."""
    return f"arn:<AWS::Partition>:{service}:<AWS::Region>:<AWS::AccountId>:{resource}"


@dataclass(frozen=True)
class Request:
    """One authorization IAM makes for a call: an action on a resource, with the condition keys
    the request sets. `resource` None stands for the resources a launch uses that this test does
    not model one by one (launch template, subnets, image, volumes, network interfaces)."""

    action: str
    resource: str | None
    context: Mapping[str, str] = dataclasses.field(default_factory=dict)


@dataclass(frozen=True)
class Grant:
    """One action of one statement of a role: what it allows, where, on what conditions."""

    sid: str
    action: str  # may be a pattern: "ec2:Describe*"
    resources: tuple[str, ...]  # rendered: "<JobStoreJobsTable83DB547D.Arn>/index/by_team"
    conditions: Mapping[str, Mapping[str, Any]]

    @property
    def key(self) -> str:
        return f"{self.sid} {self.action}"

    def covers(self, request: Request) -> bool:
        """The action and resource match (IAM's wildcards; actions are case-insensitive)."""
        if not fnmatchcase(request.action.lower(), self.action.lower()):
            return False
        return request.resource is None or any(
            fnmatchcase(request.resource, pattern) for pattern in self.resources
        )

    def allows(self, request: Request) -> bool:
        return self.covers(request) and all(
            self._holds(operator, key, expected, request)
            for operator, keys in self.conditions.items()
            for key, expected in keys.items()
        )

    @staticmethod
    def _holds(operator: str, key: str, expected: Any, request: Request) -> bool:
        if key in ON_EXISTING_TAGS:
            return True
        # ForAllValues of a single-valued key (a DynamoDB item's partition, `LeadingKeys`): the
        # request must name it (stricter than IAM, which lets a request without it through).
        assert operator in ("StringEquals", "ForAllValues:StringEquals"), (
            f"teach this test the {operator} condition"
        )
        allowed = expected if isinstance(expected, list) else [expected]
        return request.context.get(key) in allowed


@dataclass
class Stack:
    """The synthesized template's view of the account: each function's grants, and the
    template's name (rendered) for each resource of the embedded account."""

    grants: dict[str, list[Grant]]
    tables: dict[str, str]  # emulator table name -> "<LogicalId.Arn>"
    bucket: str
    bus: str
    state_machine: str
    topic: str
    # The topic's customer-managed key; None for an AWS-managed one, whose policy lets the
    # account's principals use it through SNS without a grant of their own.
    topic_key: str | None


# -- the demos ---------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def calls(
    spot_demo: SpotRun, preemption_demo: DemoResult, stages_demo: DemoResult, sweep_demo: SweepRun
) -> list[ApiCall]:
    """The calls of the four demos (conftest's, shared with the modules that test them)."""
    return [
        *spot_demo.result.calls,
        *preemption_demo.calls,
        *stages_demo.calls,
        *sweep_demo.result.calls,
    ]


@pytest.fixture(scope="module")
def reservation_launches() -> list[ApiCall]:
    """What Launch asks EC2 for a Capacity Block and for an ODCR, with every parameter.

    The demos' config has no reservations, and the demos' log keeps only the parameters that
    name what a call touches; so the adapter the Launch handler uses makes these calls here,
    on moto, and they are kept whole.
    """
    requests = [
        LaunchRequest(
            job_id=f"j-{number:020x}",
            attempt=0,
            capacity_type=CapacityType.RESERVED,
            nodes=1,
            overrides=[
                LaunchOverride(
                    instance_type="p5.48xlarge",
                    zone=f"{REGION}a",
                    hourly_usd=0.0,
                    reservation_id="cr-0123456789abcdef0",
                    capacity_block=capacity_block,
                )
            ],
        )
        for number, capacity_block in ((1, True), (2, False))
    ]
    sent: list[ApiCall] = []

    def keep(params: dict[str, Any], model: Any, **_: Any) -> None:
        if model.name in _LAUNCH_OPERATIONS:
            sent.append(ApiCall(topology.LAUNCH.construct_id, "ec2", model.name, dict(params)))

    with mock_aws():
        ec2 = boto3.client("ec2", region_name=REGION)
        vpc = ec2.create_vpc(CidrBlock="10.0.0.0/16")["Vpc"]["VpcId"]
        subnet = ec2.create_subnet(
            VpcId=vpc, CidrBlock="10.0.0.0/24", AvailabilityZone=f"{REGION}a"
        )["Subnet"]["SubnetId"]
        template = ec2.create_launch_template(
            LaunchTemplateName="gpufleet", LaunchTemplateData={"ImageId": "ami-12c6146b"}
        )["LaunchTemplate"]["LaunchTemplateId"]
        ec2.meta.events.register("provide-client-params.ec2.*", keep)
        fleet = Ec2Fleet(ec2, {"x86_64-nvidia": template}, [subnet])
        for request in requests:
            fleet.launch(request)
    assert sorted(call.operation for call in sent) == ["CreateFleet", "RunInstances"]
    return sent


@pytest.fixture(scope="module")
def calls_by_function(
    calls: list[ApiCall], reservation_launches: list[ApiCall]
) -> dict[str, list[ApiCall]]:
    by_function: dict[str, list[ApiCall]] = {}
    for call in [*calls, *reservation_launches]:
        if call.function is not None:
            by_function.setdefault(call.function, []).append(call)
    return by_function


# -- the template ------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def stack(synth: Synth) -> Stack:
    def arn_of(env_var: str) -> str:
        return f"<{synth.ref_target(env_var)}.Arn>"

    grants: dict[str, list[Grant]] = {}
    for function in FUNCTIONS:
        grants[function] = [
            Grant(
                sid=statement.get("Sid", ""),
                action=action,
                resources=tuple(synth.render(r) for r in synth.resources_of(statement)),
                conditions=statement.get("Condition", {}),
            )
            for statement in synth.statements_of_role(synth.role_of_function(function))
            if statement["Effect"] == "Allow"
            for action in synth.actions_of(statement)
        ]
    [state_machine] = synth.of_type("AWS::StepFunctions::StateMachine")
    topic = synth.function_env(topology.METRIC_WATCH.construct_id)[topology.ENV_NOTIFY_TOPIC]
    key = synth.props(topic["Ref"]).get("KmsMasterKeyId")
    topic_key = synth.render(key) if isinstance(key, dict) and "Fn::GetAtt" in key else None
    return Stack(
        grants=grants,
        # The embedded account names each resource gpufleet-<construct id> (emulator/account.py).
        tables={f"gpufleet-{t.construct_id}": arn_of(t.env_var) for t in topology.TABLES},
        bucket=arn_of(topology.ENV_INTAKE_BUCKET),
        bus=arn_of(topology.ENV_EVENT_BUS),
        state_machine=_arn(
            "states", f"stateMachine:{synth.props(state_machine)['StateMachineName']}"
        ),
        topic=synth.render(topic),
        topic_key=topic_key,
    )


# -- what IAM authorizes for each call ---------------------------------------------------------

_ITEM_ACTIONS = {
    "Put": "PutItem",
    "Update": "UpdateItem",
    "Delete": "DeleteItem",
    "ConditionCheck": "ConditionCheckItem",
}
# Besides the call's own action, a launch needs these (EC2 authorizes an instant fleet's
# RunInstances against the caller; tags given at launch need CreateTags).
_LAUNCH_ACTIONS = {"CreateFleet": ("ec2:CreateFleet", "ec2:RunInstances")}
_LAUNCH_OPERATIONS = ("CreateFleet", "RunInstances")
# SNS encrypts a message for an encrypted topic with the publisher's own permissions on its key.
_PUBLISH_KEY_ACTIONS = ("kms:GenerateDataKey", "kms:Decrypt")


def _leading_key(params: Mapping[str, Any]) -> dict[str, str]:
    """`dynamodb:LeadingKeys` of an item operation (alone or in a transaction, where IAM
    checks each item): the value of the key's partition key (of the item, for a put)."""
    key = params.get("Key", params.get("Item"))
    if not isinstance(key, Mapping):
        return {}
    [table] = [t for t in topology.TABLES if params["TableName"] == f"gpufleet-{t.construct_id}"]
    [value] = key[table.partition_key].values()
    return {"dynamodb:LeadingKeys": str(value)}


def requests(call: ApiCall, stack: Stack) -> list[Request]:
    params = call.params
    if call.action == "dynamodb:TransactWriteItems":
        return [
            Request(
                f"dynamodb:{_ITEM_ACTIONS[kind]}",
                stack.tables[item["TableName"]],
                _leading_key(item),
            )
            for entry in params["TransactItems"]
            for kind, item in entry.items()
        ]
    if call.action == "dynamodb:BatchGetItem":
        return [
            Request(
                call.action, stack.tables[table], _leading_key({"TableName": table, "Key": key})
            )
            for table, request in params["RequestItems"].items()
            for key in request["Keys"]
        ]
    if call.action == "dynamodb:BatchWriteItem":
        # IAM judges each put or delete of the batch, on its table, as dynamodb:BatchWriteItem.
        return [
            Request(
                call.action,
                stack.tables[table],
                _leading_key({"TableName": table, **request}),
            )
            for table, entries in params["RequestItems"].items()
            for entry in entries
            for request in entry.values()
        ]
    if call.service == "dynamodb":
        table = stack.tables[params["TableName"]]
        if "IndexName" in params:
            return [Request(call.action, f"{table}/index/{params['IndexName']}")]
        return [Request(call.action, table, _leading_key(params))]
    if call.action in ("s3:GetObject", "s3:PutObject"):
        assert params["Bucket"] == BUCKET_NAME, params
        # IAM judges a read of one version as s3:GetObjectVersion (and not s3:GetObject).
        action = "s3:GetObjectVersion" if params.get("VersionId") else call.action
        return [Request(action, f"{stack.bucket}/{params['Key']}")]
    if call.action == "events:PutEvents":
        return [
            Request(
                call.action,
                stack.bus if entry.get("EventBusName") == BUS_NAME else _arn("events", "other"),
                {"events:source": entry.get("Source", "")},
            )
            for entry in params["Entries"]
        ]
    lifecycle = topology.JOB_LIFECYCLE.construct_id
    if call.action == "states:StartExecution":
        assert params["stateMachineArn"].endswith(f":stateMachine:gpufleet-{lifecycle}")
        return [Request(call.action, stack.state_machine)]
    if call.action in ("states:SendTaskSuccess", "states:SendTaskHeartbeat"):
        # Task tokens come from the one workflow that waits on tasks.
        return [Request(call.action, stack.state_machine)]
    if call.action == "states:ListExecutions":
        assert params["stateMachineArn"].endswith(f":stateMachine:gpufleet-{lifecycle}")
        return [Request(call.action, stack.state_machine)]
    if call.action == "states:DescribeExecution":
        job_id = params["executionArn"].rsplit(":", 1)[-1]
        return [Request(call.action, execution_arn(stack.state_machine, job_id))]
    if call.action == "sns:Publish":
        assert params["TopicArn"] == f"arn:aws:sns:{REGION}:{ACCOUNT_ID}:gpufleet-alerts"
        return [
            Request(call.action, stack.topic),
            *(
                Request(action, stack.topic_key)
                for action in _PUBLISH_KEY_ACTIONS
                if stack.topic_key is not None
            ),
        ]
    if call.action == "ec2:TerminateInstances":
        return [Request(call.action, _arn("ec2", f"instance/{i}")) for i in params["InstanceIds"]]
    if call.action == "ec2:DeletePlacementGroup":
        return [Request(call.action, _arn("ec2", f"placement-group/{params['GroupName']}"))]
    if call.service == "ec2" and call.operation in (*_LAUNCH_OPERATIONS, "CreatePlacementGroup"):
        return _created_with_tags(call)
    if call.service == "ec2" and call.operation.startswith("Describe"):
        return [Request(call.action, "*")]  # EC2 has no resource-level permission for these
    if call.action in ("pricing:GetProducts", "cloudwatch:GetMetricData"):
        return [Request(call.action, "*")]  # nor have the Price List API and GetMetricData
    raise AssertionError(f"teach this test which resources IAM judges {call.action} on")


def _created_with_tags(call: ApiCall) -> list[Request]:
    """A create call with TagSpecifications: each action on each tagged resource, with the tags
    as `aws:RequestTag`, and CreateTags for those tags during the create action."""
    actions = _LAUNCH_ACTIONS.get(call.operation, (call.action,))
    found: list[Request] = []
    for spec in call.params.get("TagSpecifications", []):
        name = call.params.get("GroupName", "*")  # a placement group's name; a new id otherwise
        resource = _arn("ec2", f"{spec['ResourceType']}/{name}")
        tags = {f"aws:RequestTag/{t['Key']}": t["Value"] for t in spec["Tags"]}
        found += [Request(action, resource, tags) for action in actions]
        during = {**tags, "ec2:CreateAction": call.operation}
        found.append(Request("ec2:CreateTags", resource, during))
    if call.operation != "CreatePlacementGroup":
        # A launch also uses the template, subnets, image, volumes, network interfaces and
        # spot requests, passes the instance role to EC2 and, the first time in an account,
        # creates EC2's service-linked role.
        found += [Request(action, None) for action in actions]
        found += [Request(action, r) for r in _reservations(call.params) for action in actions]
        found.append(Request("iam:PassRole", None, {"iam:PassedToService": "ec2.amazonaws.com"}))
        found.append(
            Request(
                "iam:CreateServiceLinkedRole",
                None,
                {"iam:AWSServiceName": "ec2fleet.amazonaws.com"},
            )
        )
    return found


def _reservations(params: Mapping[str, Any]) -> list[str]:
    """The capacity reservations a launch may run in, on which EC2 authorizes it as well: the
    one the request targets (a Capacity Block, a targeted ODCR), or any open one that matches
    for an on-demand fleet that uses reservations first."""
    target = params.get("CapacityReservationSpecification", {}).get("CapacityReservationTarget")
    if target and "CapacityReservationId" in target:
        return [_arn("ec2", f"capacity-reservation/{target['CapacityReservationId']}")]
    options = params.get("OnDemandOptions", {}).get("CapacityReservationOptions", {})
    if options.get("UsageStrategy") == "use-capacity-reservations-first":
        return [_arn("ec2", "capacity-reservation/*")]
    return []


# -- the checks --------------------------------------------------------------------------------


def test_every_control_plane_call_was_made_by_a_function(calls: list[ApiCall]) -> None:
    """A call no handler made would be judged against no role."""
    assert calls
    assert [c for c in calls if c.function is None] == []


@pytest.mark.parametrize("function", FUNCTIONS)
def test_every_call_is_allowed_by_the_functions_role(
    function: str, calls_by_function: dict[str, list[ApiCall]], stack: Stack
) -> None:
    denied = sorted(
        {
            f"{request.action} on {request.resource} {dict(request.context)} ({call.action})"
            for call in calls_by_function.get(function, [])
            for request in requests(call, stack)
            if not any(grant.allows(request) for grant in stack.grants[function])
        }
    )
    assert denied == [], f"{function}'s role denies what its handler calls"


@pytest.mark.parametrize("function", FUNCTIONS)
def test_every_grant_was_used_in_the_demos(
    function: str, calls_by_function: dict[str, list[ApiCall]], stack: Stack
) -> None:
    made = [r for call in calls_by_function.get(function, []) for r in requests(call, stack)]
    checked = [
        grant
        for grant in stack.grants[function]
        if grant.action not in RUNTIME_ACTIONS and ":Describe" not in grant.action
    ]
    unused = {g.key for g in checked if not any(g.covers(request) for request in made)}
    not_reached = NOT_REACHED.get(function, {})
    assert set(not_reached) <= {g.key for g in checked}, "NOT_REACHED lists what is not granted"
    assert sorted(unused - set(not_reached)) == [], f"{function}'s role grants what it never used"
