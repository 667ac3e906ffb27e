"""One Lambda function per `gpufleet.topology.FUNCTIONS` entry, each with its own role.

Permissions are written per function in `PERMISSIONS`, from what its handler actually calls. A
topology function without an entry fails the synth: a new function never inherits someone
else's role by accident.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping

from aws_cdk import Annotations, ArnFormat, Duration, RemovalPolicy, Stack
from aws_cdk import aws_events as events
from aws_cdk import aws_iam as iam
from aws_cdk import aws_lambda as lambda_
from aws_cdk import aws_logs as logs
from aws_cdk import aws_s3 as s3
from aws_cdk import aws_s3_assets as s3_assets
from aws_cdk import aws_sqs as sqs
from aws_cdk import aws_ssm as ssm

from constructs import Construct
from gpufleet import topology
from gpufleet.domain.config import FleetConfig, config_to_env
from infra.config import GpuFleetConfig
from infra.constructs import nag
from infra.constructs.fleet import Fleet
from infra.constructs.intake import dead_letter_queue
from infra.constructs.job_store import JobStore
from infra.constructs.logs import retention
from infra.constructs.notifications import PUBLISH_KEY_ACTIONS, Notifications

RUNTIME = lambda_.Runtime.PYTHON_3_12
ARCHITECTURE = lambda_.Architecture.X86_64
# Powertools for AWS Lambda (Python) v3 publishes the ARN of its layer for each runtime and
# architecture in a public SSM parameter of every region it serves; `latest` follows releases.
POWERTOOLS_LAYER_PARAMETER = (
    f"/aws/service/powertools/python/{ARCHITECTURE.name}/{RUNTIME.name}/latest"
)

# CDK moves what a role's policy holds past 10,000 characters of its estimate into customer
# managed policies (OverflowPolicyN): more for the deployer to be allowed (iam:CreatePolicy,
# AttachRolePolicy...), and statements moved between policies by an update are missing for a
# moment (aws/aws-cdk#35611). It counts an ARN known only at deploy time as 150 characters; the
# ARNs these roles name resolve to at most ~120 (a table's index or a log group of this stack in
# aws-cn's longest region) and most to about 70 (Launch's 16 launch templates, images, subnets).
# Resolved so, the largest policy (Launch's, with a warm pool) is about 8,000 characters of
# IAM's 10,240 per role; with this estimate it stays inline.
ARN_SIZE_ESTIMATE = 120

MANAGED_TAG_CONDITION = {f"aws:RequestTag/{topology.TAG_MANAGED}": "true"}
MANAGED_RESOURCE_CONDITION = {f"aws:ResourceTag/{topology.TAG_MANAGED}": "true"}


class Permission(enum.Enum):
    IDEMPOTENCY = "remember deliveries in the idempotency table"
    PUBLISH = "put control-plane events on the gpufleet bus"
    START_WORKFLOW = "start the job lifecycle state machine"
    TASK_RESPONSE = "complete the lifecycle's waiting task (SendTaskSuccess)"
    TASK_HEARTBEAT = "tell the lifecycle's waiting task that the node is alive"
    INTAKE_OBJECTS = "read specs and write error reports under jobs/"
    WRITE_RUNS = "write run manifests under runs/"
    READ_NODE_KEYS = "read the node key of a run (runs/<job>/node-key) its reports are signed with"
    LAUNCH_FLEET = "CreateFleet from the launch template, tagged gpufleet:managed=true"
    TERMINATE = "terminate instances tagged gpufleet:managed=true"
    CAPACITY_MEMORY = "remember and read offerings that had no capacity"
    REMEMBER_WARNED_BLOCK = "note in the capacity memory a Capacity Block EC2 warned of (no read)"
    FIND_INSTANCES = "find which job an instance belongs to (ec2:DescribeInstances)"
    PLACEMENT_GROUPS = "delete the placement groups gpufleet created (tagged)"
    READ_METRICS = "read the running jobs' GPU metrics (cloudwatch:GetMetricData)"
    NOTIFY = "publish alerts to the stack's SNS topic"
    NOTIFY_TEAMS = "publish status changes to the teams' topics (gpufleet.yaml teams)"
    WARM_POOL = "read and write the warm pool's claims (the queue table's warm partition only)"
    CLAIM_WARM = "tag an idle warm-pool instance with the job that claimed it"
    READ_WORKFLOWS = "list the lifecycle's running executions and describe one (by its job)"
    READ_CATALOG = "read the refreshed catalog (its one key) before planning"
    REFRESH_CATALOG = "read the EC2 and Price List APIs' prices and write the refreshed catalog"


P = Permission
# What each handler calls (see gpufleet.services): the grants follow from it.
# tests/integration/test_least_privilege.py checks both ways against what the demos call.
PERMISSIONS: dict[str, frozenset[Permission]] = {
    topology.INTAKE_FROM_S3.construct_id: frozenset(
        {P.IDEMPOTENCY, P.PUBLISH, P.START_WORKFLOW, P.INTAKE_OBJECTS, P.READ_CATALOG}
    ),
    # A spec in an event has no object to read and its refusal goes in an event only.
    topology.INTAKE_FROM_EVENT.construct_id: frozenset(
        {P.IDEMPOTENCY, P.PUBLISH, P.START_WORKFLOW, P.READ_CATALOG}
    ),
    # Enqueue completes its own task when the job was cancelled meanwhile.
    topology.ENQUEUE.construct_id: frozenset({P.PUBLISH, P.TASK_RESPONSE}),
    # Dispatch admits (completing the waiting task), asks victims to checkpoint through their
    # control object under runs/, stops by force those that overstay the grace period, and
    # tells the operators of budgets reached.
    # It starts an array's child's workflow when it admits it (docs/arrays.md), planned then.
    topology.DISPATCH.construct_id: frozenset(
        {P.TASK_RESPONSE, P.START_WORKFLOW, P.WRITE_RUNS, P.TERMINATE, P.NOTIFY, P.READ_CATALOG}
    ),
    # A job requeued past its execution's budget continues in a new execution
    # (domain/history.py).
    topology.REQUEUE.construct_id: frozenset({P.PUBLISH, P.START_WORKFLOW, P.READ_CATALOG}),
    # Launch makes each run's node key (reading it first: a launch tried again keeps its run's).
    # Launch also terminates what a partial (all-or-nothing) launch left behind, and completes
    # its own task when the launch got no capacity (or the node finished before a retry).
    topology.LAUNCH.construct_id: frozenset(
        {
            P.PUBLISH,
            P.TASK_RESPONSE,
            P.WRITE_RUNS,
            P.READ_NODE_KEYS,
            P.LAUNCH_FLEET,
            P.TERMINATE,
            P.CAPACITY_MEMORY,
            P.READ_CATALOG,
        }
    ),
    # Reads the running jobs' metrics; an idle job is flagged (an event) and, per its policy,
    # asked to checkpoint (runs/); an elastic one is resized (its queue entry rewritten), a hot
    # or leaking one alerted (SNS).
    topology.METRIC_WATCH.construct_id: frozenset(
        {P.READ_METRICS, P.PUBLISH, P.WRITE_RUNS, P.NOTIFY, P.READ_CATALOG}
    ),
    # A report is heard only when signed with its run's key (domain/node_reports.py).
    topology.NODE_REPORT.construct_id: frozenset(
        {P.PUBLISH, P.TASK_RESPONSE, P.TASK_HEARTBEAT, P.READ_NODE_KEYS}
    ),
    topology.RELEASE.construct_id: frozenset(
        {P.TERMINATE, P.PUBLISH, P.PLACEMENT_GROUPS, P.READ_CATALOG}
    ),
    # The reconciler also ends a run whose instance went away unheard (completing its waiting
    # task) and a live job whose lifecycle ended (what WorkflowEnded does, below); it asks the
    # runs on a Capacity Block about to end to checkpoint (their control object under runs/).
    topology.RECONCILE.construct_id: frozenset(
        {
            P.TERMINATE,
            P.PLACEMENT_GROUPS,
            P.READ_WORKFLOWS,
            P.TASK_RESPONSE,
            P.PUBLISH,
            P.WRITE_RUNS,
        }
    ),
    # A Capacity Block's expiration warning: its runs' control objects (checkpoint) under runs/;
    # the block noted in the capacity memory, which Launch reads (no launch takes it again).
    topology.BLOCK_ENDING.construct_id: frozenset({P.WRITE_RUNS, P.REMEMBER_WARNED_BLOCK}),
    # Ends the job its lifecycle left: what Release does (instances, placement group,
    # the queue's entry and share, the final status and its event).
    topology.WORKFLOW_ENDED.construct_id: frozenset({P.TERMINATE, P.PUBLISH, P.PLACEMENT_GROUPS}),
    # Interruption warnings: ask the node to checkpoint (control object under runs/); an
    # instance that went away ends the run (completing the waiting task).
    topology.INSTANCE_EVENT.construct_id: frozenset(
        {P.TASK_RESPONSE, P.WRITE_RUNS, P.FIND_INSTANCES}
    ),
    # Reads the region's prices and specs and writes the catalog the planners read.
    topology.CATALOG_REFRESH.construct_id: frozenset({P.REFRESH_CATALOG}),
    # Tells each team of its jobs' status changes, from the event alone (no table read).
    topology.NOTIFY.construct_id: frozenset({P.NOTIFY_TEAMS}),
}
# The DynamoDB item operations each function makes, by table (Powertools' idempotency records
# apart). No function scans; only intake creates a job (a conditional put); a Query on the jobs
# table is on its indexes (a team's past runs when planning, jobs by status).
_PLANS = "Query"  # planning reads the team's past runs (and live jobs, with reservations)
# An array's children are stored in batches (BatchWriteItem) after a read of whether the array's
# record exists, and queued by writes that check each is still QUEUED; children that wait for a
# dependency are held on it, its record read (an array's: its children's statuses, in batches).
_ARRAYS = frozenset({"GetItem", "BatchWriteItem", "ConditionCheckItem", "BatchGetItem"})
JOBS_ACCESS: dict[str, frozenset[str]] = {
    topology.INTAKE_FROM_S3.construct_id: frozenset({"PutItem", _PLANS}) | _ARRAYS,
    topology.INTAKE_FROM_EVENT.construct_id: frozenset({"PutItem", _PLANS}) | _ARRAYS,
    # Enqueue's writes check that the job is still QUEUED; admitting a job as it arrives
    # totals the month's spend of teams with budgets, as a pass does; a job that waits for a
    # dependency is held on it, its record read (an array's: its children's statuses).
    topology.ENQUEUE.construct_id: frozenset(
        {"ConditionCheckItem", "Query", "GetItem", "BatchGetItem"}
    ),
    # Team budgets total the month's jobs of each team; a dependency on an array reads its
    # children's statuses in batches (BatchGetItem).
    topology.DISPATCH.construct_id: frozenset({"GetItem", "UpdateItem", "Query", "BatchGetItem"}),
    topology.REQUEUE.construct_id: frozenset({"GetItem", "UpdateItem", _PLANS}),
    topology.LAUNCH.construct_id: frozenset({"GetItem", "UpdateItem", _PLANS}),
    # Lists the running jobs and records their alarms' state; an elastic resize is judged by
    # planning the new shape, as `gpufleet resize` is.
    topology.METRIC_WATCH.construct_id: frozenset(
        {"GetItem", "UpdateItem", "ConditionCheckItem", _PLANS}
    ),
    topology.NODE_REPORT.construct_id: frozenset({"GetItem", "UpdateItem"}),
    # A stage's run on the previous stage's instances is planned here.
    topology.RELEASE.construct_id: frozenset({"GetItem", "UpdateItem", _PLANS}),
    # Reads the live jobs by status; ends runs and jobs as WorkflowEnded does.
    topology.RECONCILE.construct_id: frozenset({"GetItem", "UpdateItem", "Query"}),
    topology.WORKFLOW_ENDED.construct_id: frozenset({"GetItem", "UpdateItem"}),
    topology.INSTANCE_EVENT.construct_id: frozenset({"GetItem", "UpdateItem"}),
    # The launching and running jobs (by status), each on the warned block drained.
    topology.BLOCK_ENDING.construct_id: frozenset({"GetItem", "UpdateItem", "Query"}),
}
_ENDS_JOBS = frozenset({"GetItem", "Query", "UpdateItem", "DeleteItem"})
# Intake queues an array's children as Enqueue queues a job (with no workflow: admission
# starts it): the entry, its locator and counts in one transaction.
_QUEUES_CHILDREN = frozenset({"PutItem", "UpdateItem", "ConditionCheckItem"})
QUEUE_ACCESS: dict[str, frozenset[str]] = {
    topology.INTAKE_FROM_S3.construct_id: _QUEUES_CHILDREN,
    topology.INTAKE_FROM_EVENT.construct_id: _QUEUES_CHILDREN,
    # Reads the state; admits a job as it arrives (a transaction of Put and Updates), or puts
    # the entry and its class's count in one transaction, if the job was not admitted.
    topology.ENQUEUE.construct_id: frozenset(
        {"Query", "PutItem", "UpdateItem", "ConditionCheckItem"}
    ),
    # Reads the state and the streams; admits (a transaction of Deletes, Put and Updates);
    # marks victims draining and nominates their preemptor (if it still waits: a condition
    # check); frees the share of a job that ended; notes a notice once.
    topology.DISPATCH.construct_id: frozenset(
        {"GetItem", "Query", "PutItem", "UpdateItem", "DeleteItem", "ConditionCheckItem"}
    ),
    # A resized job waiting in the queue is found (its locator, its entry), taken out and
    # enqueued again.
    topology.METRIC_WATCH.construct_id: frozenset(
        {"GetItem", "PutItem", "UpdateItem", "DeleteItem", "ConditionCheckItem"}
    ),
    # Frees the job's share: its running entry, then a transaction of Delete and Updates,
    # which checks the holds the job's end may settle (ConditionCheck: is a job held on it).
    topology.RELEASE.construct_id: frozenset(
        {"GetItem", "UpdateItem", "DeleteItem", "ConditionCheckItem"}
    ),
    # As Release, and ends a waiting job's wait: its entry found (Query), then deleted with its
    # class's count in one transaction.
    topology.WORKFLOW_ENDED.construct_id: _ENDS_JOBS,
    topology.RECONCILE.construct_id: _ENDS_JOBS,
}
# Launch notes the launch's cost on the job's running entry, in the queue's state partition;
# intake reads the bookings there for a job larger than its team's quota can hold.
QUEUE_STATE_ACCESS: dict[str, frozenset[str]] = {
    topology.LAUNCH.construct_id: frozenset({"UpdateItem"}),
    topology.INTAKE_FROM_S3.construct_id: frozenset({"Query"}),
    topology.INTAKE_FROM_EVENT.construct_id: frozenset({"Query"}),
    # A drained run's running entry is marked draining (the dispatcher enforces its grace).
    topology.BLOCK_ENDING.construct_id: frozenset({"UpdateItem"}),
}
# The capacity memory's actions, by permission (they share one statement).
_CAPACITY_ACTIONS = {
    P.CAPACITY_MEMORY: ("dynamodb:Query", "dynamodb:PutItem"),
    P.REMEMBER_WARNED_BLOCK: ("dynamodb:PutItem",),
}
# Permissions that are one action each, in a statement they share with others.
_ACTION_OF = {
    P.TASK_RESPONSE: "states:SendTaskSuccess",
    P.TASK_HEARTBEAT: "states:SendTaskHeartbeat",
}


def _actions_for(grants: frozenset[Permission], *permissions: Permission) -> list[str]:
    return [_ACTION_OF[permission] for permission in permissions if permission in grants]


# Only when the config has a warm pool: Launch claims its instances, Reconcile launches them.
WARM_POOL_PERMISSIONS: dict[str, frozenset[Permission]] = {
    topology.LAUNCH.construct_id: frozenset({P.WARM_POOL, P.CLAIM_WARM}),
    topology.RECONCILE.construct_id: frozenset({P.WARM_POOL, P.LAUNCH_FLEET}),
}
# The functions that start workflows.
STARTS_WORKFLOW = tuple(cid for cid, grants in PERMISSIONS.items() if P.START_WORKFLOW in grants)


def powertools_layer(scope: Construct, config: GpuFleetConfig) -> lambda_.ILayerVersion:
    """The layer of `powertools_layer_arn` if given, else the one the public parameter names
    when the stack is deployed (a CloudFormation parameter: synth stays offline)."""
    arn = config.powertools_layer_arn or ssm.StringParameter.value_for_string_parameter(
        scope, POWERTOOLS_LAYER_PARAMETER
    )
    return lambda_.LayerVersion.from_layer_version_arn(scope, "PowertoolsLayer", arn)


class Functions(Construct):
    def __init__(
        self,
        scope: Construct,
        construct_id: str,
        *,
        config: GpuFleetConfig,
        fleet_config: FleetConfig,
        code: s3_assets.Asset,
        job_store: JobStore,
        bus: events.IEventBus,
        bucket: s3.IBucket,
        fleet: Fleet,
        alerts: Notifications,
    ) -> None:
        super().__init__(scope, construct_id)
        self.node.set_context("@aws-cdk/aws-iam.arnSizeEstimate", ARN_SIZE_ESTIMATE)
        missing = {f.construct_id for f in topology.FUNCTIONS} - set(PERMISSIONS)
        if missing:
            raise ValueError(f"no PERMISSIONS written for functions {sorted(missing)}")
        stack = Stack.of(self)
        self._stack = stack
        self._job_store = job_store
        self._bus = bus
        self._bucket = bucket
        self._fleet = fleet
        self._alerts = alerts

        layer = powertools_layer(self, config)
        # The same zip the node agent downloads: one upload, one version of the package.
        function_code = lambda_.Code.from_bucket(code.bucket, code.s3_object_key)
        Annotations.of(code).acknowledge_warning(
            "@aws-cdk/aws-lambda:codeFromBucketObjectVersionNotSpecified",
            "The key is the asset's content hash: changed code is a new key, so the functions "
            "are updated without an object version.",
        )
        self.environment: dict[str, str] = {
            **job_store.environment(),
            topology.ENV_EVENT_BUS: bus.event_bus_name,
            topology.ENV_INTAKE_BUCKET: bucket.bucket_name,
            "POWERTOOLS_SERVICE_NAME": "gpufleet",
            "POWERTOOLS_METRICS_NAMESPACE": "GpuFleet",
            "LOG_LEVEL": config.log_level.upper(),
            topology.ENV_CONFIG: config_to_env(fleet_config),
            topology.ENV_LAUNCH_TEMPLATES: fleet.launch_templates_value(),
        }
        launch_environment = {
            topology.ENV_SUBNETS: ",".join(fleet.subnet_ids),
            topology.ENV_ROOT_VOLUME: str(config.root_volume_gib),
        }

        self.functions: dict[str, lambda_.Function] = {}
        self.roles: dict[str, iam.Role] = {}
        self.dead_letter_queues: dict[str, sqs.Queue] = {}
        for spec in topology.FUNCTIONS:
            cid = spec.construct_id
            role = iam.Role(
                self,
                f"{cid}Role",
                assumed_by=iam.ServicePrincipal("lambda.amazonaws.com"),
                description=f"gpufleet {cid}: {spec.description}",
            )
            log_group = logs.LogGroup(
                self,
                f"{cid}Logs",
                retention=retention(config.log_retention_days),
                removal_policy=RemovalPolicy.RETAIN,
            )
            dlq = dead_letter_queue(self, f"{cid}DeadLetters")
            environment = dict(self.environment)
            environment.update(
                {
                    name: value
                    for name, value in launch_environment.items()
                    if name in topology.EXTRA_ENV.get(cid, ())
                }
            )
            if topology.ENV_NOTIFY_TOPIC in topology.EXTRA_ENV.get(cid, ()):
                environment[topology.ENV_NOTIFY_TOPIC] = alerts.topic.topic_arn
            if topology.ENV_TEAM_TOPICS in topology.EXTRA_ENV.get(cid, ()):
                environment[topology.ENV_TEAM_TOPICS] = alerts.team_topics_value()
            if topology.ENV_ACCOUNT in topology.EXTRA_ENV.get(cid, ()):
                environment[topology.ENV_ACCOUNT] = stack.account
            if topology.ENV_CHECKPOINT_URI in topology.EXTRA_ENV.get(cid, ()):
                environment[topology.ENV_CHECKPOINT_URI] = config.checkpoint_uri
            function = lambda_.Function(
                self,
                cid,
                description=spec.description,
                runtime=RUNTIME,
                architecture=ARCHITECTURE,
                handler=spec.handler,
                code=function_code,
                layers=[layer],
                timeout=Duration.seconds(spec.timeout_seconds),
                memory_size=spec.memory_mb,
                environment=environment,
                tracing=lambda_.Tracing.ACTIVE,
                log_group=log_group,
                dead_letter_queue=dlq,
                role=role,
            )
            log_group.grant_write(role)
            self.functions[cid] = function
            self.roles[cid] = role
            self.dead_letter_queues[cid] = dlq
            grants = PERMISSIONS[cid]
            if fleet_config.warm_pool is not None:
                grants |= WARM_POOL_PERMISSIONS.get(cid, frozenset())
            self._grant_tables(role, cid)
            self._grant(role, grants)
            nag.acknowledge(
                function,
                "AwsSolutions-L1",
                "Pinned to python3.12 on purpose: the public Powertools layer referenced here is "
                f"the one built for it ({POWERTOOLS_LAYER_PARAMETER}).",
            )

    # -- wiring that needs the state machine ---------------------------------------------------
    def connect_workflow(self, arn: str, executions: str) -> None:
        """`arn` is the state machine's ARN built from its name (see workflow.state_machine_arn),
        so that the policies and the functions' environment do not depend on the state machine
        resource (it names Requeue's function, which starts executions: a cycle); `executions`
        the ARN pattern of its executions."""
        for spec in topology.FUNCTIONS:
            if topology.ENV_STATE_MACHINE in topology.EXTRA_ENV.get(spec.construct_id, ()):
                self.functions[spec.construct_id].add_environment(topology.ENV_STATE_MACHINE, arn)
        for cid in STARTS_WORKFLOW:
            self.roles[cid].add_to_policy(
                iam.PolicyStatement(
                    sid="StartLifecycle",
                    actions=["states:StartExecution"],
                    resources=[arn],
                )
            )
        for cid, grants in PERMISSIONS.items():
            actions = _actions_for(grants, P.TASK_RESPONSE, P.TASK_HEARTBEAT)
            if actions:
                statement = iam.PolicyStatement(
                    sid="CompleteLifecycleTask", actions=actions, resources=[arn]
                )
                self.roles[cid].add_to_policy(statement)
            if P.READ_WORKFLOWS in grants:
                role = self.roles[cid]
                role.add_to_policy(
                    iam.PolicyStatement(
                        sid="ListLifecycles", actions=["states:ListExecutions"], resources=[arn]
                    )
                )
                role.add_to_policy(
                    iam.PolicyStatement(
                        sid="DescribeLifecycles",
                        actions=["states:DescribeExecution"],
                        resources=[executions],
                    )
                )
                policy = role.node.try_find_child("DefaultPolicy")
                assert policy is not None
                nag.acknowledge_all(
                    policy,
                    nag.wildcard_resources(
                        "arn:<AWS::Partition>:states:<AWS::Region>:<AWS::AccountId>:execution:"
                        f"{self._stack.stack_name}-{topology.JOB_LIFECYCLE.construct_id}:*"
                    ),
                    "Executions are named after their job, known only at run time: the grant "
                    "is limited to the executions of the lifecycle state machine.",
                )

    # -- per-permission statements -------------------------------------------------------------
    def _grant_tables(self, role: iam.Role, cid: str) -> None:
        jobs, queue = topology.JOBS_TABLE.construct_id, topology.QUEUE_TABLE.construct_id
        for sid, table, access, partitions in (
            ("Jobs", jobs, JOBS_ACCESS, ()),
            ("AdmissionQueue", queue, QUEUE_ACCESS, ()),
            ("QueueState", queue, QUEUE_STATE_ACCESS, (topology.QUEUE_STATE_PARTITION,)),
        ):
            if cid in access:
                statement = self._job_store.items_statement(sid, table, access[cid], partitions)
                role.add_to_policy(statement)

    def _grant(self, role: iam.Role, grants: frozenset[Permission]) -> None:
        star_reasons: list[str] = ["X-Ray tracing (xray:PutTraceSegments/PutTelemetryRecords)"]
        wildcards: list[str] = []
        capacity_actions = sorted(
            {a for p, actions in _CAPACITY_ACTIONS.items() if p in grants for a in actions}
        )
        if capacity_actions:
            role.add_to_policy(
                iam.PolicyStatement(
                    sid="CapacityMemory",
                    actions=capacity_actions,
                    resources=[
                        self._job_store.tables[topology.CAPACITY_TABLE.construct_id].table_arn
                    ],
                )
            )
        if P.IDEMPOTENCY in grants:
            role.add_to_policy(
                self._job_store.idempotency_statement(topology.IDEMPOTENCY_TABLE.construct_id)
            )
        if P.PUBLISH in grants:
            role.add_to_policy(
                iam.PolicyStatement(
                    sid="PublishControlPlaneEvents",
                    actions=["events:PutEvents"],
                    resources=[self._bus.event_bus_arn],
                    conditions={"StringEquals": {"events:source": topology.CONTROL_PLANE_SOURCE}},
                )
            )
        if P.INTAKE_OBJECTS in grants:
            objects = self._bucket.arn_for_objects(f"{topology.INTAKE_PREFIX}*")
            role.add_to_policy(
                iam.PolicyStatement(
                    sid="IntakeObjects",
                    # Intake reads the version its notification names (the bucket is
                    # versioned): GetObject with a VersionId is judged as GetObjectVersion.
                    actions=["s3:GetObjectVersion", "s3:PutObject"],
                    resources=[objects],
                )
            )
            wildcards.append(f"{nag.arn_of(self._bucket)}/{topology.INTAKE_PREFIX}*")
        if P.WRITE_RUNS in grants:
            role.add_to_policy(
                iam.PolicyStatement(
                    sid="WriteRunManifests",
                    actions=["s3:PutObject"],
                    resources=[self._bucket.arn_for_objects(f"{topology.RUNS_PREFIX}*")],
                )
            )
            wildcards.append(f"{nag.arn_of(self._bucket)}/{topology.RUNS_PREFIX}*")
        if P.READ_NODE_KEYS in grants:
            role.add_to_policy(
                iam.PolicyStatement(
                    sid="ReadNodeKeys",
                    actions=["s3:GetObject"],
                    resources=[
                        self._bucket.arn_for_objects(
                            f"{topology.RUNS_PREFIX}*/{topology.NODE_KEY_NAME}"
                        )
                    ],
                )
            )
            wildcards.append(
                f"{nag.arn_of(self._bucket)}/{topology.RUNS_PREFIX}*/{topology.NODE_KEY_NAME}"
            )
        if P.READ_CATALOG in grants:
            role.add_to_policy(
                iam.PolicyStatement(
                    sid="ReadRefreshedCatalog",
                    actions=["s3:GetObject"],
                    resources=[self._bucket.arn_for_objects(topology.CATALOG_KEY)],
                )
            )
        if P.REFRESH_CATALOG in grants:
            role.add_to_policy(
                iam.PolicyStatement(
                    sid="WriteRefreshedCatalog",
                    actions=["s3:PutObject"],
                    resources=[self._bucket.arn_for_objects(topology.CATALOG_KEY)],
                )
            )
            role.add_to_policy(
                iam.PolicyStatement(
                    sid="ReadPrices",
                    actions=[
                        "pricing:GetProducts",
                        "ec2:DescribeInstanceTypes",
                        "ec2:DescribeAvailabilityZones",
                        "ec2:DescribeSpotPriceHistory",
                    ],
                    resources=["*"],
                )
            )
            star_reasons.append(
                "pricing:GetProducts, ec2:DescribeInstanceTypes, DescribeAvailabilityZones and "
                "DescribeSpotPriceHistory (no resource-level permissions)"
            )
        if P.LAUNCH_FLEET in grants:
            wildcards += self._grant_launch(role)
            star_reasons.append("ec2:Describe* (no resource-level permissions)")
        if P.TERMINATE in grants:
            role.add_to_policy(self._terminate_statement())
            wildcards.append(self._nag_arn("instance", "*"))
            if P.LAUNCH_FLEET not in grants and P.FIND_INSTANCES not in grants:
                role.add_to_policy(
                    iam.PolicyStatement(
                        sid="FindInstances",
                        actions=["ec2:DescribeInstances"],
                        resources=["*"],
                    )
                )
                star_reasons.append("ec2:DescribeInstances (no resource-level permissions)")

        if P.WARM_POOL in grants:
            role.add_to_policy(
                iam.PolicyStatement(
                    sid="WarmPoolClaims",
                    actions=[
                        "dynamodb:GetItem",
                        "dynamodb:Query",
                        "dynamodb:PutItem",
                        "dynamodb:DeleteItem",
                    ],
                    resources=[self._job_store.tables[topology.QUEUE_TABLE.construct_id].table_arn],
                    conditions={
                        "ForAllValues:StringEquals": {
                            "dynamodb:LeadingKeys": [topology.WARM_POOL_PARTITION]
                        }
                    },
                )
            )
        if P.CLAIM_WARM in grants:
            role.add_to_policy(
                iam.PolicyStatement(
                    sid="ClaimWarmInstances",
                    actions=["ec2:CreateTags"],
                    resources=[self._ec2_arn("instance", "*")],
                    conditions={
                        "StringEquals": {
                            **MANAGED_RESOURCE_CONDITION,
                            f"aws:ResourceTag/{topology.TAG_WARM}": [
                                topology.WARM_IDLE,
                                topology.WARM_CLAIMED,
                            ],
                            f"aws:RequestTag/{topology.TAG_WARM}": topology.WARM_CLAIMED,
                        },
                        "ForAllValues:StringEquals": {
                            "aws:TagKeys": [topology.TAG_JOB_ID, topology.TAG_WARM]
                        },
                    },
                )
            )
            wildcards.append(self._nag_arn("instance", "*"))
        if P.NOTIFY in grants:
            role.add_to_policy(
                iam.PolicyStatement(
                    sid="PublishAlerts",
                    actions=["sns:Publish"],
                    resources=[self._alerts.topic.topic_arn],
                )
            )
            # SNS encrypts what the function publishes with the function's own permissions.
            role.add_to_policy(
                iam.PolicyStatement(
                    sid="EncryptAlerts",
                    actions=list(PUBLISH_KEY_ACTIONS),
                    resources=[self._alerts.key.key_arn],
                )
            )
        if P.NOTIFY_TEAMS in grants and self._alerts.notify_topic_arns:
            role.add_to_policy(
                iam.PolicyStatement(
                    sid="PublishToTeams",
                    actions=["sns:Publish"],
                    resources=list(self._alerts.notify_topic_arns),
                )
            )
            if self._alerts.team_topics:
                role.add_to_policy(
                    iam.PolicyStatement(
                        sid="EncryptTeamNotifications",
                        actions=list(PUBLISH_KEY_ACTIONS),
                        resources=[self._alerts.key.key_arn],
                    )
                )
        if P.READ_METRICS in grants:
            role.add_to_policy(
                iam.PolicyStatement(
                    sid="ReadJobMetrics",
                    actions=["cloudwatch:GetMetricData"],
                    resources=["*"],
                )
            )
            star_reasons.append("cloudwatch:GetMetricData (no resource-level permissions)")
        if P.PLACEMENT_GROUPS in grants:
            role.add_to_policy(
                iam.PolicyStatement(
                    sid="DeleteManagedPlacementGroups",
                    actions=["ec2:DeletePlacementGroup"],
                    resources=[self._ec2_arn("placement-group", "*")],
                    conditions={"StringEquals": MANAGED_RESOURCE_CONDITION},
                )
            )
            role.add_to_policy(
                iam.PolicyStatement(
                    sid="FindPlacementGroups",
                    actions=["ec2:DescribePlacementGroups"],
                    resources=["*"],
                )
            )
            wildcards.append(self._nag_arn("placement-group", "*"))
            star_reasons.append("ec2:DescribePlacementGroups (no resource-level permissions)")
        if P.FIND_INSTANCES in grants and P.LAUNCH_FLEET not in grants:
            role.add_to_policy(
                iam.PolicyStatement(
                    sid="FindInstances", actions=["ec2:DescribeInstances"], resources=["*"]
                )
            )
            star_reasons.append("ec2:DescribeInstances (no resource-level permissions)")

        policy = role.node.try_find_child("DefaultPolicy")
        assert policy is not None
        nag.acknowledge_all(
            policy,
            nag.wildcard_resources("*"),
            "Resource * only where AWS offers no resource-level permission: "
            + "; ".join(star_reasons)
            + ".",
        )
        if wildcards:
            nag.acknowledge_all(
                policy,
                nag.wildcard_resources(*sorted(set(wildcards))),
                "Object keys and instance/volume/fleet/reservation ids are only known at run "
                "time: the grants are limited to this bucket's prefix or this account and "
                "region (reservations: this region, as they may be shared from another "
                "account), and EC2 creates or terminates only resources tagged "
                "gpufleet:managed=true.",
            )
        if P.LAUNCH_FLEET in grants:
            nag.acknowledge_all(
                policy,
                nag.wildcard_actions("ec2:Describe*"),
                "Read-only EC2 describe calls (subnets, instance types, offerings, fleets) "
                "support no resource-level permissions and reveal no data.",
            )

    def _ec2_arn(self, resource: str, name: str) -> str:
        arn: str = self._stack.format_arn(
            service="ec2",
            resource=resource,
            resource_name=name,
            arn_format=ArnFormat.SLASH_RESOURCE_NAME,
        )
        return arn

    @staticmethod
    def _nag_arn(resource: str, name: str) -> str:
        return f"arn:<AWS::Partition>:ec2:<AWS::Region>:<AWS::AccountId>:{resource}/{name}"

    def _terminate_statement(self) -> iam.PolicyStatement:
        return iam.PolicyStatement(
            sid="TerminateManagedInstances",
            actions=["ec2:TerminateInstances"],
            resources=[self._ec2_arn("instance", "*")],
            conditions={"StringEquals": MANAGED_RESOURCE_CONDITION},
        )

    def _grant_launch(self, role: iam.Role) -> list[str]:
        """CreateFleet (type instant) from the launch template; returns wildcard ARNs for nag.

        The instance and the fleet must carry gpufleet:managed=true in the request (the Launch
        handler tags both in CreateFleet's TagSpecifications). Volumes, network interfaces and
        spot requests only exist as parts of such an instance; the launch template tags the
        volumes and interfaces (never the spot requests: see `topology.TAGGED_AT_LAUNCH`), and
        CreateTags is only allowed during the launch itself, on what it really tags.
        """
        fleet = self._fleet
        role.add_to_policy(
            iam.PolicyStatement(
                sid="LaunchFromTemplate",
                actions=["ec2:CreateFleet", "ec2:RunInstances"],
                resources=fleet.existing_resource_arns(),
            )
        )
        role.add_to_policy(
            iam.PolicyStatement(
                sid="LaunchTaggedInstances",
                actions=["ec2:CreateFleet", "ec2:RunInstances"],
                resources=[self._ec2_arn("instance", "*"), self._ec2_arn("fleet", "*")],
                conditions={"StringEquals": MANAGED_TAG_CONDITION},
            )
        )
        parts = ("volume", "network-interface", "spot-instances-request", "placement-group")
        role.add_to_policy(
            iam.PolicyStatement(
                sid="LaunchInstanceParts",
                actions=["ec2:CreateFleet", "ec2:RunInstances"],
                resources=[self._ec2_arn(kind, "*") for kind in parts],
            )
        )
        # A Capacity Block or a targeted ODCR is named in the request, and an on-demand launch
        # that uses reservations first lands in any open one that matches: EC2 authorizes the
        # launch on the reservation too. A reservation shared with this account (AWS RAM)
        # belongs to another account, hence any account, this region.
        role.add_to_policy(
            iam.PolicyStatement(
                sid="LaunchIntoReservations",
                actions=["ec2:CreateFleet", "ec2:RunInstances"],
                resources=[
                    self._stack.format_arn(
                        service="ec2",
                        account="*",
                        resource="capacity-reservation",
                        resource_name="*",
                        arn_format=ArnFormat.SLASH_RESOURCE_NAME,
                    )
                ],
            )
        )
        # Tagged as created: the fleet and its instances by CreateFleet's TagSpecifications, the
        # instances' parts by the launch template, the job's group by CreatePlacementGroup.
        tagged = ("fleet", *topology.TAGGED_AT_LAUNCH, "placement-group")
        role.add_to_policy(
            iam.PolicyStatement(
                sid="TagAtLaunchOnly",
                actions=["ec2:CreateTags"],
                resources=[self._ec2_arn(kind, "*") for kind in tagged],
                conditions={
                    "StringEquals": {
                        **MANAGED_TAG_CONDITION,
                        "ec2:CreateAction": ["CreateFleet", "RunInstances", "CreatePlacementGroup"],
                    }
                },
            )
        )
        role.add_to_policy(
            iam.PolicyStatement(
                sid="CreateTaggedPlacementGroups",
                actions=["ec2:CreatePlacementGroup"],
                resources=[self._ec2_arn("placement-group", "*")],
                conditions={"StringEquals": MANAGED_TAG_CONDITION},
            )
        )
        role.add_to_policy(
            iam.PolicyStatement(
                sid="PassInstanceRole",
                actions=["iam:PassRole"],
                resources=[fleet.instance_role.role_arn],
                conditions={"StringEquals": {"iam:PassedToService": "ec2.amazonaws.com"}},
            )
        )
        role.add_to_policy(
            iam.PolicyStatement(
                sid="DescribeEc2",
                actions=["ec2:Describe*"],
                resources=["*"],
            )
        )
        # First spot launch in an account creates EC2's service-linked roles; nothing else.
        service_roles = {
            "spot.amazonaws.com": "AWSServiceRoleForEC2Spot",
            "ec2fleet.amazonaws.com": "AWSServiceRoleForEC2Fleet",
        }
        role.add_to_policy(
            iam.PolicyStatement(
                sid="Ec2ServiceLinkedRoles",
                actions=["iam:CreateServiceLinkedRole"],
                resources=[
                    self._stack.format_arn(
                        service="iam",
                        region="",
                        resource="role",
                        resource_name=f"aws-service-role/{service}/{name}",
                        arn_format=ArnFormat.SLASH_RESOURCE_NAME,
                    )
                    for service, name in service_roles.items()
                ],
                conditions={"StringEquals": {"iam:AWSServiceName": list(service_roles)}},
            )
        )
        reservations = "arn:<AWS::Partition>:ec2:<AWS::Region>:*:capacity-reservation/*"
        return [
            *(self._nag_arn(kind, "*") for kind in dict.fromkeys((*tagged, *parts))),
            reservations,
        ]

    def by_id(self) -> Mapping[str, lambda_.IFunction]:
        return dict(self.functions)
