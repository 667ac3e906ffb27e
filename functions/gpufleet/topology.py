"""The shape of a gpufleet deployment: tables, functions, rules and workflows.

This is the one description both runtimes build from: the CDK stack (`infra/`) turns it into
CloudFormation, and the embedded AWS account (`gpufleet.emulator`) creates the same resources in
moto. A test compares the synthesized template with the emulator's live resources, so the two
cannot drift.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

STATEMACHINE_DIR = Path(__file__).resolve().parents[2] / "statemachines"

# Sources and detail types of the events gpufleet reads and writes on its own bus.
# Submissions come from one source per team, `gpufleet.team.<team>` (domain/submitters.py).
SUBMIT_SOURCE_PREFIX = "gpufleet.team."
CONTROL_PLANE_SOURCE = "gpufleet.control-plane"
AGENT_SOURCE = "gpufleet.agent"
DETAIL_JOB_SUBMITTED = "Job Submitted"
DETAIL_JOB_REJECTED = "Job Rejected"
DETAIL_JOB_STATUS_CHANGED = "Job Status Changed"
# The statuses a job ends in, as its `Job Status Changed` event names them.
JOB_ENDED_STATUSES = ("SUCCEEDED", "FAILED", "CANCELLED")
# In a job's end's `Job Status Changed`: the end's write asked whether jobs are held on it, and
# a pass is woken if so (`Capacity Freed`), so the end need not wake one (`DependencyRule`).
HOLDS_ASKED = "holds_asked"
DETAIL_JOB_QUEUED = "Job Queued"
DETAIL_CAPACITY_FREED = "Capacity Freed"
DETAIL_JOB_FLAGGED = "Job Flagged"
DETAIL_JOB_SCALED = "Job Scaled"  # an elastic job changed its number of nodes
DETAIL_NODE_STARTED = "Node Started"
DETAIL_NODE_HEARTBEAT = "Node Heartbeat"
DETAIL_NODE_FINISHED = "Node Finished"
# AWS's own events (default bus): EC2's, and Step Functions' when an execution changes status.
DETAIL_EXECUTION_STATUS_CHANGE = "Step Functions Execution Status Change"
# The statuses of an execution that ended without succeeding.
EXECUTION_ENDS_UNSETTLED = ("FAILED", "TIMED_OUT", "ABORTED")
DETAIL_SPOT_WARNING = "EC2 Spot Instance Interruption Warning"
DETAIL_REBALANCE = "EC2 Instance Rebalance Recommendation"
DETAIL_STATE_CHANGE = "EC2 Instance State-change Notification"
# Forty minutes before a Capacity Block ends (EC2 User Guide, "Monitor Capacity Blocks using
# EventBridge"). The guide spells its detail-type both ways; the rule matches either.
DETAIL_BLOCK_EXPIRATION_WARNING = "Capacity Block Reservation Expiration Warning"
DETAIL_BLOCK_EXPIRATION_WARNING_SHORT = "Capacity Block Expiration Warning"

# Tags every instance gpufleet launches carries; IAM conditions and the reconciler key on them.
TAG_MANAGED = "gpufleet:managed"
TAG_JOB_ID = "gpufleet:job-id"
# What the launch templates tag at launch (with TAG_MANAGED). EC2 fails a launch whose template
# tags a resource the launch does not create: `spot-instances-request` would fail every launch
# that makes no Spot request (on-demand, reservations), so spot requests are not tagged.
TAGGED_AT_LAUNCH = ("instance", "volume", "network-interface")


@dataclass(frozen=True)
class BootImage:
    """The image a boot target's launch templates start from: a public SSM parameter (resolved
    at deploy), and the image's root device (the template sizes the root volume by its name)."""

    target: str  # gpufleet.domain.boot.BootTarget name: ARCH-FAMILY
    ssm_parameter: str
    root_device: str


