"""`gpufleet queue`: every waiting job in the order the next admission pass takes them, with
the reason each waits, read-only (the same policy and reads as a pass: `pass_reads`)."""

from __future__ import annotations

from dataclasses import dataclass

from gpufleet.domain.arrays import Readiness
from gpufleet.domain.fair_share import usage_by_team
from gpufleet.domain.queueing import (
    Booking,
    QueuePolicy,
    admission_order,
    decide,
    effective_priority,
)
from gpufleet.ports import Ports
from gpufleet.services.pass_reads import WAITS_FOR_DEPENDENCIES, DependencyStatuses, team_spend


@dataclass(frozen=True)
class QueueRow:
    position: int
    job_id: str
    team: str
    priority: str
    gpus: int
    waited_seconds: float
    effective_priority: float
    reason: str  # "next" when the next pass would admit it


def queue_listing(ports: Ports, policy: QueuePolicy) -> tuple[list[QueueRow], list[Booking]]:
    """Every waiting job in admission order, with the reason it waits (read-only); behind
    them, the jobs that wait for their dependencies, which the policy does not see."""
    now = ports.clock.now()
    waiting = ports.queue.waiting()
    state = ports.queue.state()
    bookings, running = state.bookings, [r.job for r in state.running]
    dependencies = DependencyStatuses(ports.jobs)
    held = [w.job for w in waiting if dependencies.verdict(w.job).readiness is not Readiness.RUN]
    held_ids = {job.job_id for job in held}
    jobs = [w.job for w in waiting if w.job.job_id not in held_ids]
    usage = usage_by_team(state.team_usage, now, policy.fair_share_half_life_seconds)
    decision = decide(
        jobs,
        running,
        bookings,
        now,
        policy,
        team_spend_usd=team_spend(ports, policy, now),
        team_usage=usage,
    )
    admitted = {a.job_id for a in decision.admitted}
    listed = [
        (job, "next" if job.job_id in admitted else decision.waiting[job.job_id].value)
        for job in admission_order(jobs, now, policy, usage)
    ] + [(job, WAITS_FOR_DEPENDENCIES) for job in held]
    rows = [
        QueueRow(
            position=index,
            job_id=job.job_id,
            team=job.team,
            priority=job.priority.value,
            gpus=job.gpus,
            waited_seconds=round(now - job.enqueued_at, 1),
            effective_priority=round(effective_priority(job, now, policy), 3),
            reason=reason,
        )
        for index, (job, reason) in enumerate(listed, start=1)
    ]
    return rows, sorted(bookings, key=lambda b: b.start)
