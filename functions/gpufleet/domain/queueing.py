"""Who runs next: admission order, team quotas, borrowing, the reserve, bookings, preemption.

Everything here is a pure function of a snapshot (queued jobs, running jobs, bookings, the
time) and the queue policy from `gpufleet.yaml`. The dispatcher Lambda, the emulator and the
simulator all call `decide`; the dispatcher then applies its decisions with conditional
DynamoDB transactions, so two dispatchers deciding at once can never admit a job twice or
exceed a quota.

Order. Jobs are ranked by effective priority: the class rank (critical 3, high 2, normal 1,
low 0) plus `aging_per_hour` for every hour waited, so any job eventually outranks newer work of
any class and nothing starves. Ties go to the earlier submission (FIFO within a class).

Entitlement. A team may hold its quota (`gpus`) plus any booking active now, and may borrow up
to `borrow` GPUs more while other teams leave their quota idle. Jobs admitted on borrowed
GPUs are the first to be reclaimed. A share of the global cap (`reserve_share`) is kept for
critical work, or for the classes a time window opens it to.

Preemption. A waiting job may preempt running jobs only to run within its own entitlement (or
when it is critical). Victims are borrowers of other teams, or lower-class jobs of its own team
(any team, for critical work); never jobs younger than `min_runtime_seconds`. They are chosen
borrowers first, then lowest class, then newest, and the set is pruned to the smallest that
frees enough. Because the preemptor is always entitled and its victims never are (or are of
a lower class in the same team), a victim can never preempt its preemptor back: preemption
cannot loop.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime
from enum import StrEnum
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from gpufleet.domain.spec import Priority

CLASS_RANK: dict[Priority, int] = {
    Priority.CRITICAL: 3,
    Priority.HIGH: 2,
    Priority.NORMAL: 1,
    Priority.LOW: 0,
}


class TeamQuota(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    gpus: int = Field(ge=0, description="GPUs the team is guaranteed")
    borrow: int = Field(default=0, ge=0, description="GPUs it may borrow from idle quota")
    monthly_budget_usd: float | None = Field(
        default=None, gt=0, description="Spend per calendar month (UTC) before jobs wait"
    )
    on_budget: Literal["notify", "checkpoint", "stop"] = Field(
        default="checkpoint",
        description="When the month's actual spend passes the budget, the team's running jobs "
        "are stopped after a checkpoint, stopped at once, or only reported",
    )


class TimeWindow(BaseModel):
    """A daily window (UTC) in which the reserve opens to more classes of work."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    name: str = Field(pattern=r"^[a-z0-9][a-z0-9._-]{0,62}$")
    start: str = Field(pattern=r"^([01]\d|2[0-3]):[0-5]\d$", description="HH:MM UTC")
    end: str = Field(pattern=r"^([01]\d|2[0-3]):[0-5]\d$", description="HH:MM UTC")
    reserve_open_to: list[Priority] = Field(default_factory=list)

    def _minutes(self, hhmm: str) -> int:
        hours, minutes = hhmm.split(":")
        return int(hours) * 60 + int(minutes)

    def active_at(self, epoch_seconds: float) -> bool:
        minute = int(epoch_seconds // 60) % (24 * 60)
        start, end = self._minutes(self.start), self._minutes(self.end)
        if start <= end:
            return start <= minute < end
        return minute >= start or minute < end  # wraps midnight, e.g. 22:00-06:00


class QueuePolicy(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    max_gpus: int = Field(default=64, ge=1, description="GPUs all jobs together may hold")
    max_instances: int = Field(default=32, ge=1)
    reserve_share: float = Field(default=0.05, ge=0, le=0.5)
    aging_per_hour: float = Field(default=0.1, ge=0, description="class ranks per hour waited")
    min_runtime_seconds: int = Field(default=600, ge=0)
    preemption: bool = Field(default=True, description="whether waiting work may preempt")
    preemption_grace_seconds: int = Field(default=120, ge=0)
    teams: dict[str, TeamQuota] = Field(default_factory=dict)
    # Each team the config does not name gets this quota.
    default_team: TeamQuota = Field(default_factory=lambda: TeamQuota(gpus=16, borrow=0))
    windows: list[TimeWindow] = Field(default_factory=list, max_length=10)

    @model_validator(mode="after")
    def _quotas_fit(self) -> QueuePolicy:
        if self.reserve_gpus >= self.max_gpus:
            raise ValueError("the reserve leaves no GPUs for other work")
        return self

    @property
    def reserve_gpus(self) -> int:
        return math.ceil(self.reserve_share * self.max_gpus)

    def quota(self, team: str) -> TeamQuota:
        return self.teams.get(team, self.default_team)

    def window_at(self, epoch_seconds: float) -> TimeWindow | None:
        return next((w for w in self.windows if w.active_at(epoch_seconds)), None)


@dataclass(frozen=True, slots=True)
class QueuedJob:
    job_id: str
    team: str
    priority: Priority
    gpus: int  # all nodes together
    instances: int
    enqueued_at: float  # first submission; kept across requeues so a preempted job ages on
    preempted_for: str | None = None  # requeued to make room for this job
    preemptions: int = 0  # times it was stopped to make room: such a job no longer borrows
    estimated_cost_usd: float = 0.0  # of its run, from its launch plan


@dataclass(frozen=True, slots=True)
class RunningJob:
    job_id: str
    team: str
    priority: Priority
    gpus: int
    instances: int
    admitted_at: float
    borrowed: bool = False  # admitted beyond its team's entitlement
    in_reserve: bool = False  # admitted into the reserve
    draining_for: str | None = None  # asked to checkpoint and stop, to make room for this job
    stop_at: float | None = None  # when its cost reaches its budget (jobs with a budget)
    hourly_usd: float = 0.0  # of its instances and storage, once launched

    @property
    def draining(self) -> bool:
        return self.draining_for is not None


@dataclass(frozen=True, slots=True)
class Booking:
    """GPUs a team booked for a window: held for it, and counted in its entitlement."""

    booking_id: str
    team: str
    gpus: int
    start: float
    end: float

    def active_at(self, epoch_seconds: float) -> bool:
        return self.start <= epoch_seconds < self.end


class BookingRefused(ValueError):
    """A booking the fleet could never honour: nothing is booked. The message says why, with
    the numbers."""


def check_booking(
    booking: Booking, booked: Iterable[Booking], now: float, policy: QueuePolicy
) -> None:
    """Raise BookingRefused for a booking of no GPUs, over an empty or inverted window or one
    that has ended, for a team the config does not name, or of more GPUs than the fleet can
    hold for bookings (its cap outside the reserve, which is for urgent work) at some moment
    of the window, with the bookings already made. A window that has begun holds from now."""
    if booking.gpus < 1:
        raise BookingRefused(f"a booking needs at least 1 GPU (got {booking.gpus})")
    if booking.end <= booking.start:
        raise BookingRefused(
            f"the window must end after it starts (from {_utc(booking.start)} "
            f"to {_utc(booking.end)})"
        )
    if booking.end <= now:
        raise BookingRefused(f"the window ended already, at {_utc(booking.end)}")
    if booking.team not in policy.teams:
        named = ", ".join(sorted(policy.teams)) or "none"
        raise BookingRefused(f"team {booking.team!r} is not in the config (queue.teams: {named})")
    bookable = policy.max_gpus - policy.reserve_gpus
    if booking.gpus > bookable:
        raise BookingRefused(
            f"{booking.gpus} GPUs can never be held: the fleet holds {bookable} GPUs outside "
            f"the reserve (max_gpus {policy.max_gpus}, reserve {policy.reserve_gpus})"
        )
    start = max(booking.start, now)
    overlapping = [b for b in booked if b.start < booking.end and start < b.end]
    # The booked total only rises where a booking starts: the window's start and the starts
    # of the bookings that begin inside it are the moments to look at.
    for moment in sorted({start, *(b.start for b in overlapping if b.start > start)}):
        taken = sum(b.gpus for b in overlapping if b.active_at(moment))
        if taken + booking.gpus > bookable:
            raise BookingRefused(
                f"{taken} of the {bookable} GPUs outside the reserve are booked at "
                f"{_utc(moment)}: at most {max(0, bookable - taken)} more can be booked then"
            )


def _utc(epoch_seconds: float) -> str:
    return datetime.fromtimestamp(epoch_seconds, UTC).isoformat(timespec="minutes")


class WaitReason(StrEnum):
    QUOTA = "quota"  # the team's quota and borrowing are used up
    CAPACITY = "capacity"  # the global GPU or instance cap is reached
    WINDOW = "window"  # it would fit in the reserve, which is closed to its class now
    BOOKING = "booking"  # what is left is booked by other teams
    BUDGET = "budget"  # the team's spend this month plus this job's estimate exceeds its budget
    PREEMPTING = "preempting"  # lower-priority jobs are checkpointing to make room
    YIELDING = "yielding"  # it was preempted; the job it made room for goes first


@dataclass(frozen=True, slots=True)
class Admission:
    job_id: str
    borrowed: bool
    in_reserve: bool


@dataclass(frozen=True, slots=True)
class Preemption:
    victim_id: str
    for_job_id: str


@dataclass
class Decision:
    admitted: list[Admission] = field(default_factory=list)
    preemptions: list[Preemption] = field(default_factory=list)
    waiting: dict[str, WaitReason] = field(default_factory=dict)
    # Running jobs that entered the reserve through a window that has closed.
    reclaims: list[str] = field(default_factory=list)


def effective_priority(job: QueuedJob, now: float, policy: QueuePolicy) -> float:
    waited_hours = max(0.0, now - job.enqueued_at) / 3600
    return CLASS_RANK[job.priority] + policy.aging_per_hour * waited_hours


def admission_order(
    queued: Iterable[QueuedJob], now: float, policy: QueuePolicy
) -> list[QueuedJob]:
    return sorted(
        queued, key=lambda j: (-effective_priority(j, now, policy), j.enqueued_at, j.job_id)
    )


@dataclass
class _Usage:
    """What the running jobs hold, updated as the pass admits and preempts. The reserve is the
    top slice of the GPU cap: whatever is held beyond `max_gpus - reserve` is in it."""

    gpus: int = 0
    instances: int = 0
    team_gpus: dict[str, int] = field(default_factory=dict)

    def add(self, team: str, gpus: int, instances: int, sign: int = 1) -> None:
        self.gpus += sign * gpus
        self.instances += sign * instances
        self.team_gpus[team] = self.team_gpus.get(team, 0) + sign * gpus


@dataclass
class _Pass:
    policy: QueuePolicy
    now: float
    running: dict[str, RunningJob]
    bookings: list[Booking]
    usage: _Usage = field(default_factory=_Usage)

    def entitlement(self, team: str) -> int:
        booked = sum(b.gpus for b in self.bookings if b.team == team)
        return self.policy.quota(team).gpus + booked

    def idle_quota_of_others(self, team: str) -> int:
        teams = set(self.policy.teams) - {team}
        return sum(
            max(0, self.entitlement(t) - self.usage.team_gpus.get(t, 0)) for t in sorted(teams)
        )

    def held_for_other_bookings(self, team: str) -> int:
        """Booked GPUs other teams have not used yet: nobody else may take them."""
        held = 0
        for other in sorted({b.team for b in self.bookings} - {team}):
            booked = sum(b.gpus for b in self.bookings if b.team == other)
            unused = self.entitlement(other) - self.usage.team_gpus.get(other, 0)
            held += max(0, min(booked, unused))
        return held

    def fit(self, job: QueuedJob) -> tuple[WaitReason | None, bool, bool]:
        """Why the job cannot be admitted now (None if it can), and whether it would borrow
        and whether it would sit in the reserve."""
        policy, usage = self.policy, self.usage
        window = policy.window_at(self.now)
        reserve_open = job.priority is Priority.CRITICAL or (
            window is not None and job.priority in window.reserve_open_to
        )
        if usage.instances + job.instances > policy.max_instances:
            return WaitReason.CAPACITY, False, False
        held = self.held_for_other_bookings(job.team)
        free_total = policy.max_gpus - usage.gpus - held
        free_general = free_total - policy.reserve_gpus
        in_reserve = False
        if job.gpus > free_general:
            if job.gpus <= free_total:
                if not reserve_open:
                    return WaitReason.WINDOW, False, False
                in_reserve = True
            elif job.gpus <= free_total + held:
                return WaitReason.BOOKING, False, False
            else:
                return WaitReason.CAPACITY, False, False
        team_used = usage.team_gpus.get(job.team, 0)
        over = team_used + job.gpus - self.entitlement(job.team)
        if over <= 0:
            return None, False, in_reserve
        # A job once preempted runs within its team's own quota, when it fits there: borrowing
        # again would make it the first victim of the next reclaim, over and over. A job larger
        # than its team's whole entitlement can only ever run on borrowed GPUs, so it still may.
        may_borrow = job.preemptions == 0 or job.gpus > self.entitlement(job.team)
        if (
            may_borrow
            and over <= policy.quota(job.team).borrow
            and over <= self.idle_quota_of_others(job.team)
        ):
            return None, True, in_reserve
        # The reserve is shared, outside the teams' quotas: urgent work may run in it even
        # when its team has used up its own.
        reserve_used = max(0, usage.gpus - (policy.max_gpus - policy.reserve_gpus))
        if reserve_open and job.gpus <= min(free_total, policy.reserve_gpus - reserve_used):
            return None, False, True
        return WaitReason.QUOTA, False, False

    def admit(self, job: QueuedJob, borrowed: bool, in_reserve: bool) -> Admission:
        self.usage.add(job.team, job.gpus, job.instances)
        return Admission(job.job_id, borrowed, in_reserve)


def _victim_order(job: RunningJob) -> tuple[bool, int, float]:
    # Borrowers first, then the lowest class, then the newest.
    return (not job.borrowed, CLASS_RANK[job.priority], -job.admitted_at)


def _may_preempt(preemptor: QueuedJob, victim: RunningJob, now: float, policy: QueuePolicy) -> bool:
    if victim.draining or now - victim.admitted_at < policy.min_runtime_seconds:
        return False
    if victim.priority is Priority.CRITICAL:
        return False
    lower = CLASS_RANK[victim.priority] < CLASS_RANK[preemptor.priority]
    if preemptor.priority is Priority.CRITICAL:
        return lower
    if victim.team == preemptor.team:
        return lower
    return victim.borrowed


def _choose_victims(state: _Pass, job: QueuedJob) -> list[RunningJob] | None:
    """The smallest set of eligible running jobs whose release lets `job` in, or None."""
    candidates = sorted(
        (r for r in state.running.values() if _may_preempt(job, r, state.now, state.policy)),
        key=_victim_order,
    )

    def fits_without(victims: Sequence[RunningJob]) -> bool:
        """Would the job fit, within its entitlement, once these victims are gone? Only
        entitled (or critical) work preempts: a job that would borrow never takes from anyone."""
        for victim in victims:
            state.usage.add(victim.team, victim.gpus, victim.instances, sign=-1)
        reason, borrowed, _ = state.fit(job)
        for victim in victims:
            state.usage.add(victim.team, victim.gpus, victim.instances)
        return reason is None and (not borrowed or job.priority is Priority.CRITICAL)

    chosen: list[RunningJob] = []
    for candidate in candidates:
        chosen.append(candidate)
        if fits_without(chosen):
            break
    else:
        return None
    for victim in reversed(list(chosen)):  # prune what is not needed
        trial = [v for v in chosen if v is not victim]
        if fits_without(trial):
            chosen = trial
    return chosen


def decide(
    queued: Iterable[QueuedJob],
    running: Iterable[RunningJob],
    bookings: Iterable[Booking],
    now: float,
    policy: QueuePolicy,
    *,
    limit: int | None = None,
    team_spend_usd: Mapping[str, float] | None = None,
) -> Decision:
    """One admission pass: who is admitted, who is preempted for whom, why the rest wait.

    `limit` stops after that many queued jobs have been considered (the dispatcher reads the
    queue in pages, best first). `team_spend_usd` is each team's spend so far this month, for
    the teams that have a monthly budget.
    """
    spend = dict(team_spend_usd or {})
    state = _Pass(
        policy=policy,
        now=now,
        running={r.job_id: r for r in running},
        bookings=[b for b in bookings if b.active_at(now)],
    )
    for holder in state.running.values():
        state.usage.add(holder.team, holder.gpus, holder.instances)
    decision = Decision()
    window = policy.window_at(now)
    decision.reclaims = sorted(
        r.job_id
        for r in state.running.values()
        if r.in_reserve
        and not r.draining
        and r.priority is not Priority.CRITICAL
        and (window is None or r.priority not in window.reserve_open_to)
    )
    # Jobs that already have victims draining for them wait for those, and preempt no more.
    draining_for = {r.draining_for for r in state.running.values() if r.draining_for}
    ordered = admission_order(queued, now, policy)
    waiting_ids = {job.job_id for job in ordered}
    # A job whose victims were requeued is nominated: it gets the GPUs they freed before
    # anyone else, and they wait until it runs. Without this, an aged victim could take its
    # GPUs back and the preemption would repeat forever.
    # Only a preemptor that is not itself yielding is nominated: yielding never chains, so it
    # can never form a cycle in which everyone waits for someone else.
    yielding_ids = {j.job_id for j in ordered if j.preempted_for in waiting_ids}
    nominated = {
        j.preempted_for
        for j in ordered
        if j.preempted_for in waiting_ids and j.preempted_for not in yielding_ids
    }
    ordered = [j for j in ordered if j.job_id in nominated] + [
        j for j in ordered if j.job_id not in nominated
    ]
    # (team, class) -> the fewest GPUs a job of that kind could not find victims for: a later job
    # of the same kind that needs as many cannot either, so the search is skipped.
    no_victims: dict[tuple[str, Priority], int] = {}
    considered = 0
    for job in ordered:
        if limit is not None and considered >= limit:
            break
        considered += 1
        if job.preempted_for in nominated:
            decision.waiting[job.job_id] = WaitReason.YIELDING
            continue
        budget = policy.quota(job.team).monthly_budget_usd
        if budget is not None and spend.get(job.team, 0.0) + job.estimated_cost_usd > budget:
            decision.waiting[job.job_id] = WaitReason.BUDGET
            continue
        reason, borrowed, in_reserve = state.fit(job)
        if reason is None:
            decision.admitted.append(state.admit(job, borrowed, in_reserve))
            spend[job.team] = spend.get(job.team, 0.0) + job.estimated_cost_usd
            continue
        if job.job_id in draining_for:
            reason = WaitReason.PREEMPTING
        elif policy.preemption and reason in (
            WaitReason.QUOTA,
            WaitReason.CAPACITY,
            WaitReason.WINDOW,
        ):
            kind = (job.team, job.priority)
            victims = (
                None
                if job.gpus >= no_victims.get(kind, math.inf)
                else (_choose_victims(state, job))
            )
            if not victims:
                no_victims[kind] = min(job.gpus, no_victims.get(kind, job.gpus))
            if victims:
                for victim in victims:
                    decision.preemptions.append(Preemption(victim.job_id, job.job_id))
                    state.running[victim.job_id] = replace(victim, draining_for=job.job_id)
                draining_for.add(job.job_id)
                reason = WaitReason.PREEMPTING
        decision.waiting[job.job_id] = reason
    return decision
