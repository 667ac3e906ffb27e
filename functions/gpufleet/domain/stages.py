"""Multi-stage jobs: what a stage ran on and cost, where its data goes, and whether the next
stage may run on the instances the last one leaves behind (docs/stages.md).

A job with `stages` runs them in order. Each stage is planned, admitted and launched like a job
of its own (`Job.effective_spec` is the current stage's spec); between two stages its
instances are released, unless the next stage asks to reuse them and fits on them.
"""

from __future__ import annotations

from gpufleet.domain.catalog import InstanceType
from gpufleet.domain.job import Job, JobStatus, StageRecord
from gpufleet.domain.selection import is_feasible
from gpufleet.domain.spec import Resources

# What a stage's container finds in its environment: its name, where to write what the next
# stage reads, and where the previous stage wrote (absent for the first stage).
ENV_STAGE = "GPUFLEET_STAGE"
ENV_STAGE_OUTPUT = "GPUFLEET_STAGE_OUTPUT"
ENV_STAGE_INPUT = "GPUFLEET_STAGE_INPUT"


def stage_environment(job: Job, data_root: str) -> dict[str, str]:
    """The stage variables of the current stage's container; `data_root` is the job's stage
    data prefix (`s3://bucket/runs/<job>/stages/`). Empty for a job without stages."""
    stages = job.spec.stages
    if not stages:
        return {}
    index = job.stage_index
    env = {
        ENV_STAGE: stages[index].name,
        ENV_STAGE_OUTPUT: f"{data_root}{stages[index].name}/",
    }
    if index > 0:
        env[ENV_STAGE_INPUT] = f"{data_root}{stages[index - 1].name}/"
    return env


def next_stage_may_reuse(job: Job) -> bool:
    """Whether the stage after the current one asks for the current one's instances."""
    stages = job.spec.stages
    following = job.stage_index + 1
    return following < len(stages) and stages[following].reuse_previous


def fits_on(instance_type: InstanceType, nodes: int, resources: Resources) -> bool:
    """Whether a stage asking for `resources` can run on `nodes` instances of `instance_type`
    (the same feasibility test selection applies to every offering)."""
    return resources.nodes <= nodes and is_feasible(instance_type, resources)


def close_stage(
    job: Job,
    status: JobStatus,
    *,
    spent_usd: float,
    held_seconds: float,
    gpus_per_node: int | None,
) -> list[StageRecord]:
    """The job's stage records with its current stage's added, ended with `status`.

    `spent_usd` and `held_seconds` are what the whole job has cost and held so far, every run of
    every stage: the stage's share is what the earlier stages' records do not account for, so
    the stages always add up to the job. A stage already recorded (a repeated step) is not
    recorded again; a job without stages has no records.
    """
    earlier = job.stage_records
    if not job.spec.stages or len(earlier) > job.stage_index:
        return earlier
    placement = job.placement
    instance_ids = list(placement.instance_ids) if placement else []
    reused = bool(earlier) and bool(set(earlier[-1].instance_ids) & set(instance_ids))
    record = StageRecord(
        name=job.spec.stages[job.stage_index].name,
        status=status,
        instance_type=placement.instance_type if placement else None,
        capacity_type=placement.capacity_type if placement else None,
        instance_ids=instance_ids,
        gpus=None if gpus_per_node is None else gpus_per_node * len(instance_ids),
        hourly_usd=round(placement.fleet_hourly_usd, 6) if placement else None,
        cost_usd=round(max(0.0, spent_usd - sum(r.cost_usd for r in earlier)), 6),
        held_seconds=round(max(0.0, held_seconds - sum(r.held_seconds for r in earlier)), 3),
        retries=job.retries,
        preemptions=job.preemptions,
        interruptions=job.interruptions,
        reused_previous=reused,
    )
    return [*earlier, record]