# The stack's images by default, one per boot target (docs/deploy.md: `-c ami_<target>=...`
# overrides one, `none` builds no template for it). The NVIDIA ones are the Deep Learning Base
# OSS Nvidia Driver GPU AMIs (DLAMI release notes, "SSM parameter"), the Neuron one the Neuron
# multi-framework DLAMI (Neuron DLAMI User Guide, "SSM parameters"), the CPU-only ones Amazon
# Linux 2023 (EC2 User Guide, "public parameters"; the boot script installs Docker on it).
BOOT_IMAGES: tuple[BootImage, ...] = (
    BootImage(
        "x86_64-nvidia",
        "/aws/service/deeplearning/ami/x86_64/base-oss-nvidia-driver-gpu-ubuntu-22.04/latest/ami-id",
        "/dev/sda1",
    ),
    BootImage(
        "arm64-nvidia",
        "/aws/service/deeplearning/ami/arm64/base-oss-nvidia-driver-gpu-ubuntu-22.04/latest/ami-id",
        "/dev/sda1",
    ),
    BootImage(
        "x86_64-neuron",
        "/aws/service/neuron/dlami/multi-framework/ubuntu-22.04/latest/image_id",
        "/dev/sda1",
    ),
    BootImage(
        "x86_64-cpu",
        "/aws/service/ami-amazon-linux-latest/al2023-ami-kernel-default-x86_64",
        "/dev/xvda",
    ),
    BootImage(
        "arm64-cpu",
        "/aws/service/ami-amazon-linux-latest/al2023-ami-kernel-default-arm64",
        "/dev/xvda",
    ),
)


def pairs_value(pairs: dict[str, str]) -> str:
    """A variable's value for {key: value}: `KEY=VALUE,KEY=VALUE`, sorted by key."""
    return ",".join(f"{key}={pairs[key]}" for key in sorted(pairs))


def parse_pairs(variable: str, value: str) -> dict[str, str]:
    pairs = [item.partition("=") for item in value.split(",") if item]
    if any(not key or not named for key, _, named in pairs):
        raise ValueError(f"{variable} must be KEY=VALUE,KEY=VALUE, not {value!r}")
    return {key: named for key, _, named in pairs}


def launch_templates_value(templates: dict[str, str]) -> str:
    """ENV_LAUNCH_TEMPLATES's value for {template key: launch template id}."""
    return pairs_value(templates)


def parse_launch_templates(value: str) -> dict[str, str]:
    return parse_pairs(ENV_LAUNCH_TEMPLATES, value)


# Warm-pool instances: "true" while idle, "claimed" once a launch took one (it then has a job).
TAG_WARM = "gpufleet:warm"
WARM_IDLE = "true"
WARM_CLAIMED = "claimed"
# The warm pool's claims live in the queue table under this partition key.
WARM_POOL_PARTITION = "warm"

# What node agents publish per job (namespace, metric, dimension), which MetricWatch reads.
METRICS_NAMESPACE = "GpuFleet/Jobs"
GPU_UTILIZATION_METRIC = "GpuUtilization"
GPU_TEMPERATURE_METRIC = "GpuTemperature"
# The CloudWatch agent samples the GPUs once a minute: a shorter alarm period sees nothing more.
AGENT_PERIOD_SECONDS = 60
GPU_MEMORY_METRIC = "GpuMemoryUsed"  # MiB used on the node's GPUs together
# The node agent's own metrics: a job's code cannot publish under these names.
AGENT_METRICS = frozenset({GPU_UTILIZATION_METRIC, GPU_TEMPERATURE_METRIC, GPU_MEMORY_METRIC})
JOB_DIMENSION = "JobId"

