"""Which instances must end: nothing gpufleet launched runs unless a live job holds it.

The workflow's Release ends a run's instances on every path (`settlement.Terminate`); these
rules are the reconciler's second line, for what a crash, a lost event or a manual change left
behind. Pure: the instance as EC2 lists it and the job as the store holds it, in; a reason, out.
"""

from __future__ import annotations

from collections.abc import Collection

from gpufleet.domain.job import Job, JobStatus


def why_orphaned(
    instance_id: str,
    age_seconds: float,
    job: Job | None,
    *,
    tagged: bool,
    grace_seconds: float,
    boot_allowance_seconds: float,
) -> str | None:
    """Why a managed instance must be terminated (None: a live job holds it, or it is too young
    to judge). `job` is the job its tag names (None when the tag is missing or names no job)."""
    if age_seconds < grace_seconds:
        return None  # a launch may be recording it right now
    if not tagged:
        return "no job tag"
    if job is None:
        return "its job does not exist"
    if job.status.terminal:
        return f"its job is {job.status.value}"
    placement = job.placement
    if placement is None or instance_id not in placement.instance_ids:
        return "its job does not hold it (left over from a launch)"
    if job.status is JobStatus.LAUNCHING and age_seconds > boot_allowance_seconds:
        return "its node never reported in"
    return None


def instance_gone(
    job: Job, running: Collection[str], now: float, *, grace_seconds: float
) -> str | None:
    """An instance the job's run holds that no longer runs while nobody released it (None: there
    is none). Its run's end is told again on every pass until Release records the release: a
    pass that died half way, or a waiting task that missed it, gets it then."""
    placement = job.placement
    if (
        placement is None
        or job.released_at is not None
        or now - placement.launched_at < grace_seconds  # EC2 may not list it yet
    ):
        return None
    return next((i for i in placement.instance_ids if i not in running), None)
