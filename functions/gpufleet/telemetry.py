"""The control plane's own metrics: names, units and dimensions, in one place.

The functions publish them with Powertools Metrics (CloudWatch embedded metric format) in the
`GpuFleet` namespace, only through `handlers.common.count`, which takes one of these; the
dashboard and alarms in `infra/constructs/operations.py` read the same definitions, so the two
cannot drift (tests/integration/test_spot_demo.py checks both ways on the demos).
Every dimension takes a bounded set of values (a priority class, a job status, a capacity
type, a launch error category): never a job id, a team name from user input or an instance
id, which would make a metric per value.
"""

from __future__ import annotations

from dataclasses import dataclass

NAMESPACE = "GpuFleet"
SERVICE = "gpufleet"
# Powertools Metrics adds this dimension (value SERVICE) to every metric it publishes.
SERVICE_DIMENSION = "service"

# Dimension names (besides Powertools' own `service`).
PRIORITY = "Priority"  # low | normal | high | critical
STATUS = "Status"  # a terminal JobStatus value
CAPACITY_TYPE = "CapacityType"  # spot | on-demand | reserved
ERROR_CATEGORY = "Category"  # capacity | quota | configuration | unknown
# The Category of a launch that failed without an EC2 error code to classify.
UNKNOWN_ERROR_CATEGORY = "unknown"
# Why a node report was dropped: a DroppedReport value (unknown-job | unknown-instance | invalid |
# unsigned | other-run | bad-signature).
REPORT_PROBLEM = "Problem"


@dataclass(frozen=True)
class Metric:
    name: str
    unit: str
    dimensions: tuple[str, ...] = ()
    description: str = ""


# Gauges, published by every dispatcher pass (each minute at least).
QUEUE_DEPTH = Metric("QueueDepth", "Count", (PRIORITY,), "jobs waiting, by priority class")
RUNNING_JOBS = Metric("RunningJobs", "Count", (), "jobs admitted and not yet released")
GPUS_HELD = Metric("GpusHeld", "Count", (), "GPUs of admitted jobs")
COST_PER_HOUR = Metric("CostPerHourUsd", "None", (), "hourly price of every instance held")

# Counters, published where the thing happens.
JOBS_ACCEPTED = Metric("JobsAccepted", "Count", (), "specs accepted (a job each)")
JOBS_REJECTED = Metric("JobsRejected", "Count", (), "specs rejected (no job)")
JOBS_ENDED = Metric("JobsEnded", "Count", (STATUS,), "jobs reaching a final status")
JOB_COST = Metric("JobCostUsd", "None", (), "cost of each ended job")
WAIT_SECONDS = Metric("WaitSeconds", "Seconds", (), "queue wait of each admission (p95 alarm)")
ADMITTED = Metric("Admitted", "Count", (), "admissions")
PREEMPTED = Metric("Preempted", "Count", (), "running jobs asked to make room")
INSTANCES_LAUNCHED = Metric(
    "InstancesLaunched", "Count", (CAPACITY_TYPE,), "instances launched, by capacity type"
)
LAUNCH_FAILURES = Metric(
    "LaunchFailures", "Count", (ERROR_CATEGORY,), "launch attempts that got no capacity"
)
ONDEMAND_FALLBACKS = Metric("OnDemandFallbacks", "Count", (), "runs on on-demand after spot")
SPOT_INTERRUPTIONS = Metric("SpotInterruptions", "Count", (), "interruption warnings acted on")
BUDGET_BREACHES = Metric("BudgetBreaches", "Count", (), "jobs stopped or held for budget")
IDLE_JOBS = Metric("IdleJobs", "Count", (), "jobs flagged for low GPU utilization")
OVERHEATED_JOBS = Metric("OverheatedJobs", "Count", (), "jobs moved off a hot GPU")
ORPHANS_TERMINATED = Metric("OrphansTerminated", "Count", (), "instances the reconciler ended")
NODE_REPORTS_DROPPED = Metric(
    "NodeReportsDropped",
    "Count",
    (REPORT_PROBLEM,),
    "node reports dropped unheard: for no job, from an instance the job does not hold, malformed",
)

ALL: tuple[Metric, ...] = (
    QUEUE_DEPTH,
    RUNNING_JOBS,
    GPUS_HELD,
    COST_PER_HOUR,
    JOBS_ACCEPTED,
    JOBS_REJECTED,
    JOBS_ENDED,
    JOB_COST,
    WAIT_SECONDS,
    ADMITTED,
    PREEMPTED,
    INSTANCES_LAUNCHED,
    LAUNCH_FAILURES,
    ONDEMAND_FALLBACKS,
    SPOT_INTERRUPTIONS,
    BUDGET_BREACHES,
    IDLE_JOBS,
    OVERHEATED_JOBS,
    ORPHANS_TERMINATED,
    NODE_REPORTS_DROPPED,
)
