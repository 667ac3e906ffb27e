"""Who runs next: admission order, team quotas, borrowing, the reserve, bookings, preemption.

Everything here is a pure function of a snapshot (queued jobs, running jobs, bookings, the
time) and the queue policy from `gpufleet.yaml`. The dispatcher Lambda, the emulator and the
simulator all call `decide`; the dispatcher then applies its decisions with conditional
DynamoDB transactions, so two dispatchers deciding at once can never admit a job twice or
exceed a quota.

Order. Jobs are ranked by effective priority: the class rank (critical 3, high 2, normal 1,
low 0) plus `aging_per_hour` for every hour waited, so any job eventually outranks newer work of
any class and nothing starves. Ties go to the earlier submission (FIFO within a class). Fair
share (`domain.fair_share`): within a class, the team with the fewest decayed GPU-hours per
share goes first; a class still ranks by the effective priority of its longest-waiting job.

Reservation. The first job a pass considers that waits for room holds a reservation: its
expected start, when enough of the jobs holding GPUs will have ended (each at its admission
plus its plan's expected run time). A later job that fits now is admitted only if it is
expected to end by then, leaves the reserved job fitting then (EASY backfill), or is of a
higher class, so no stream of smaller work of its class or below delays it; docs/queues.md
derives the bound on a job's wait.

Entitlement. A team may hold its quota (`gpus`) plus any booking active now, and may borrow up
to `borrow` GPUs more while other teams leave their quota idle (work above normal: any GPU
free now). Jobs admitted on borrowed
GPUs are the first to be reclaimed. A share of the global cap (`reserve_share`) is kept for
critical work, or for the classes a time window opens it to.

Windows. A daily time window active now may set its own GPU cap and team quotas (the
policy in force is `policy_at`), open the reserve to more classes, pause classes (their jobs
wait, `paused`) or drain them (paused, and their running jobs checkpoint and requeue:
`Decision.window_drains`). A job whose spec waits for a Capacity Block waits (`block`) until
the block's start (`QueuedJob.not_before`).

Reading. The waiting jobs of one team and class form a stream already in admission order; a
pass merges the streams lazily and stops reading one when its shapes show that nothing of it
could be admitted now or preempt (or after `LOOKAHEAD` of its jobs in a row wait), so jobs
that wait, however many, never hide a job of another team that fits.

Preemption. A waiting job may preempt running jobs only to run within its own entitlement (or
when it is critical), or in the place of its own team's lower-class work that frees at least
what it needs (`_swaps`: its team then holds no more than before), or (work above normal) on
GPUs lower-class borrowers hold beyond their team's quota (`_takes_borrowed`). Victims are
borrowers of other teams of its class or below (of its own class only once they have run
`reclaim_after_seconds`, and only what their team holds beyond its entitlement:
`_Pass.surplus`), or lower-class jobs of its own team (any team, for critical work); never
jobs younger than `min_runtime_seconds`, nor jobs stopped `max_preemptions_per_job` times
already. They are chosen borrowers first, then lowest class, then newest, and the set is
pruned to the smallest that frees enough. A job about to hold the reservation waits instead
when running jobs expected to end before its victims would have drained make room for it
(`room_before_drain`). Nominees (preemptors whose victims were stopped) go highest class
first. Because the preemptor runs entitled or in its own team's place, and its victims are of
a lower class or borrowers whose team stays at or over its quota without them, a victim can
never preempt its preemptor back: preemption cannot loop.
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime
from enum import StrEnum
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from gpufleet.domain.fair_share import standing
from gpufleet.domain.spec import DEFAULT_EXPECTED_SECONDS, NAME_PATTERN, Dependency, Priority
from gpufleet.errors import NotFound, RefusedInput

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
    share: float = Field(
        default=1.0,
        gt=0,
        description="Its weight in fair share: within a class, teams go in the order of their "
        "decayed GPU-hours divided by this",
    )
    monthly_budget_usd: float | None = Field(
        default=None, gt=0, description="Spend per calendar month (UTC) before jobs wait"
    )
    on_budget: Literal["notify", "checkpoint", "stop"] = Field(
        default="checkpoint",
        description="When the month's actual spend passes the budget, the team's running jobs "
        "are stopped after a checkpoint, stopped at once, or only reported",
    )


class QuotaOverride(BaseModel):
    """A team's quota while a time window is active: the fields given replace its own."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    gpus: int | None = Field(default=None, ge=0)
    borrow: int | None = Field(default=None, ge=0)