INTAKE_PREFIX = "jobs/"
# The refreshed catalog in the stack's bucket: written daily by CatalogRefresh, read (once per
# cold start, when a function first plans) in place of the bundled snapshot while fresh.
CATALOG_KEY = "catalog/current.json"
RUNS_PREFIX = "runs/"
# Each run's secret key (runs/<job>/node-key): the agent signs its reports with it
# (domain/node_reports.py); the instance role, Launch and NodeReport read it, a job's role cannot.
NODE_KEY_NAME = "node-key"
# The control instruction (runs/<job>/control.json) that has a node which just finished a stage
# of a multi-stage job run the next one on the same instance.
CONTROL_RUN_STAGE = "run-stage"


@dataclass(frozen=True)
class Index:
    name: str
    partition_key: str
    sort_key: str | None = None


@dataclass(frozen=True)
class Table:
    construct_id: str
    env_var: str
    partition_key: str
    sort_key: str | None = None
    indexes: tuple[Index, ...] = ()
    ttl_attribute: str | None = None

    def key_attributes(self) -> dict[str, str]:
        """Every attribute used in a key of the table or its indexes, all strings."""
        names = [self.partition_key, self.sort_key]
        for index in self.indexes:
            names += [index.partition_key, index.sort_key]
        return {name: "S" for name in names if name}


@dataclass(frozen=True)
class Function:
    construct_id: str
    handler: str
    description: str
    timeout_seconds: int = 30
    memory_mb: int = 512


@dataclass(frozen=True)
class Rule:
    construct_id: str
    description: str
    pattern: dict[str, Any]
    target_function: str
    # AWS service events arrive on the default bus; gpufleet's own events on its bus.
    on_default_bus: bool = False


@dataclass(frozen=True)
class Schedule:
    construct_id: str
    description: str
    expression: str  # EventBridge Scheduler: rate(...) or cron(...)
    target_function: str


@dataclass(frozen=True)
class StateMachine:
    construct_id: str
    definition_file: str
    # Placeholder in the ASL -> construct id of the function it names.
    function_substitutions: dict[str, str] = field(default_factory=dict)
    # Placeholder in the ASL -> environment variable whose value it takes.
    value_substitutions: dict[str, str] = field(default_factory=dict)

    def definition(self) -> str:
        return (STATEMACHINE_DIR / self.definition_file).read_text(encoding="utf-8")


JOBS_TABLE = Table(
    construct_id="JobsTable",
    env_var="JOBS_TABLE",
    partition_key="job_id",
    indexes=(
        Index("by_status", "status", "created_at"),
        Index("by_team", "team", "created_at"),
    ),
)
IDEMPOTENCY_TABLE = Table(
    construct_id="IdempotencyTable",
    env_var="IDEMPOTENCY_TABLE",
    partition_key="id",
    ttl_attribute="expiration",
)
# Offerings that just failed with capacity errors, per region, until `expires_at` (epoch s).
CAPACITY_TABLE = Table(
    construct_id="CapacityMemoryTable",
    env_var="CAPACITY_TABLE",
    partition_key="region",
    sort_key="offering",
    ttl_attribute="expires_at",
)
# The admission queue: waiting jobs sharded by job id and sorted by class then submission time,
# the running set, usage counters and bookings (see docs/queues.md for the key design).
QUEUE_TABLE = Table(
    construct_id="QueueTable",
    env_var="QUEUE_TABLE",
    partition_key="pk",
    sort_key="sk",
)
# The queue table's partition of running jobs, usage counters and bookings.
QUEUE_STATE_PARTITION = "state"
TABLES: tuple[Table, ...] = (JOBS_TABLE, IDEMPOTENCY_TABLE, CAPACITY_TABLE, QUEUE_TABLE)

