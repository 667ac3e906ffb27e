"""The small interfaces the services need from the outside world.

`adapters/aws` implements them with boto3 (Lambda and the embedded AWS account); `adapters/local`
implements them in memory (unit tests and the simulator). One contract suite runs against both.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from enum import Enum
from typing import Any, Protocol

from gpufleet.domain.fair_share import UsageCharge
from gpufleet.domain.history import execution_name
from gpufleet.domain.job import Job, JobChanges, JobStatus
from gpufleet.domain.launch import LaunchRequest, LaunchResult
from gpufleet.domain.queueing import AdmissionLimits as AdmissionLimits  # the queue's port
from gpufleet.domain.queueing import Booking, QueuedJob, RunningJob, Shape
from gpufleet.domain.scaling import MetricBatch, Series, SeriesQuery
from gpufleet.domain.spec import Dependency, Priority
from gpufleet.domain.usage_layout import NodeSummary, NodeUsage
from gpufleet.errors import NotFound, RefusedInput


class Clock(Protocol):
    def now(self) -> float:
        """Seconds since the epoch."""
        ...


@dataclass(frozen=True)
class StatusChange:
    """A job's move to `target` from one of `sources` (or, with `holding`, only while its
    placement holds that instance), with `changes`: the conditional write of `transition`,
    also made as part of a write that spans the job store and the queue."""

    job_id: str
    target: JobStatus
    sources: frozenset[JobStatus]
    now: float
    changes: JobChanges
    holding: str | None = None
    version: int | None = None  # and only if the job is still at this version (not written since)


@dataclass(frozen=True)
class RunningShare:
    """What an admitted job holds of the quotas."""

    team: str
    gpus: int
    instances: int


class Freed(Enum):
    """A released share, and whether jobs wait for it or are held on the job's end (then a
    pass is to be woken)."""

    NOBODY_WAITS = "nobody waits"
    OTHERS_WAIT = "others wait"


class JobStore(Protocol):
    def put_new(self, job: Job) -> bool:
        """Store a new job; False (and no change) when the id already exists."""
        ...

    def put_many(self, jobs: Sequence[Job]) -> None:
        """Store jobs in batches (DynamoDB's BatchWriteItem: 25 a call, no condition, so a job
        already stored is written over): for jobs nothing else writes yet, an array's children
        before any of them is queued."""
        ...

    def get(self, job_id: str) -> Job:
        """The job, or raise JobNotFound."""
        ...

    def statuses(self, job_ids: Sequence[str]) -> dict[str, JobStatus]:
        """The status of each of the jobs that exist (DynamoDB's BatchGetItem: 100 a call):
        an array's children, for its progress and its dependants."""
        ...

    def transition(
        self,
        job_id: str,
        target: JobStatus,
        now: float,
        changes: JobChanges | None = None,
        *,
        sources: Collection[JobStatus] | None = None,
        holding: str | None = None,
        version: int | None = None,
    ) -> Job:
        """Move to `target` if the current status allows it (is one of `sources`, when given),
        with `holding`, if the job's placement holds that instance, and with `version`, if the
        job was not written since it was at that version, applying `changes` in the same
        conditional write. Raise IllegalTransition when it does not, carrying the job
        as it is (or JobNotFound)."""
        ...

    def update(self, job_id: str, now: float, changes: JobChanges) -> Job:
        """Set non-status fields of an existing job; raise JobNotFound when it does not exist."""
        ...

    def list_jobs(self, status: JobStatus | None = None, limit: int = 1000) -> list[Job]:
        """Jobs, newest first; only those in `status` when given."""
        ...

    def recent_for_team(self, team: str, limit: int) -> list[Job]:
        """The team's most recent jobs, newest first."""
        ...


class CapacityMemory(Protocol):
    """Offerings (`capacity-type:instance-type:zone`) that recently had no capacity."""

    def remember(self, keys: Iterable[str], until: float) -> None: ...

    def unavailable(self, now: float) -> frozenset[str]:
        """Keys remembered and not yet expired at `now`."""
        ...


@dataclass(frozen=True)
class QueueEntry:
    """A waiting job and the workflow task parked until it is admitted."""

    job: QueuedJob
    task_token: str  # NO_WORKFLOW_YET: a child of an array, whose workflow admission starts
    queued_at: float  # when this wait began (a requeued job keeps its place, not this)
    # The dependency it is held on (`arrays.held_on`): out of its stream, read by no pass, until
    # that dependency settles and a pass moves it (`JobQueue.move_held`). None: in its stream.
    held_on: Dependency | None = None


# The token of a child of an array waiting for its first admission: it has no workflow yet, and
# the dispatcher starts one when it admits it (docs/arrays.md).
NO_WORKFLOW_YET = ""


@dataclass(frozen=True)
class RunningEntry:
    """An admitted job, holding its share of the quotas until it is released."""

    job: RunningJob
    task_token: str
    notified: bool  # its workflow was told it was admitted


@dataclass(frozen=True)
class AdmissionRequest:
    """A waiting job to admit as `job`, within `limits` (`admission_limits`)."""

    entry: QueueEntry
    job: RunningJob
    limits: AdmissionLimits


@dataclass(frozen=True)
class QueueState:
    """What an admission pass starts from besides the waiting jobs, read in one request."""

    running: list[RunningEntry]
    bookings: list[Booking]
    waiting: Mapping[Priority, int]  # how many jobs wait, by class
    gpus_held: int
    # Until when the latest offering found short of capacity is remembered (0: never): an
    # admission passes it on, so that a launch reads the capacity memory only when it may
    # hold something.
    shortages_until: float = 0.0
    # (team, class) -> the shapes (GPUs, instances) of its waiting jobs: the streams to read.
    streams: Mapping[tuple[str, Priority], frozenset[Shape]] = field(default_factory=dict)
    # Waiting jobs that preempted others: a pass considers them first.
    nominees: Sequence[QueuedJob] = ()
    # Each team's fair-share ledger (`domain.fair_share`: entry -> amount), charged as runs end.
    team_usage: Mapping[str, Mapping[str, float]] = field(default_factory=dict)
    # The dependencies that hold waiting jobs out of the streams (`QueueEntry.held_on`): one
    # each, however many jobs each holds.
    holds: frozenset[Dependency] = frozenset()


class JobQueue(Protocol):
    def enqueue(self, entry: QueueEntry) -> bool:
        """Put a job in the queue, in its stream or held on its `held_on` (again, with a new
        token, if it is already there). A job
        already admitted (under the token of an attempt of this step that crashed) keeps its
        admission, which now belongs to this token, not yet told. False (and no change) when
        the job store no longer has the job QUEUED: it ended (was cancelled) meanwhile."""
        ...

    def enqueue_all(self, entries: Sequence[QueueEntry]) -> None:
        """`enqueue` for new waiting jobs (an array's children), as many to a transaction as
        fit; those that wait, were admitted or ended already (a repeated delivery) go as
        `enqueue` goes."""
        ...

    def stream(self, team: str, priority: Priority) -> Iterator[QueueEntry]:
        """The team's waiting jobs of that class, in admission order (oldest first), read
        lazily: a page at a time, as the iterator is advanced."""
        ...

    def waiting_entry(self, job: QueuedJob) -> QueueEntry | None:
        """The entry of a waiting job (a nominee: the state knows the job, not its token);
        None when it no longer waits."""
        ...

    def state(self) -> QueueState:
        """Running jobs, bookings, GPUs held, how many jobs wait per class, the shapes that
        wait per team and class, and the nominees."""
        ...

    def waiting(self) -> list[QueueEntry]:
        """Every waiting job, held ones too (for listings)."""
        ...

    def held(self, dependency: Dependency) -> Iterator[QueueEntry]:
        """The jobs held on `dependency`, in admission order, read lazily (a page at a time)."""
        ...

    def move_held(self, dependency: Dependency, entries: Sequence[QueueEntry]) -> int:
        """Take jobs held on `dependency` to where each entry now says (`held_on`: its stream,
        counted as waiting, or another dependency), as many to a transaction as fit; one that
        left the hold meanwhile (moved by another pass, removed) is left alone. How many moved."""
        ...

    def forget_hold(self, dependency: Dependency) -> bool:
        """Drop `dependency` from the state's holds if it holds no job (False: it holds some,
        held meanwhile, and stays)."""
        ...

    def running(self) -> list[RunningEntry]: ...

    def admit(
        self, entry: QueueEntry, job: RunningJob, limits: AdmissionLimits, *, waiting: bool = True
    ) -> bool:
        """Move a job from the queue to the running set and count it against the caps, in one
        conditional write; False (and no change) if another dispatcher got there first or a
        cap would be exceeded. With `waiting=False` the job is admitted as it arrives, never
        having been put in the queue: then False too when the job store no longer has it
        QUEUED."""
        ...

    def admit_all(self, requests: Sequence[AdmissionRequest]) -> list[str]:
        """`admit` for each waiting job of a pass, as many in one transaction as fit
        (`adapters/admission_batches.py`): the jobs admitted, in the requests' order. A job that
        another dispatcher admitted or removed meanwhile, or that would exceed a cap or quota
        after the ones before it, is not admitted, and holds back none of the others."""
        ...

    def note_launch(self, job_id: str, hourly_usd: float, stop_at: float | None) -> None:
        """A launch attempt of an admitted job: its workflow evidently heard of the admission
        (it is notified), what its instances cost per hour (0 while it has none), and when its
        cost reaches its budget (checked by every full pass; None: no budget)."""
        ...

    def record_launch(self, change: StatusChange, hourly_usd: float, stop_at: float | None) -> bool:
        """The job's status change of a launch and `note_launch`, in one write; False (and
        nothing written) when the job's status is not one of the change's sources, or the job
        is not admitted (its share was released meanwhile)."""
        ...

    def record_release(
        self,
        change: StatusChange,
        share: RunningShare,
        charge: UsageCharge | None = None,
        *,
        settles: Collection[Dependency],
    ) -> Freed | None:
        """The job's write at the end of a run and the return of its share (`release`, with
        its `charge`), in one write, which also tells whether any of the holds the end
        `settles` (`arrays.holds_settled_by`) holds a job: OTHERS_WAIT then, as when jobs wait
        for the share. None (and nothing written) when the job's condition fails, or the job
        does not hold exactly `share`."""
        ...

    def note_shortage(self, until: float) -> None:
        """Offerings ran short of capacity and are remembered until `until` (the capacity
        memory holds which): the state's `shortages_until` is the latest such time."""
        ...

    def mark_draining(self, job_id: str, for_job_id: str) -> bool:
        """Record that a running job was asked to make room; False if it already was."""
        ...

    def preempt(self, victim_id: str, for_job: QueuedJob) -> bool:
        """`mark_draining` for a waiting job, which becomes a nominee (in the state until it
        is admitted or leaves the queue), in one write; False (and no change) if the victim
        is not running or already draining, or the job no longer waits."""
        ...

    def charge(self, team: str, charge: UsageCharge) -> None:
        """Add `charge` to the team's fair-share ledger, holding no share to release (a stage
        that hands its instances to the next)."""
        ...

    def release(self, job_id: str, charge: UsageCharge | None = None) -> bool:
        """Give back a running job's share and add `charge` (its run's GPU-hours) to its
        team's fair-share ledger, in one write; False (and nothing charged) if it was not
        running (already released)."""
        ...

    def remove(self, job_id: str) -> QueueEntry | None:
        """Take a waiting job out of the queue (cancel, resize); None if it was not waiting."""
        ...

    def book(self, booking: Booking, check: Callable[[list[Booking]], None]) -> None:
        """Book it when `check` passes on the bookings as they are when it is written (`check`
        raises to refuse: nothing is booked). Two bookings made at once are never both checked
        against bookings that lack the other."""
        ...

    def cancel_booking(self, booking_id: str) -> Booking | None:
        """Remove a booking; None if there is none by that id (cancelled or expired already)."""
        ...

    def expire_bookings(self, now: float) -> list[Booking]:
        """Remove the bookings whose window ended by `now`; the ones removed."""
        ...

    def first_notice(self, key: str) -> bool:
        """True the first time it is asked for `key` (a notice to send once, not every pass)."""
        ...

    def bookings(self) -> list[Booking]: ...

    def items_read(self) -> int:
        """Queue items read so far (for the admission benchmark)."""
        ...

    def transactions(self) -> int:
        """Transactions written so far, or cancelled (for the admission benchmark; the tries
        again of one that met another writer or was throttled are not counted)."""
        ...


class JobMetrics(Protocol):
    def read(self, batch: MetricBatch) -> dict[SeriesQuery, Series]:
        """The series of one batch (one GetMetricData call) over its window; a series with no
        data in it may be left out."""
        ...


class Notifier(Protocol):
    def notify(self, subject: str, message: str) -> None:
        """Tell the people who run the fleet (the alerts SNS topic)."""
        ...

    def publish(self, topic_arn: str, subject: str, message: str) -> None:
        """Tell the people behind one of the teams' topics (domain/notify.py)."""
        ...


class EventPublisher(Protocol):
    def publish(self, source: str, detail_type: str, detail: Mapping[str, Any]) -> None: ...


class ObjectStore(Protocol):
    def put_json(self, key: str, document: Mapping[str, Any]) -> None: ...

    def get_bytes(self, key: str, max_bytes: int, version_id: str | None = None) -> bytes:
        """The object's bytes (of that version, when given; none for an empty object); raise
        ObjectTooLarge past `max_bytes`, ObjectMissing when it (or that version) is gone."""
        ...


class UsageReader(Protocol):
    def of_job(self, job_id: str) -> list[NodeUsage]:
        """Each node's usage document of the job's runs (domain/usage_layout.py), by instance."""
        ...

    def summaries_of_job(self, job_id: str) -> list[NodeSummary]:
        """The same documents summed up, their samples not kept (what `gpufleet review` reads
        of every job)."""
        ...


@dataclass(frozen=True)
class WorkflowRun:
    """A job's lifecycle execution as it stands (executions are named after their job, and its
    continuations `<job_id>-<n>`: `domain/history.py`)."""

    status: str  # Step Functions' ExecutionStatus: RUNNING, SUCCEEDED, FAILED, TIMED_OUT, ...
    stopped_at: float | None = None  # when it ended (None: it runs)
    error: str = ""
    cause: str = ""

    @property
    def running(self) -> bool:
        return self.status in WORKFLOW_RUNNING


# A redrive of an execution that ended is PENDING_REDRIVE until it runs again.
WORKFLOW_RUNNING = frozenset({"RUNNING", "PENDING_REDRIVE"})


def latest_run(job_id: str, run_named: Callable[[str], WorkflowRun | None]) -> WorkflowRun | None:
    """The job's last execution, `run_named` answering for one name: an execution that
    continued as a new one ended SUCCEEDED, so the chain is followed past those."""
    run = run_named(job_id)
    continuation = 0
    while run is not None and run.status == "SUCCEEDED":
        continuation += 1
        following = run_named(execution_name(job_id, continuation))
        if following is None:
            break
        run = following
    return run


class Workflow(Protocol):
    def start(self, job_id: str, state: Mapping[str, Any], continuation: int = 0) -> None:
        """Start the job's lifecycle from `state` (its `continuation`th execution, when one
        ran out of history: `domain/history.py`); starting the same one again is a no-op.
        Raises `TransientError` when Step Functions throttles the start (nothing started)."""
        ...

    def complete_task(self, token: str, output: Mapping[str, Any]) -> bool:
        """Hand a waiting task its result; False when the task is no longer waiting."""
        ...

    def heartbeat(self, token: str) -> bool:
        """Tell a waiting task its node is alive; False when the task is no longer waiting."""
        ...

    def running_jobs(self) -> frozenset[str]:
        """The jobs whose lifecycle runs now."""
        ...

    def run_of(self, job_id: str) -> WorkflowRun | None:
        """The job's last lifecycle execution (`latest_run`); None when it never started."""
        ...


class Fleet(Protocol):
    def launch(self, request: LaunchRequest) -> LaunchResult:
        """Launch the job's instances, all or none. Idempotent per attempt: a call retried with
        the same request gets the instances an earlier one launched, if they still run. After
        it the job holds no instances but the ones it returns."""
        ...

    def terminate_job_instances(self, job_id: str) -> list[str]:
        """Terminate every live instance tagged with the job; return their ids."""
        ...

    def job_of(self, instance_id: str) -> str | None:
        """The job an instance gpufleet launched belongs to (None: not one of ours)."""
        ...

    def managed_instances(self) -> list[ManagedInstance]:
        """Every live (pending or running) instance tagged gpufleet:managed=true."""
        ...

    def terminate_instances(self, instance_ids: list[str]) -> None: ...

    def delete_placement_group(self, job_id: str) -> bool:
        """Delete the job's placement group (multi-node jobs); False if not (yet) possible."""
        ...

    def placement_group_jobs(self) -> list[str]:
        """Jobs that still have a placement group."""
        ...

    def warm_pool(self) -> WarmPoolStatus:
        """The warm pool's idle instances, and when a launch last asked for its instance type
        (a new pool counts as asked for now). Only for a fleet given a warm pool."""
        ...

    def add_warm_instances(self, count: int) -> list[str]:
        """Launch up to `count` idle instances of the warm pool's shape; return their ids."""
        ...


@dataclass(frozen=True)
class ManagedInstance:
    instance_id: str
    job_id: str | None  # for a warm instance a launch took: the job that took it
    launched_at: float  # for a warm instance a launch took: when it took it
    warm: bool = False  # an idle warm-pool instance, waiting for a job


@dataclass(frozen=True)
class WarmPoolStatus:
    idle: list[ManagedInstance]
    demand_at: float


class ObjectTooLarge(RefusedInput):
    def __init__(self, key: str, size: int, limit: int) -> None:
        super().__init__(f"{key} is {size} bytes; the limit is {limit}")
        self.size = size
        self.limit = limit


class ObjectMissing(NotFound):
    def __init__(self, key: str, version_id: str | None) -> None:
        super().__init__(f"{key} (version {version_id}) does not exist")
        self.version_id = version_id


@dataclass
class Ports:
    """Everything a service may touch, handed in by the runtime that builds it."""

    clock: Clock
    jobs: JobStore
    events: EventPublisher
    objects: ObjectStore
    workflow: Workflow
    fleet: Fleet
    capacity: CapacityMemory
    queue: JobQueue
    metrics: JobMetrics
    notifier: Notifier