class TimeWindow(BaseModel):
    """A daily window (UTC) with its own rules while it is active: the reserve opens to more
    classes of work, the GPU cap and teams' quotas change, classes of work are paused (they
    wait) or drained (their running jobs checkpoint and requeue, and they wait)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    name: str = Field(pattern=f"^{NAME_PATTERN}$")
    start: str = Field(pattern=r"^([01]\d|2[0-3]):[0-5]\d$", description="HH:MM UTC")
    end: str = Field(pattern=r"^([01]\d|2[0-3]):[0-5]\d$", description="HH:MM UTC")
    reserve_open_to: list[Priority] = Field(default_factory=list)
    max_gpus: int | None = Field(
        default=None, ge=1, description="GPUs all jobs together may hold while it is active"
    )
    teams: dict[str, QuotaOverride] = Field(
        default_factory=dict, description="Quotas of named teams while it is active"
    )
    pause: list[Priority] = Field(
        default_factory=list, description="Classes not admitted while it is active"
    )
    drain: list[Priority] = Field(
        default_factory=list,
        description="Classes whose running jobs checkpoint and requeue while it is active "
        "(from its start), and which are not admitted meanwhile",
    )

    @model_validator(mode="after")
    def _critical_work_runs(self) -> TimeWindow:
        if Priority.CRITICAL in self.pause or Priority.CRITICAL in self.drain:
            raise ValueError("critical work is never paused or drained by a window")
        return self

    @property
    def held_back(self) -> frozenset[Priority]:
        """The classes it admits none of: paused or drained."""
        return frozenset((*self.pause, *self.drain))

    def _minutes(self, hhmm: str) -> int:
        hours, minutes = hhmm.split(":")
        return int(hours) * 60 + int(minutes)

    @property
    def edges(self) -> tuple[int, int]:
        """Its start and its end, in minutes of the UTC day."""
        return self._minutes(self.start), self._minutes(self.end)

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
    max_preemptions_per_job: int = Field(
        default=3,
        ge=0,
        description="times a job may be stopped to make room; after that it is no victim",
    )
    reclaim_after_seconds: int = Field(
        default=3600,
        ge=0,
        description="how long a job on GPUs borrowed from another team's quota runs before "
        "work of its own class may reclaim them (a higher class needs min_runtime_seconds)",
    )
    preemption_grace_seconds: int = Field(default=120, ge=0)
    fair_share: bool = Field(
        default=True,
        description="within a class, the team with the fewest decayed GPU-hours per share "
        "goes first (false: FIFO across teams)",
    )
    fair_share_half_life_hours: float = Field(
        default=24.0, gt=0, description="a GPU-hour used this long ago counts half"
    )
    teams: dict[str, TeamQuota] = Field(default_factory=dict)
    # Each team the config does not name gets this quota.
    default_team: TeamQuota = Field(default_factory=lambda: TeamQuota(gpus=16, borrow=0))
    windows: list[TimeWindow] = Field(default_factory=list, max_length=10)

    @model_validator(mode="after")
    def _quotas_fit(self) -> QueuePolicy:
        if self.reserve_gpus >= self.max_gpus:
            raise ValueError("the reserve leaves no GPUs for other work")
        for window in self.windows:
            unknown = sorted(set(window.teams) - set(self.teams))
            if unknown:
                raise ValueError(
                    f"window {window.name!r} sets the quota of teams not in queue.teams: "
                    f"{', '.join(unknown)}"
                )
            inside = self.in_window(window)
            if inside.reserve_gpus >= inside.max_gpus:
                raise ValueError(
                    f"window {window.name!r}: the reserve ({inside.reserve_gpus} GPUs) leaves "
                    f"none of its max_gpus {inside.max_gpus} for other work"
                )
        return self

    @property
    def reserve_gpus(self) -> int:
        return math.ceil(self.reserve_share * self.max_gpus)

    def quota(self, team: str) -> TeamQuota:
        return self.teams.get(team, self.default_team)

    @property
    def fair_share_half_life_seconds(self) -> float:
        return self.fair_share_half_life_hours * 3600

    def window_at(self, epoch_seconds: float) -> TimeWindow | None:
        """The window whose rules hold now: the first listed that is active."""
        return next((w for w in self.windows if w.active_at(epoch_seconds)), None)

    def in_window(self, window: TimeWindow | None) -> QueuePolicy:
        """The policy with the window's cap and team quotas in place of its own (itself
        without a window, or one that changes neither)."""
        if window is None or (window.max_gpus is None and not window.teams):
            return self
        teams = {
            team: quota.model_copy(update=window.teams[team].model_dump(exclude_none=True))
            if team in window.teams
            else quota
            for team, quota in self.teams.items()
        }
        return self.model_copy(
            update={"max_gpus": window.max_gpus or self.max_gpus, "teams": teams}
        )


def next_window_change(policy: QueuePolicy, now: float) -> float | None:
    """The first moment after `now` at which a time window starts or ends (None: the policy
    has none): where a runtime that passes only on events must pass once more."""
    day = now // 86_400 * 86_400
    moments = [
        day + offset + minute * 60
        for w in policy.windows
        if w.start != w.end
        for minute in w.edges
        for offset in (0, 86_400)
    ]
    return min((m for m in moments if m > now), default=None)


def policy_at(policy: QueuePolicy, now: float) -> QueuePolicy:
    """The queue policy in force at `now`: the configured one, with the cap and the team
    quotas of the time window active then (`QueuePolicy.window_at`). Every admission pass,
    the limits its writes are conditioned on and the never-admissible check go through it, in
    the Lambdas, the embedded account and the simulator alike. The window's other rules (the
    reserve's classes, paused and drained classes) are read from `window_at` by the pass."""
    return policy.in_window(policy.window_at(now))


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
    # Of its run, from its launch plan (`domain.duration.estimate_duration`): how long the
    # GPUs it is admitted to stay taken, for the reservation of the job ahead of it.
    expected_seconds: float = DEFAULT_EXPECTED_SECONDS
    # The jobs (ids) it waits for: the dispatcher hands the queue only those whose
    # `arrays.dependency_verdict` says run.
    depends_on: tuple[Dependency, ...] = ()
    # Not admitted before: the start of the Capacity Block it waits for (its plan's
    # `block_start`, spec `wait_for_block`).
    not_before: float | None = None
    # A child of an array: its index, by which an element-by-element dependency is judged.
    array_index: int | None = None


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
    preemptions: int = 0  # times it was stopped to make room before this run
    expected_end: float | None = None  # admission + its expected run time (None: unknown)

    @property
    def draining(self) -> bool:
        return self.draining_for is not None

    def ends_by(self, now: float, policy: QueuePolicy) -> float:
        """When its GPUs are expected back: a draining job's after the grace, a job past its
        expected end's now, a job of unknown duration's after the default estimate."""
        if self.draining:
            return now + policy.preemption_grace_seconds
        end = self.expected_end
        return max(now, self.admitted_at + DEFAULT_EXPECTED_SECONDS if end is None else end)


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


class BookingRefused(RefusedInput, ValueError):
    """A booking the fleet could never honour: nothing is booked. The message says why, with
    the numbers."""


class BookingNotFound(NotFound):
    """No booking by that id: cancelled already, or expired with its window."""

    def __init__(self, booking_id: str) -> None:
        super().__init__(f"booking {booking_id} does not exist (cancelled, or its window ended)")
        self.booking_id = booking_id