INTAKE_FROM_S3 = Function(
    "IntakeFromS3", "gpufleet.handlers.on_s3_upload.handler", "Accepts job specs uploaded to S3"
)
INTAKE_FROM_EVENT = Function(
    "IntakeFromEvent",
    "gpufleet.handlers.on_submit_event.handler",
    "Accepts job specs sent as EventBridge events",
)
LAUNCH = Function(
    "Launch",
    "gpufleet.handlers.on_launch.handler",
    "Launches a job's nodes with CreateFleet; the workflow then waits for their report",
    timeout_seconds=90,
)
ENQUEUE = Function(
    "Enqueue",
    "gpufleet.handlers.on_enqueue.handler",
    "Parks a job in the admission queue until a dispatcher admits it",
)
DISPATCH = Function(
    "Dispatch",
    "gpufleet.handlers.on_dispatch.handler",
    "Admits queued jobs in order, within quotas, and preempts for them",
    timeout_seconds=60,
)
REQUEUE = Function(
    "Requeue",
    "gpufleet.handlers.on_requeue.handler",
    "Sends a checkpointed job back to the queue",
)
NODE_REPORT = Function(
    "NodeReport",
    "gpufleet.handlers.on_node_report.handler",
    "Takes the node agent's start, heartbeat and finish reports",
)
METRIC_WATCH = Function(
    "MetricWatch",
    "gpufleet.handlers.on_metric_watch.handler",
    "Reads every running job's GPU metrics each minute and acts on idle, hot, leaking or busy",
    # 10,000 running jobs: the jobs read, about 60 GetMetricData calls and the actions due.
    timeout_seconds=120,
    memory_mb=1024,
)
# How often the reconciler runs: also how late it may notice that a Capacity Block's runs must
# checkpoint before the block ends (`domain/reserved.py`).
RECONCILE_PERIOD_SECONDS = 300
RECONCILE = Function(
    "Reconcile",
    "gpufleet.handlers.on_reconcile.handler",
    "Terminates instances gpufleet launched that no live job holds",
    timeout_seconds=120,
)
INSTANCE_EVENT = Function(
    "InstanceEvent",
    "gpufleet.handlers.on_instance_event.handler",
    "Checkpoints jobs on spot interruption warnings; notices instances that went away",
)
BLOCK_ENDING = Function(
    "BlockEnding",
    "gpufleet.handlers.on_block_ending.handler",
    "Checkpoints and requeues the runs on a Capacity Block when EC2 warns of its end",
)
RELEASE = Function(
    "Release",
    "gpufleet.handlers.on_release.handler",
    "Terminates every instance of a job; requeues it, or records its final status and cost",
    timeout_seconds=90,
)
WORKFLOW_ENDED = Function(
    "WorkflowEnded",
    "gpufleet.handlers.on_workflow_ended.handler",
    "Ends the job of a lifecycle that failed, timed out or was stopped before it settled it",
)
CATALOG_REFRESH = Function(
    "CatalogRefresh",
    "gpufleet.handlers.on_catalog_refresh.handler",
    "Rebuilds the instance catalog's prices from the AWS APIs into the stack's bucket",
    # DescribeInstanceTypes, a spot price history per 100 types and the Price List's pages.
    timeout_seconds=300,
    memory_mb=1024,
)
NOTIFY = Function(
    "Notify",
    "gpufleet.handlers.on_status_changed.handler",
    "Sends each job's status changes to the SNS topics its team names in gpufleet.yaml",
)
FUNCTIONS: tuple[Function, ...] = (
    INTAKE_FROM_S3,
    INTAKE_FROM_EVENT,
    ENQUEUE,
    DISPATCH,
    LAUNCH,
    REQUEUE,
    NODE_REPORT,
    INSTANCE_EVENT,
    BLOCK_ENDING,
    METRIC_WATCH,
    RECONCILE,
    RELEASE,
    WORKFLOW_ENDED,
    CATALOG_REFRESH,
    NOTIFY,
)

RULES: tuple[Rule, ...] = (
    Rule(
        construct_id="SubmitRule",
        description="Job submissions sent as events",
        pattern={
            "source": [{"prefix": SUBMIT_SOURCE_PREFIX}],
            "detail-type": [DETAIL_JOB_SUBMITTED],
        },
        target_function=INTAKE_FROM_EVENT.construct_id,
    ),
    Rule(
        construct_id="NodeReportRule",
        description="Start, heartbeat and finish reports of node agents",
        pattern={
            "source": [AGENT_SOURCE],
            "detail-type": [DETAIL_NODE_STARTED, DETAIL_NODE_HEARTBEAT, DETAIL_NODE_FINISHED],
        },
        target_function=NODE_REPORT.construct_id,
    ),
    Rule(
        construct_id="DispatchRule",
        description="Wake a dispatcher when a job is queued or capacity is freed",
        pattern={
            "source": [CONTROL_PLANE_SOURCE],
            "detail-type": [DETAIL_JOB_QUEUED, DETAIL_CAPACITY_FREED],
        },
        target_function=DISPATCH.construct_id,
    ),
    Rule(
        construct_id="DependencyRule",
        description="Wake a dispatcher when a job ends: the jobs that depend on it are judged",
        pattern={
            "source": [CONTROL_PLANE_SOURCE],
            "detail-type": [DETAIL_JOB_STATUS_CHANGED],
            # The terminal statuses (domain/job.py TERMINAL_STATUSES), of ends whose write did
            # not ask whether jobs are held on them (a cancel, a failed launch, an end settled
            # from the job's record).
            "detail": {"status": list(JOB_ENDED_STATUSES), HOLDS_ASKED: [{"exists": False}]},
        },
        target_function=DISPATCH.construct_id,
    ),
    Rule(
        construct_id="InterruptionRule",
        description="Spot interruption warnings and rebalance recommendations",
        pattern={"source": ["aws.ec2"], "detail-type": [DETAIL_SPOT_WARNING, DETAIL_REBALANCE]},
        target_function=INSTANCE_EVENT.construct_id,
        on_default_bus=True,
    ),
    Rule(
        construct_id="InstanceStateRule",
        description="Instances stopping or terminating",
        pattern={
            "source": ["aws.ec2"],
            "detail-type": [DETAIL_STATE_CHANGE],
            "detail": {"state": ["stopping", "stopped", "shutting-down", "terminated"]},
        },
        target_function=INSTANCE_EVENT.construct_id,
        on_default_bus=True,
    ),
    Rule(
        construct_id="BlockEndingRule",
        description="Capacity Block expiration warnings: the block's runs checkpoint now",
        pattern={
            "source": ["aws.ec2"],
            "detail-type": [DETAIL_BLOCK_EXPIRATION_WARNING, DETAIL_BLOCK_EXPIRATION_WARNING_SHORT],
        },
        target_function=BLOCK_ENDING.construct_id,
        on_default_bus=True,
    ),
    Rule(
        construct_id="WorkflowEndedRule",
        description="Job lifecycles that failed, timed out or were stopped",
        pattern={
            "source": ["aws.states"],
            "detail-type": [DETAIL_EXECUTION_STATUS_CHANGE],
            # Lifecycle executions are named after their job (j-...); the handler checks the
            # state machine too (its ARN is only known once deployed).
            "detail": {"status": list(EXECUTION_ENDS_UNSETTLED), "name": [{"prefix": "j-"}]},
        },
        target_function=WORKFLOW_ENDED.construct_id,
        on_default_bus=True,
    ),
)


def rules(notified_teams: Sequence[str]) -> tuple[Rule, ...]:
    """The stack's rules for a config whose `notified_teams` have somewhere to send their jobs'
    status changes (`domain.notify.notified_teams`): the Notify function hears only theirs, so
    a job of any other team costs no invocation a status change (none when no team is)."""
    if not notified_teams:
        return RULES
    notify = Rule(
        construct_id="NotifyRule",
        description="Job status changes of the teams told of them, for their notifications",
        pattern={
            "source": [CONTROL_PLANE_SOURCE],
            "detail-type": [DETAIL_JOB_STATUS_CHANGED],
            "detail": {"team": sorted(notified_teams)},
        },
        target_function=NOTIFY.construct_id,
    )
    return (*RULES, notify)