def check_booking(
    booking: Booking, booked: Iterable[Booking], now: float, policy: QueuePolicy
) -> None:
    """Raise BookingRefused for a booking of no GPUs, over an empty or inverted window or one
    that has ended, for a team the config does not name, or of more GPUs than the fleet can
    hold for bookings (its cap outside the reserve, which is for urgent work; the smallest
    such cap, where a time window lowers `max_gpus`) at some moment of the window, with the
    bookings already made. A window that has begun holds from now."""
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
    smallest = min(
        (policy, *(policy.in_window(w) for w in policy.windows)),
        key=lambda p: p.max_gpus - p.reserve_gpus,
    )
    bookable = smallest.max_gpus - smallest.reserve_gpus
    if booking.gpus > bookable:
        raise BookingRefused(
            f"{booking.gpus} GPUs can never be held: the fleet holds {bookable} GPUs outside "
            f"the reserve (max_gpus {smallest.max_gpus}, reserve {smallest.reserve_gpus})"
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
    PAUSED = "paused"  # a time window active now pauses (or drains) its class
    BLOCK = "block"  # it waits for a Capacity Block that starts later (spec wait_for_block)
    BOOKING = "booking"  # what is left is booked by other teams
    BUDGET = "budget"  # the team's spend this month plus this job's estimate exceeds its budget
    PREEMPTING = "preempting"  # lower-priority jobs are checkpointing to make room
    YIELDING = "yielding"  # it was preempted; the job it made room for goes first
    # A page of jobs of its team and class ahead of it wait: the pass looks no further.
    BEHIND = "behind"
    # It fits now, but would still hold GPUs when the job ahead holding the reservation is
    # expected to start, where that job needs them.
    RESERVED = "reserved"


@dataclass(frozen=True, slots=True)
class Admission:
    job_id: str
    borrowed: bool
    in_reserve: bool


@dataclass(frozen=True, slots=True)
class AdmissionLimits:
    """What the write of an admission is conditioned on (`admission_limits`), so that
    concurrent dispatchers can never exceed a cap or a quota between reading and writing."""

    max_gpus: int
    max_instances: int
    team_gpus: int | None  # None: not bound by the team quota (the shared reserve)


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
    # Running jobs of a class the active time window drains: they checkpoint and requeue.
    window_drains: list[str] = field(default_factory=list)
    # Streams (team, class) the pass stopped reading, and why: none of their jobs it did not
    # consider could have been admitted or have preempted (or, `behind`, a page of them waited).
    blocked_streams: dict[tuple[str, Priority], WaitReason] = field(default_factory=dict)
    nominated: set[str] = field(default_factory=set)  # considered first; their victims yield
    reservation: Reservation | None = None  # the job ahead that holds one, and when it starts


@dataclass(frozen=True, slots=True)
class Reservation:
    """The first job of a pass that waits for room (a cap, its quota, the reserve, a booking)
    holds the room it is expected to get at `start`: when enough of the jobs holding GPUs
    have ended, each at its expected end."""

    job_id: str
    start: float


def effective_priority(job: QueuedJob, now: float, policy: QueuePolicy) -> float:
    waited_hours = max(0.0, now - job.enqueued_at) / 3600
    return CLASS_RANK[job.priority] + policy.aging_per_hour * waited_hours


def admission_order(
    queued: Iterable[QueuedJob],
    now: float,
    policy: QueuePolicy,
    team_usage: Mapping[str, float] | None = None,
) -> list[QueuedJob]:
    """The jobs in the order a pass considers them (`_Heads`): by effective priority, then
    submission, and within a class by fair share when `team_usage` is given."""
    heads = _Heads(now, policy, _standings(team_usage, policy))
    jobs = list(queued)
    for job in jobs:
        heads.push(job, 0)
    return [heads.pop()[1] for _ in jobs]


# How many waiting jobs of one team and class in a row a pass considers without admitting one
# before it reads no further in that stream: a backlog can hold back only its own team's work
# of its class, never another team's.
LOOKAHEAD = 25

Shape = tuple[int, int]  # what a waiting job asks for: (GPUs, instances)


@dataclass(frozen=True)
class Stream:
    """The waiting jobs of one team and one class, in admission order: waiting raises every
    job of a class alike, so within a class the order is FIFO. `shapes` are the (GPUs,
    instances) its jobs ask for, as the queue's counters know them: from them alone a pass
    judges whether the stream could admit or preempt anything, before it reads a job of it
    (none known: the stream is read)."""

    team: str
    priority: Priority
    shapes: frozenset[Shape]
    jobs: Iterable[QueuedJob]  # read lazily, in order


@dataclass(frozen=True)
class WaitingJobs:
    """What a pass reads: the streams, and the nominated jobs (preemptors whose victims may be
    back in the queue: they are considered first, and their victims wait for them)."""

    streams: Sequence[Stream]
    nominated: Sequence[QueuedJob] = ()

    @classmethod
    def of(cls, jobs: Iterable[QueuedJob]) -> WaitingJobs:
        """Waiting jobs at hand, all of them: their streams, and as nominated the jobs that a
        waiting job was preempted for."""
        everyone = list(jobs)
        return cls(streams_of(everyone), nominees_of(everyone))


def streams_of(jobs: Iterable[QueuedJob]) -> list[Stream]:
    by_stream: dict[tuple[str, Priority], list[QueuedJob]] = {}
    for job in jobs:
        by_stream.setdefault((job.team, job.priority), []).append(job)
    return [
        Stream(
            team,
            priority,
            frozenset((j.gpus, j.instances) for j in members),
            sorted(members, key=lambda j: (j.enqueued_at, j.job_id)),
        )
        for (team, priority), members in sorted(by_stream.items(), key=lambda item: item[0])
    ]


def nominees_of(jobs: Iterable[QueuedJob]) -> list[QueuedJob]:
    """The waiting jobs that a waiting job was preempted for."""
    everyone = list(jobs)
    preemptors = {j.preempted_for for j in everyone if j.preempted_for}
    return [j for j in everyone if j.job_id in preemptors]


def _standings(usage: Mapping[str, float] | None, policy: QueuePolicy) -> dict[str, float]:
    """Each team's fair-share standing (none with fair share off: FIFO across teams)."""
    if not policy.fair_share or not usage:
        return {}
    return {team: standing(used, policy.quota(team).share) for team, used in usage.items()}


class _Heads:
    """The next job of each stream a pass reads, taken in admission order. Classes go by the
    effective priority of their longest-waiting head (aging lifts a class as before); within
    the class chosen, the team of the lowest fair-share standing goes first, then FIFO. With
    equal standings (no usage yet, or fair share off) that is effective priority, then the
    earlier submission, job by job: the order without fair share.

    A class chosen ahead of a higher class's work only by aging gives its longest-waiting
    job, not its fair-share pick: the lift is that job's own, earned by its wait, and a fresh
    job of another team must not ride on it past more urgent work."""

    def __init__(self, now: float, policy: QueuePolicy, standings: Mapping[str, float]) -> None:
        self._now, self._policy, self._standings = now, policy, standings
        self._in_class: dict[Priority, list[tuple[float, float, str, int, QueuedJob]]] = {}
        self._oldest: dict[Priority, list[tuple[float, str, int, QueuedJob]]] = {}
        # Popped from one heap and not yet dropped from the other (lazily, at its top).
        self._taken: set[str] = set()
        self._size = 0

    def __bool__(self) -> bool:
        return self._size > 0

    def push(self, job: QueuedJob, stream: int) -> None:
        standing = self._standings.get(job.team, 0.0)
        entry = (standing, job.enqueued_at, job.job_id, stream, job)
        heapq.heappush(self._in_class.setdefault(job.priority, []), entry)
        heapq.heappush(
            self._oldest.setdefault(job.priority, []), (job.enqueued_at, job.job_id, stream, job)
        )
        self._size += 1

    def pop(self) -> tuple[int, QueuedJob]:
        """The next job and the index of its stream."""
        best: tuple[float, float, str] | None = None
        chosen = Priority.LOW
        top_rank = -1  # the highest class with a job waiting
        for priority, oldest in self._oldest.items():
            while oldest and oldest[0][1] in self._taken:
                self._taken.discard(heapq.heappop(oldest)[1])
            if oldest:
                enqueued_at, job_id, _, job = oldest[0]
                top_rank = max(top_rank, CLASS_RANK[priority])
                key = (-effective_priority(job, self._now, self._policy), enqueued_at, job_id)
                if best is None or key < best:
                    best, chosen = key, priority
        self._size -= 1
        if CLASS_RANK[chosen] < top_rank:
            _, _, stream, job = heapq.heappop(self._oldest[chosen])
        else:
            in_class = self._in_class[chosen]
            while in_class[0][2] in self._taken:
                self._taken.discard(heapq.heappop(in_class)[2])
            *_, stream, job = heapq.heappop(in_class)
        self._taken.add(job.job_id)
        return stream, job


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

    def copy(self) -> _Usage:
        return _Usage(self.gpus, self.instances, dict(self.team_gpus))


@dataclass
class _Running:
    """The running jobs as a pass starts from them: by id, what they hold together (`usage`),
    those the active window drains and those that must leave a reserve closed to their class
    (ids, sorted), and the jobs victims drain for. Read in one loop: a pass starts with every
    running job, and passes are many."""

    by_id: dict[str, RunningJob]
    usage: _Usage
    window_drains: list[str]
    reclaims: list[str]
    draining_for: set[str]

    @classmethod
    def read(
        cls,
        running: Iterable[RunningJob],
        drained: frozenset[Priority],
        reserve_open_to: frozenset[Priority],
    ) -> _Running:
        by_id: dict[str, RunningJob] = {}
        gpus = instances = 0
        team_gpus: dict[str, int] = {}
        window_drains: list[str] = []
        reclaims: list[str] = []
        draining_for: set[str] = set()
        for r in running:
            by_id[r.job_id] = r
            gpus += r.gpus
            instances += r.instances
            team_gpus[r.team] = team_gpus.get(r.team, 0) + r.gpus
            if r.draining_for is not None:  # draining already: neither drained nor reclaimed
                if r.draining_for:
                    draining_for.add(r.draining_for)
            elif r.priority in drained:
                window_drains.append(r.job_id)
            elif r.in_reserve and r.priority not in reserve_open_to:
                reclaims.append(r.job_id)
        usage = _Usage(gpus, instances, team_gpus)
        return cls(by_id, usage, sorted(window_drains), sorted(reclaims), draining_for)


@dataclass
class _Pass:
    policy: QueuePolicy
    now: float
    running: dict[str, RunningJob]
    booked: dict[str, int]  # GPUs each team has booked now
    reserve_open_to: frozenset[Priority]  # the classes that may use the reserve now
    spend: dict[str, float]  # this month, of the teams with a budget (admissions included)
    held_back: frozenset[Priority] = frozenset()  # classes the active window pauses or drains
    usage: _Usage = field(default_factory=_Usage)
    changes: int = 0  # admissions and preemptions made so far in the pass
    # (team, class) -> shapes no job of that kind could find victims for (`preemptable_for`):
    # a later job of the kind at least as large finds none either (the pass only makes it
    # harder).
    no_victims: dict[tuple[str, Priority], list[Shape]] = field(default_factory=dict)
    admitted: list[QueuedJob] = field(default_factory=list)  # in this pass
    reservation: Reservation | None = None
    reservation_job: QueuedJob | None = None
    # What will be held at the reservation's start: the usage, less the jobs expected to have
    # ended by then, plus the jobs admitted since that will still run.
    at_reservation: _Usage | None = None
    reservation_tried: bool = False  # only the first job that waits for room may hold one
    # Caches of what stays fixed until the pass preempts (`drain`): the running jobs any job
    # may preempt, in victim order, and per (team, class) those a job of it may, with the
    # GPUs and instances they hold per team.
    _victims: list[RunningJob] | None = None
    _candidates: dict[tuple[str, Priority], tuple[list[RunningJob], _Held]] = field(
        default_factory=dict
    )
    _entitlements: dict[str, int] = field(default_factory=dict)  # fixed for the pass
    _surplus: dict[str, int] | None = None  # `surplus` per team, until the pass preempts
    _named_entitlements: dict[str, int] | None = None  # of the teams the policy names

    def surplus(self, team: str) -> int:
        """The GPUs the team's running jobs that are not draining hold beyond its entitlement:
        what a reclaim may take from it. A borrower's mark stays with it after its team's
        other jobs end; once its team is back within its quota it holds its own quota, and
        reclaiming it would only make its team reclaim from someone else in turn."""
        surplus = self._surplus
        if surplus is None:
            held: dict[str, int] = {}
            for r in self.running.values():
                if not r.draining:
                    held[r.team] = held.get(r.team, 0) + r.gpus
            surplus = self._surplus = {t: gpus - self.entitlement(t) for t, gpus in held.items()}
        return surplus.get(team, 0)

    def entitlement(self, team: str) -> int:
        known = self._entitlements.get(team)
        if known is None:
            known = self._entitlements[team] = entitlement(team, self.booked, self.policy)
        return known

    def idle_quota_of_others(self, team: str) -> int:
        named = self._named_entitlements
        if named is None:  # asked often (every job that would borrow): gathered once
            named = self._named_entitlements = {t: self.entitlement(t) for t in self.policy.teams}
        used = self.usage.team_gpus
        return sum(max(0, gpus - used.get(t, 0)) for t, gpus in named.items() if t != team)

    def held_for_other_bookings(self, team: str) -> int:
        """Booked GPUs other teams have not used yet: nobody else may take them."""
        held = 0
        for other, booked in sorted(self.booked.items()):
            if other != team:
                unused = self.entitlement(other) - self.usage.team_gpus.get(other, 0)
                held += max(0, min(booked, unused))
        return held

    def over_budget(self, job: QueuedJob) -> bool:
        budget = self.policy.quota(job.team).monthly_budget_usd
        return (
            budget is not None and self.spend.get(job.team, 0.0) + job.estimated_cost_usd > budget
        )

    def fit(self, job: QueuedJob, *, borrow: bool = True) -> tuple[WaitReason | None, bool, bool]:
        """Why the job cannot be admitted now (None if it can), and whether it would borrow
        and whether it would sit in the reserve (`borrow` False: on a route that does not
        borrow). Never easier for a larger job (more GPUs or instances) than for a smaller one
        of the same team and class, both never preempted, or both asked not to borrow."""
        policy, usage = self.policy, self.usage
        reserve_open = job.priority in self.reserve_open_to
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
        may_borrow = borrow and (job.preemptions == 0 or job.gpus > self.entitlement(job.team))
        if (
            may_borrow
            and over <= policy.quota(job.team).borrow
            and (_borrows_any_free_gpu(job.priority) or over <= self.idle_quota_of_others(job.team))
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
        self.spend[job.team] = self.spend.get(job.team, 0.0) + job.estimated_cost_usd
        self.changes += 1
        self.admitted.append(job)
        if self.at_reservation is not None and not self._ends_before_reservation(job):
            self.at_reservation.add(job.team, job.gpus, job.instances)
        return Admission(job.job_id, borrowed, in_reserve)

    def _ends_before_reservation(self, job: QueuedJob) -> bool:
        return self.reservation is not None and (
            self.now + job.expected_seconds <= self.reservation.start
        )

    def _fits_on(self, job: QueuedJob, usage: _Usage) -> bool:
        """Would `job` fit (as `fit` judges it) were `usage` held?"""
        held, self.usage = self.usage, usage
        try:
            return self.fit(job)[0] is None
        finally:
            self.usage = held

    def reserve(self, job: QueuedJob) -> Reservation | None:
        """The room `job` is expected to get: the earliest expected end of the jobs holding
        GPUs (running, or admitted in this pass) once which it fits, were nothing else
        admitted. None when it would not fit even once all of them ended (a booking of
        another team holds the room: no end of a job frees it)."""
        ends = sorted(
            [
                (r.ends_by(self.now, self.policy), r.team, r.gpus, r.instances)
                for r in self.running.values()
            ]
            + [(self.now + a.expected_seconds, a.team, a.gpus, a.instances) for a in self.admitted]
        )
        left = self.usage.copy()
        cap_gpus, cap_instances = self.policy.max_gpus, self.policy.max_instances
        for end, team, gpus, instances in ends:
            left.add(team, gpus, instances, sign=-1)
            # Under the caps first (cheap, and `fit` requires it), then the whole rule.
            under_caps = (
                left.gpus + job.gpus <= cap_gpus and left.instances + job.instances <= cap_instances
            )
            if under_caps and self._fits_on(job, left):
                self.reservation = Reservation(job.job_id, end)
                self.reservation_job, self.at_reservation = job, left
                return self.reservation
        return None

    def room_before_drain(self, job: QueuedJob) -> bool:
        """Would `job` fit once the running jobs expected to end before victims preempted now
        would have drained (`preemption_grace_seconds`) have ended? Then preempting gains it
        nothing and costs the victims a restart: it waits for those ends instead. A job past
        its expected end, or of unknown duration, does not count (when it ends is unknown),
        so an estimate that was wrong delays a preemption by one pass, never more. Only a job
        about to hold the reservation waits so (`decide_streams`): no other work may then take
        the room those ends free."""
        horizon = self.now + self.policy.preemption_grace_seconds
        left = self.usage.copy()
        ending = 0
        for r in self.running.values():
            end = r.expected_end
            if not r.draining and end is not None and self.now < end <= horizon:
                left.add(r.team, r.gpus, r.instances, sign=-1)
                ending += 1
        return ending > 0 and self._fits_on(job, left)

    def delays_reservation(self, job: QueuedJob) -> bool:
        """Would admitting `job` (which fits now) delay the reserved job's expected start in a
        way the reservation forbids? Not if it is expected to end by then, nor if the reserved
        job still fits then with it held, nor if it is of a higher class."""
        reserved, later = self.reservation_job, self.at_reservation
        if reserved is None or later is None or self._ends_before_reservation(job):
            return False
        if CLASS_RANK[job.priority] > CLASS_RANK[reserved.priority]:
            # A higher class is not held back by a lower one's reservation, even one aging
            # ranks ahead of it: priority means that it starts within minutes.
            return False
        later.add(job.team, job.gpus, job.instances)
        fits = self._fits_on(reserved, later)
        later.add(job.team, job.gpus, job.instances, sign=-1)
        return not fits

    def stream_blocked(self, stream: Stream) -> WaitReason | None:
        """Why no job of the stream could be admitted now or preempt for room (None when one
        might), from its shapes alone. Exact: a job is never easier to admit than a job of
        its shape that was never preempted and costs nothing, nor finds victims where
        `preemptable_for` says no job of its shape could; and as a pass admits and preempts,
        what is left only gets harder."""
        if stream.priority in self.held_back:
            return WaitReason.PAUSED
        budget = self.policy.quota(stream.team).monthly_budget_usd
        if budget is not None and self.spend.get(stream.team, 0.0) > budget:
            return WaitReason.BUDGET
        reasons = []
        for gpus, instances in _smallest(stream.shapes):
            probe = QueuedJob("", stream.team, stream.priority, gpus, instances, self.now)
            reason, _, _ = self.fit(probe)
            if reason is None:
                return None
            if self.policy.preemption and self.preemptable_for(probe) is not None:
                return None
            reasons.append(reason)
        return reasons[0] if reasons else None

    def drain(self, victim: RunningJob, for_job_id: str) -> None:
        """The pass preempts `victim` for that job: it drains, and is nobody's victim now."""
        self.running[victim.job_id] = replace(victim, draining_for=for_job_id)
        self._victims = None
        self._surplus = None
        self._candidates.clear()

    def candidates_for(self, job: QueuedJob) -> tuple[list[RunningJob], _Held]:
        """The running jobs a job of `job`'s team and class may preempt (`_preemptible` and
        `_may_take`), in the order they are chosen (`_victim_order`), and what they hold."""
        kind = (job.team, job.priority)
        known = self._candidates.get(kind)
        if known is None:
            if self._victims is None:
                # The victim's own conditions are the preemptor's too: judged once, and sorted
                # once (a stable sort: filtering the sorted list keeps the order sorting the
                # filtered one gives).
                self._victims = sorted(
                    (r for r in self.running.values() if _preemptible(r, self.now, self.policy)),
                    key=_victim_order,
                )
            chosen = [
                r
                for r in self._victims
                if _may_take(job, r, self.now, self.policy)
                and (not _reclaims_quota(job, r) or r.gpus <= self.surplus(r.team))
            ]
            known = self._candidates[kind] = (chosen, _Held.of(chosen))
        return known

    def preemptable_for(self, job: QueuedJob) -> list[RunningJob] | None:
        """The running jobs `job` may preempt, in the order they are chosen; None when no job
        of its team and class, as large or larger, preempted before or not, could find
        victims among them now or later in the pass.

        Whether a job may preempt hangs on the route it would run on, not only on its size:
        one never preempted that would borrow takes from nobody, while one preempted before,
        which may not borrow, takes the same room in the reserve and so may preempt (as may a
        larger one that could not borrow enough). The bound is therefore the route-free one:
        would the job fit without borrowing, or any way a job never preempted may preempt
        for (critical work, a swap with its own team's work), once every running job it may
        preempt is gone? That is never false where some set of victims lets a job of the
        shape in, and larger jobs only fit less."""
        kind = (job.team, job.priority)
        found_none = self.no_victims.setdefault(kind, [])
        if any(job.gpus >= gpus and job.instances >= n for gpus, n in found_none):
            return None
        candidates, held = self.candidates_for(job)
        # Either route: without borrowing, or (a job never preempted) borrowing as critical
        # work, a swap with its own team's work or urgent work on borrowed GPUs may.
        probe = replace(job, preemptions=0)
        if _fits_without(self, probe, held, borrow=False) or _fits_without(
            self, probe, held, exact=False
        ):
            return candidates
        found_none.append((job.gpus, job.instances))
        return None

    def victims_for(self, job: QueuedJob) -> list[RunningJob] | None:
        """`_choose_victims`, skipped where `preemptable_for` says none can be found."""
        candidates = self.preemptable_for(job)
        return None if candidates is None else _choose_victims(self, job, candidates)


# The reasons of a job that waits for room the jobs holding GPUs will give back when they end.
_NEEDS_ROOM = frozenset(
    {WaitReason.QUOTA, WaitReason.CAPACITY, WaitReason.WINDOW, WaitReason.BOOKING}
)


def entitlement(team: str, booked: Mapping[str, int], policy: QueuePolicy) -> int:
    """The GPUs a team may hold without borrowing: its quota and its bookings active now
    (`booked`, GPUs per team)."""
    return policy.quota(team).gpus + booked.get(team, 0)


def _smallest(shapes: Iterable[Shape]) -> list[Shape]:
    """The shapes no other shape is smaller than in both GPUs and instances: if a job of each
    of those cannot be admitted, no job of the others can."""
    smallest: list[Shape] = []
    for gpus, instances in sorted(set(shapes)):
        if not smallest or instances < smallest[-1][1]:
            smallest.append((gpus, instances))
    return smallest


def _victim_order(job: RunningJob) -> tuple[bool, int, float]:
    # Borrowers first, then the lowest class, then the newest.
    return (not job.borrowed, CLASS_RANK[job.priority], -job.admitted_at)


def _borrows_any_free_gpu(priority: Priority) -> bool:
    """Work above normal may borrow any GPU free now (within its team's `borrow`), not only
    quota the other teams leave idle: priority means it starts within minutes, and no lower
    class takes it back (`_may_take`), so the owners of that quota wait for its end."""
    return CLASS_RANK[priority] > CLASS_RANK[Priority.NORMAL]


# Whether a waiting job may preempt a running one: `_preemptible(victim)` and `_may_take`
# (split so that a pass judges the victim's own part once for every preemptor).


def _preemptible(victim: RunningJob, now: float, policy: QueuePolicy) -> bool:
    """The victim's part of the rule: whether any job at all may preempt it now."""
    if victim.draining or now - victim.admitted_at < policy.min_runtime_seconds:
        return False
    if victim.preemptions >= policy.max_preemptions_per_job:
        return False  # stopped often enough: it runs to its end
    return victim.priority is not Priority.CRITICAL


def _may_take(preemptor: QueuedJob, victim: RunningJob, now: float, policy: QueuePolicy) -> bool:
    """The preemptor's part of the rule, for a victim `_preemptible` allows: whether this job
    may preempt it."""
    lower = CLASS_RANK[victim.priority] < CLASS_RANK[preemptor.priority]
    if preemptor.priority is Priority.CRITICAL:
        return lower
    if victim.team == preemptor.team:
        return lower
    if not victim.borrowed or CLASS_RANK[victim.priority] > CLASS_RANK[preemptor.priority]:
        return False  # only borrowed GPUs are reclaimed, and never from more urgent work
    # Reclaiming quota from work of the same class trades one job for another: the borrower
    # first runs `reclaim_after_seconds`, so that most borrowers end on their own instead.
    return lower or now - victim.admitted_at >= policy.reclaim_after_seconds


def _reclaims_quota(preemptor: QueuedJob, victim: RunningJob) -> bool:
    """Does taking `victim` reclaim quota from another team's work of the preemptor's own
    class? That trades one job for another of equal rank, so it may take only what the
    victim's team holds beyond its entitlement (`_Pass.surplus`)."""
    return victim.team != preemptor.team and victim.priority is preemptor.priority


@dataclass
class _Held:
    """What a set of running jobs holds: GPUs and instances, and GPUs per team."""

    gpus: int = 0
    instances: int = 0
    team_gpus: dict[str, int] = field(default_factory=dict)

    @classmethod
    def of(cls, jobs: Iterable[RunningJob]) -> _Held:
        held = cls()
        for job in jobs:
            held.add(job)
        return held

    def add(self, job: RunningJob, sign: int = 1) -> None:
        self.gpus += sign * job.gpus
        self.instances += sign * job.instances
        self.team_gpus[job.team] = self.team_gpus.get(job.team, 0) + sign * job.gpus


def _fits_without(
    state: _Pass, job: QueuedJob, victims: _Held, *, borrow: bool = True, exact: bool = True
) -> bool:
    """Would the job fit, within its entitlement, once the victims holding `victims` are gone
    (`borrow` False: on a route that does not borrow)? Only entitled (or critical) work
    preempts, or work that takes the place of its own team's lower-class work (`_swaps`), or
    urgent work taking only borrowed GPUs (`_takes_borrowed`): no other job that would borrow
    ever takes from anyone."""
    usage = state.usage
    usage.gpus -= victims.gpus
    usage.instances -= victims.instances
    for team, gpus in victims.team_gpus.items():
        usage.team_gpus[team] = usage.team_gpus.get(team, 0) - gpus
    try:
        reason, borrowed, _ = state.fit(job, borrow=borrow)
    finally:
        usage.gpus += victims.gpus
        usage.instances += victims.instances
        for team, gpus in victims.team_gpus.items():
            usage.team_gpus[team] += gpus
    return reason is None and (
        not borrowed
        or job.priority is Priority.CRITICAL
        or _swaps(job, victims)
        or _takes_borrowed(state, job, victims, exact=exact)
    )


def _takes_borrowed(state: _Pass, job: QueuedJob, victims: _Held, *, exact: bool) -> bool:
    """May work above normal, which borrows any GPU free now (`_borrows_any_free_gpu`), run
    borrowed on what its victims free? Only when they free at least what it needs and every
    other team's victims hold no more than that team holds beyond its entitlement (`surplus`):
    borrowed GPUs then pass from lower-class borrowers (`_may_take`) to more urgent work, and
    no team's own quota is taken. Without this a 4- or 8-GPU high job of a team whose quota is
    1 or 2 GPUs could never preempt, and waited hours for that many GPUs to free at once (Philly
    day 60 at a third of the peak). `exact` False: the surplus is not judged (a bound that
    holds for every subset of the victims, `preemptable_for`)."""
    if not _borrows_any_free_gpu(job.priority) or victims.gpus < job.gpus:
        return False
    return not exact or all(
        gpus <= state.surplus(team) for team, gpus in victims.team_gpus.items() if team != job.team
    )


def _swaps(job: QueuedJob, victims: _Held) -> bool:
    """Does `job` take the place of its own team's victims (lower-class work, `_may_take`),
    freeing at least the GPUs it needs? Then its team holds no more than it holds now and no
    other team's quota is touched, so it may run where they ran, borrowed GPUs included.
    Without this a team over its quota could preempt for its urgent work only down to its
    entitlement: on Philly day 30 at half the peak one 1-GPU high job stopped 178 of its
    team's normal jobs (36% of the day's preemptions) to bring its team back under quota."""
    return victims.team_gpus.get(job.team, 0) >= job.gpus


def _choose_victims(
    state: _Pass, job: QueuedJob, candidates: Sequence[RunningJob]
) -> list[RunningJob] | None:
    """The smallest set of the candidates (in their order) whose release lets `job` in, or
    None."""
    chosen: list[RunningJob] = []
    held = _Held()
    reclaimed: dict[str, int] = {}  # GPUs taken from each team's surplus (`_reclaims_quota`)
    for candidate in candidates:
        if _reclaims_quota(job, candidate):
            taken = reclaimed.get(candidate.team, 0) + candidate.gpus
            if taken > state.surplus(candidate.team):
                continue
            reclaimed[candidate.team] = taken
        chosen.append(candidate)
        held.add(candidate)
        if _fits_without(state, job, held):
            break
    else:
        return None
    for victim in reversed(list(chosen)):  # prune what is not needed
        held.add(victim, sign=-1)
        if _fits_without(state, job, held):
            chosen = [v for v in chosen if v is not victim]
        else:
            held.add(victim)
    return chosen


def _booked_at(bookings: Iterable[Booking], now: float) -> dict[str, int]:
    booked: dict[str, int] = {}
    for booking in bookings:
        if booking.active_at(now):
            booked[booking.team] = booked.get(booking.team, 0) + booking.gpus
    return booked


def _reserve_open_at(policy: QueuePolicy, now: float) -> frozenset[Priority]:
    window = policy.window_at(now)
    return frozenset({Priority.CRITICAL, *(window.reserve_open_to if window else ())})


def decide(
    queued: Iterable[QueuedJob],
    running: Iterable[RunningJob],
    bookings: Iterable[Booking],
    now: float,
    policy: QueuePolicy,
    *,
    lookahead: int | None = LOOKAHEAD,
    team_spend_usd: Mapping[str, float] | None = None,
    team_usage: Mapping[str, float] | None = None,
) -> Decision:
    """`decide_streams` over waiting jobs at hand; a job of a stream the pass stopped reading
    waits for the reason it stopped."""
    jobs = list(queued)
    decision = decide_streams(
        WaitingJobs.of(jobs),
        running,
        bookings,
        now,
        policy,
        lookahead=lookahead,
        team_spend_usd=team_spend_usd,
        team_usage=team_usage,
    )
    admitted = {a.job_id for a in decision.admitted}
    for job in jobs:
        if job.job_id in admitted or job.job_id in decision.waiting:
            continue
        decision.waiting[job.job_id] = (
            WaitReason.YIELDING
            if job.preempted_for in decision.nominated
            else decision.blocked_streams[(job.team, job.priority)]
        )
    return decision


def decide_streams(
    waiting: WaitingJobs,
    running: Iterable[RunningJob],
    bookings: Iterable[Booking],
    now: float,
    policy: QueuePolicy,
    *,
    lookahead: int | None = LOOKAHEAD,
    team_spend_usd: Mapping[str, float] | None = None,
    team_usage: Mapping[str, float] | None = None,
) -> Decision:
    """One admission pass: who is admitted, who is preempted for whom, why the rest wait.

    Nominated jobs come first; then the streams are merged in admission order (`_Heads`:
    within a class, teams by fair share), each read only as far as the pass needs. A stream
    is read no further once its shapes show that none of its jobs could be admitted or
    preempt (over a cap, its team's quota, its team's budget), nor after `lookahead` of its
    jobs in a row waited (None: no such bound). Waiting jobs, however many, thus hold back
    only later work of their own team and class: a job of another team that fits is admitted
    in the same pass. Jobs of a stream the pass stopped reading have no entry in `waiting`;
    `blocked_streams` says why. `team_spend_usd` is each
    team's spend so far this month, for the teams that have a monthly budget; `team_usage`
    each team's decayed GPU-hours now (`fair_share.usage_at`; a team left out has none).
    """
    window = policy.window_at(now)  # its paused and drained classes, below
    policy = policy_at(policy, now)
    held_back = window.held_back if window else frozenset()
    reserve_open_to = _reserve_open_at(policy, now)
    drained = frozenset(window.drain) if window else frozenset()
    started = _Running.read(running, drained, reserve_open_to)
    state = _Pass(
        policy=policy,
        now=now,
        running=started.by_id,
        booked=_booked_at(bookings, now),
        reserve_open_to=reserve_open_to,
        spend=dict(team_spend_usd or {}),
        held_back=held_back,
        usage=started.usage,
    )
    decision = Decision(window_drains=started.window_drains, reclaims=started.reclaims)
    # Jobs that already have victims draining for them wait for those, and preempt no more.
    draining_for = started.draining_for
    # A nominated job gets the GPUs its victims freed before anyone else, and they wait until
    # it runs. Without this, an aged victim could take its GPUs back and the preemption would
    # repeat forever. Only a nominee that is not itself yielding is nominated: yielding never
    # chains, so it can never form a cycle in which everyone waits for someone else.
    # Nominees go highest class first, then by effective priority: room stopped jobs freed for
    # urgent work must not go to an aged nominee of a lower class, which would leave the
    # urgent job to preempt again (on Philly day 60 at a third of the peak a fifth of all
    # preemptions were such repeats).
    nominee_ids = {j.job_id for j in waiting.nominated}
    nominated = [
        j
        for j in sorted(
            admission_order(waiting.nominated, now, policy),
            key=lambda j: -CLASS_RANK[j.priority],
        )
        # A nominee the window holds back waits with everyone: its victims need not yield.
        if j.preempted_for not in nominee_ids and j.priority not in held_back
    ]
    nominated_ids = decision.nominated = {j.job_id for j in nominated}

    def consider(job: QueuedJob) -> bool:
        """Admit the job, or say why it waits (making room for it when it may preempt)."""
        if job.preempted_for in nominated_ids:
            decision.waiting[job.job_id] = WaitReason.YIELDING
            return False
        if job.priority in held_back:
            decision.waiting[job.job_id] = WaitReason.PAUSED
            return False
        if job.not_before is not None and job.not_before > now:
            decision.waiting[job.job_id] = WaitReason.BLOCK
            return False
        if state.over_budget(job):
            decision.waiting[job.job_id] = WaitReason.BUDGET
            return False
        reason, borrowed, in_reserve = state.fit(job)
        if reason is None and state.delays_reservation(job):
            reason = WaitReason.RESERVED
        elif reason is None:
            decision.admitted.append(state.admit(job, borrowed, in_reserve))
            return True
        if job.job_id in draining_for:
            reason = WaitReason.PREEMPTING
        elif policy.preemption and reason in (
            WaitReason.QUOTA,
            WaitReason.CAPACITY,
            WaitReason.WINDOW,
        ):
            victims = state.victims_for(job)
            # A job that will hold the reservation (no job ahead of it in the pass waits for
            # room) waits for the ends due before its victims would have drained: the room
            # they free is then its own. Any other job preempts.
            if victims and (state.reservation_tried or not state.room_before_drain(job)):
                for victim in victims:
                    decision.preemptions.append(Preemption(victim.job_id, job.job_id))
                    state.drain(victim, job.job_id)
                draining_for.add(job.job_id)
                state.changes += 1
                reason = WaitReason.PREEMPTING
        if reason in _NEEDS_ROOM and not state.reservation_tried:
            state.reservation_tried = True
            decision.reservation = state.reserve(job)
        decision.waiting[job.job_id] = reason
        return False

    for job in nominated:
        consider(job)
    streams = list(waiting.streams)
    readers = [iter(s.jobs) for s in streams]
    checked_at = [-1] * len(streams)  # `state.changes` when the stream was last judged
    waited_in_a_row = [0] * len(streams)
    heads = _Heads(now, policy, _standings(team_usage, policy))

    closed: set[int] = set()  # streams blocked whose next job was read for the reservation

    def read_on(index: int) -> None:
        stream = streams[index]
        if checked_at[index] != state.changes:
            checked_at[index] = state.changes
            blocked = state.stream_blocked(stream)
            if blocked is not None:
                decision.blocked_streams[(stream.team, stream.priority)] = blocked
                if state.reservation_tried:
                    return
                # None of its jobs could be admitted or preempt, but its next one may be the
                # first job of the pass to wait for room: it is read to be judged for the
                # reservation, and the stream no further.
                closed.add(index)
        job = next(readers[index], None)
        if job is not None:
            heads.push(job, index)

    for index in range(len(streams)):
        read_on(index)
    while heads:
        index, job = heads.pop()
        if index in closed:
            if not state.reservation_tried and job.job_id not in nominated_ids:
                consider(job)
            continue
        if job.job_id not in nominated_ids:  # those were considered first
            admitted = consider(job)
            waited_in_a_row[index] = 0 if admitted else waited_in_a_row[index] + 1
            if lookahead is not None and waited_in_a_row[index] >= lookahead:
                stream = streams[index]
                decision.blocked_streams[(stream.team, stream.priority)] = WaitReason.BEHIND
                continue
        read_on(index)
    return decision


def admission_limits(
    job: QueuedJob,
    admission: Admission,
    bookings: Iterable[Booking],
    now: float,
    policy: QueuePolicy,
) -> AdmissionLimits:
    """The limits an admission `decide` made must still hold within when it is written: the
    fleet's caps (its GPUs outside the reserve, unless admitted into the reserve) and, outside
    the reserve, the team's entitlement plus all it may borrow; both as the time window active
    now sets them (`policy_at`)."""
    policy = policy_at(policy, now)
    if admission.in_reserve:
        return AdmissionLimits(policy.max_gpus, policy.max_instances, None)
    team_gpus = entitlement(job.team, _booked_at(bookings, now), policy)
    return AdmissionLimits(
        policy.max_gpus - policy.reserve_gpus,
        policy.max_instances,
        team_gpus + policy.quota(job.team).borrow,
    )


def most_booked(team: str, bookings: Iterable[Booking], now: float) -> int:
    """The most GPUs the team's bookings that have not ended will hold at once."""
    edges = sorted(
        edge
        for b in bookings
        if b.team == team and b.end > now
        for edge in ((max(b.start, now), b.gpus), (b.end, -b.gpus))
    )  # at equal times an end comes before a start: a booking holds nothing at its end
    held = most = 0
    for _, change in edges:
        held += change
        most = max(most, held)
    return most


def never_admissible(job: QueuedJob, policy: QueuePolicy, booked_gpus: int = 0) -> str | None:
    """Why no state of the fleet could ever admit `job`, with the numbers (None when one
    could): such a job would wait forever. The best case is judged by the rule every pass
    applies (`fit`): an idle fleet, the other teams' quotas idle to borrow from, the reserve
    open if any time window opens it to the job's class, and `booked_gpus` booked for its
    team (see `most_booked`). A job whose cost estimate alone exceeds its team's monthly
    budget can never be admitted either."""
    windows = [w for w in policy.windows if w.start != w.end]  # start == end: never open
    opened = frozenset(p for w in windows for p in w.reserve_open_to)

    def best_in(variant: QueuePolicy) -> _Pass:
        return _Pass(
            policy=variant,
            now=0.0,
            running={},
            booked={job.team: booked_gpus} if booked_gpus else {},
            reserve_open_to=opened | {Priority.CRITICAL},
            spend={},
        )

    best = best_in(policy)
    reason, _, _ = best.fit(job)
    # A window's larger cap or quota admits it while the window is active.
    if reason is not None and any(
        best_in(policy.in_window(w)).fit(job)[0] is None for w in windows
    ):
        reason = None
    quota = policy.quota(job.team)
    if reason is WaitReason.CAPACITY and job.instances > policy.max_instances:
        return f"asks for {job.instances} instances; the fleet's cap is {policy.max_instances}"
    if reason is WaitReason.CAPACITY:
        return f"asks for {job.gpus} GPUs; the fleet's cap is {policy.max_gpus}"
    reserve = policy.reserve_gpus
    if reason is WaitReason.WINDOW:
        return (
            f"asks for {job.gpus} GPUs; {job.priority.value} work may use "
            f"{policy.max_gpus - reserve} of the fleet's {policy.max_gpus} (the other {reserve} "
            "are the reserve, for critical work and the classes a time window opens it to)"
        )
    if reason is not None:
        borrowable = min(quota.borrow, best.idle_quota_of_others(job.team))
        booked = f" + {booked_gpus} booked" if booked_gpus else ""
        limit = quota.gpus + booked_gpus + borrowable
        text = (
            f"asks for {job.gpus} GPUs; team {job.team} may hold {limit} "
            f"(its quota {quota.gpus}{booked} + {borrowable} borrowed)"
        )
        if job.priority in best.reserve_open_to:
            text += f", or {reserve} in the reserve"
        return text
    budget = quota.monthly_budget_usd
    if budget is not None and job.estimated_cost_usd > budget:
        return (
            f"its estimated cost ${job.estimated_cost_usd:.2f} exceeds team {job.team}'s "
            f"monthly budget ${budget:.2f}"
        )
    return None