# A pass every minute: catches lost events, time windows opening and closing, and checkpoint
# grace periods running out.
SCHEDULES: tuple[Schedule, ...] = (
    Schedule(
        construct_id="DispatchSchedule",
        description="Admission pass every minute",
        expression="rate(1 minute)",
        target_function=DISPATCH.construct_id,
    ),
    # Every running job's metrics against its alarms (one period of the agent's samples).
    Schedule(
        construct_id="MetricWatchSchedule",
        description="Evaluate the metric alarms of every running job",
        expression="rate(1 minute)",
        target_function=METRIC_WATCH.construct_id,
    ),
    Schedule(
        construct_id="ReconcileSchedule",
        description="Find and terminate orphaned instances",
        expression=f"rate({RECONCILE_PERIOD_SECONDS // 60} minutes)",
        target_function=RECONCILE.construct_id,
    ),
    # Spot prices move daily at most (EC2's smoothed pricing); the readers refuse a refreshed
    # catalog older than GPUFLEET_CATALOG_MAX_AGE_DAYS, so a few failed days cost nothing.
    Schedule(
        construct_id="CatalogRefreshSchedule",
        description="Refresh the catalog's prices from the AWS APIs",
        expression="rate(1 day)",
        target_function=CATALOG_REFRESH.construct_id,
    ),
)

JOB_LIFECYCLE = StateMachine(
    construct_id="JobLifecycle",
    definition_file="job_lifecycle.asl.json",
    function_substitutions={
        "EnqueueFunctionArn": ENQUEUE.construct_id,
        "LaunchFunctionArn": LAUNCH.construct_id,
        "RequeueFunctionArn": REQUEUE.construct_id,
        "ReleaseFunctionArn": RELEASE.construct_id,
    },
)
STATE_MACHINES: tuple[StateMachine, ...] = (JOB_LIFECYCLE,)


def execution_arn(state_machine_arn: str, name: str) -> str:
    """The ARN of a state machine's execution of that name (the lifecycle's: the job id)."""
    return f"{state_machine_arn.replace(':stateMachine:', ':execution:', 1)}:{name}"


# Environment variables the functions read (see gpufleet.settings): every function gets the
# common ones; some get more.
ENV_EVENT_BUS = "EVENT_BUS_NAME"
ENV_STATE_MACHINE = "JOB_STATE_MACHINE_ARN"
ENV_INTAKE_BUCKET = "INTAKE_BUCKET"
# The stack's launch templates, `KEY=lt-...` comma-separated, one per boot target and EFA width
# (gpufleet.domain.boot.TemplateKey names: `x86_64-nvidia`, `x86_64-nvidia-efa32`): the keys are
# also what the deployment can boot, which selection and intake hold every job to.
ENV_LAUNCH_TEMPLATES = "LAUNCH_TEMPLATES"
ENV_SUBNETS = "SUBNET_IDS"
ENV_CONFIG = "GPUFLEET_CONFIG"  # the validated policy config (gpufleet.yaml) as compact JSON
ENV_NOTIFY_TOPIC = "NOTIFY_TOPIC_ARN"  # SNS topic for alerts people must see
# The SNS topic of each team with e-mail addresses in gpufleet.yaml (`teams.<team>.notify`),
# `TEAM=arn:...` comma-separated: the stack makes them (docs/notifications.md).
ENV_TEAM_TOPICS = "TEAM_TOPICS"
# The deployment's account: a spec's notify topic must be in it.
ENV_ACCOUNT = "GPUFLEET_ACCOUNT_ID"
# The deployment's checkpoint location (`s3://bucket/prefix`, CDK context `checkpoint_uri`;
# empty: none): a spec's checkpoint must be under its team's folder there, as the job role is.
ENV_CHECKPOINT_URI = "GPUFLEET_CHECKPOINT_URI"
# Optional: each node's root volume size in GiB, for storage cost (default 200, as the stack).
ENV_ROOT_VOLUME = "GPUFLEET_ROOT_VOLUME_GIB"
COMMON_ENV: tuple[str, ...] = (
    *(table.env_var for table in TABLES),
    ENV_EVENT_BUS,
    ENV_INTAKE_BUCKET,
    ENV_CONFIG,
    # Every function that plans (intake, Requeue, Launch, the reconciler's requeues) selects
    # only what the templates boot.
    ENV_LAUNCH_TEMPLATES,
)
EXTRA_ENV: dict[str, tuple[str, ...]] = {
    INTAKE_FROM_S3.construct_id: (ENV_STATE_MACHINE, ENV_ACCOUNT, ENV_CHECKPOINT_URI),
    INTAKE_FROM_EVENT.construct_id: (ENV_STATE_MACHINE, ENV_ACCOUNT, ENV_CHECKPOINT_URI),
    LAUNCH.construct_id: (ENV_SUBNETS, ENV_ROOT_VOLUME),
    # The reconciler launches the warm pool's instances, and looks for lifecycles that ended.
    RECONCILE.construct_id: (ENV_SUBNETS, ENV_STATE_MACHINE),
    WORKFLOW_ENDED.construct_id: (ENV_STATE_MACHINE,),
    # Past its execution's budget, a requeued job continues in a new execution.
    REQUEUE.construct_id: (ENV_STATE_MACHINE,),
    METRIC_WATCH.construct_id: (ENV_NOTIFY_TOPIC,),
    # Budgets reached (a job's, a team's month) are told to the operators; an array's child
    # admitted starts its execution (docs/arrays.md).
    DISPATCH.construct_id: (ENV_NOTIFY_TOPIC, ENV_STATE_MACHINE),
    NOTIFY.construct_id: (ENV_TEAM_TOPICS,),
}


def environment_of(function: Function) -> tuple[str, ...]:
    """The deployment variables a function is given."""
    return COMMON_ENV + EXTRA_ENV.get(function.construct_id, ())


# The node agent's container output. The stack names the log group (its `AgentLogGroupName`
# output, given to the agent as this variable); each run writes one stream per job and instance,
# so every run of a job is found by the job's prefix.
ENV_AGENT_LOG_GROUP = "GPUFLEET_AGENT_LOG_GROUP"
# The role the node agent opens each job's session with (infra/constructs/job_role.py).
ENV_JOB_ROLE = "GPUFLEET_JOB_ROLE"
# The job containers' cgroup on a node: the boot script blocks the metadata service for it (the
# containers share the host's network, so the hop limit alone does not keep them from it).
JOBS_SLICE = "gpufleet-jobs.slice"


def team_topic_id(team: str) -> str:
    """The construct id (the stack) and the name's tail (the emulator) of a team's topic."""
    return f"Team-{team}"


def agent_log_stream_prefix(job_id: str) -> str:
    return f"{job_id}/"


def agent_log_stream(job_id: str, instance_id: str) -> str:
    return agent_log_stream_prefix(job_id) + instance_id


# The stack's outputs (CfnOutput id -> the deployment variable its value fills): the CLI reads a
# deployed stack's with these (`--stack NAME`), and the emulator publishes the same ones.
STACK_OUTPUTS: dict[str, str] = {
    **{f"{t.construct_id}Name": t.env_var for t in TABLES},
    "EventBusName": ENV_EVENT_BUS,
    "IntakeBucketName": ENV_INTAKE_BUCKET,
    f"{JOB_LIFECYCLE.construct_id}Arn": ENV_STATE_MACHINE,
    "LaunchTemplates": ENV_LAUNCH_TEMPLATES,
    "SubnetIds": ENV_SUBNETS,
    "AlertsTopicArn": ENV_NOTIFY_TOPIC,
    "AgentLogGroupName": ENV_AGENT_LOG_GROUP,
}
