"""In-memory implementations of the ports, with the same semantics as the AWS adapters
(conditional status changes, idempotent starts, all-or-nothing launches)."""

from __future__ import annotations

import json
import threading
from collections import Counter
from collections.abc import Callable, Collection, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from gpufleet.adapters.admission_batches import (
    BatchOutcome,
    Rooms,
    admission_bytes,
    admit_in_batches,
    check_transaction,
    rooms,
)
from gpufleet.domain.config import WarmPool
from gpufleet.domain.fair_share import UsageCharge, add_charge
from gpufleet.domain.history import execution_name, job_of_execution
from gpufleet.domain.job import (
    ALLOWED_SOURCES,
    IllegalTransition,
    Job,
    JobChanges,
    JobNotFound,
    JobStatus,
)
from gpufleet.domain.launch import LaunchError, LaunchRequest, LaunchResult
from gpufleet.domain.queueing import Booking, QueuedJob, RunningJob, Shape
from gpufleet.domain.scaling import MetricBatch, Series, SeriesQuery
from gpufleet.domain.spec import Dependency, Priority
from gpufleet.ports import (
    AdmissionLimits,
    AdmissionRequest,
    Clock,
    Freed,
    ManagedInstance,
    ObjectMissing,
    ObjectTooLarge,
    Ports,
    QueueEntry,
    QueueState,
    RunningEntry,
    RunningShare,
    StatusChange,
    WarmPoolStatus,
    WorkflowRun,
    latest_run,
)


class ManualClock:
    """A clock that moves only when told to."""

    def __init__(self, start: float = 1_767_225_600.0) -> None:  # 2026-01-01T00:00:00Z
        self._now = start

    def now(self) -> float:
        return self._now

    def advance(self, seconds: float) -> None:
        self._now += seconds


class InMemoryJobStore:
    def __init__(self) -> None:
        self._jobs: dict[str, Job] = {}
        self._lock = threading.Lock()

    def put_new(self, job: Job) -> bool:
        with self._lock:
            if job.job_id in self._jobs:
                return False
            self._jobs[job.job_id] = job
            return True

    def put_many(self, jobs: Sequence[Job]) -> None:
        with self._lock:
            self._jobs.update((job.job_id, job) for job in jobs)

    def get(self, job_id: str) -> Job:
        with self._lock:
            if job_id not in self._jobs:
                raise JobNotFound(job_id)
            return self._jobs[job_id]

    def statuses(self, job_ids: Sequence[str]) -> dict[str, JobStatus]:
        with self._lock:
            return {i: self._jobs[i].status for i in job_ids if i in self._jobs}

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
        allowed = ALLOWED_SOURCES[target] if sources is None else sources
        return self.apply(
            StatusChange(
                job_id,
                target,
                frozenset(allowed),
                now,
                changes or JobChanges(),
                holding,
                version,
            )
        )

    def apply(self, change: StatusChange) -> Job:
        """The conditional write of `change` (as `transition_write` is on DynamoDB): raise
        IllegalTransition, with the job as it is, when a condition does not hold."""
        with self._lock:
            if change.job_id not in self._jobs:
                raise JobNotFound(change.job_id)
            job = self._jobs[change.job_id]
            held = change.holding is None or (
                job.placement is not None and change.holding in job.placement.instance_ids
            )
            same = change.version is None or job.version == change.version
            if job.status not in change.sources or not held or not same:
                raise IllegalTransition(change.job_id, job.status, change.target, job)
            updated = job.with_changes(change.changes).model_copy(
                update={
                    "status": change.target,
                    "updated_at": change.now,
                    "version": job.version + 1,
                }
            )
            self._jobs[change.job_id] = updated
            return updated

    def update(self, job_id: str, now: float, changes: JobChanges) -> Job:
        with self._lock:
            if job_id not in self._jobs:
                raise JobNotFound(job_id)
            job = self._jobs[job_id]
            updated = job.with_changes(changes).model_copy(
                update={"updated_at": now, "version": job.version + 1}
            )
            self._jobs[job_id] = updated
            return updated

    def recent_for_team(self, team: str, limit: int) -> list[Job]:
        with self._lock:
            jobs = [j for j in self._jobs.values() if j.spec.team == team]
        jobs.sort(key=lambda job: job.created_at, reverse=True)
        return jobs[:limit]

    def list_jobs(self, status: JobStatus | None = None, limit: int = 1000) -> list[Job]:
        with self._lock:
            jobs = [j for j in self._jobs.values() if status is None or j.status == status]
        jobs.sort(key=lambda job: job.created_at, reverse=True)
        return jobs[:limit]


@dataclass
class RecordingPublisher:
    events: list[tuple[str, str, dict[str, Any]]] = field(default_factory=list)

    def publish(self, source: str, detail_type: str, detail: Mapping[str, Any]) -> None:
        self.events.append((source, detail_type, dict(detail)))

    def of_type(self, detail_type: str) -> list[dict[str, Any]]:
        return [detail for _, kind, detail in self.events if kind == detail_type]


@dataclass
class InMemoryObjects:
    """The latest body of each key in `objects`; every version `upload` made in `versions`."""

    objects: dict[str, bytes] = field(default_factory=dict)
    versions: dict[tuple[str, str], bytes] = field(default_factory=dict)

    def upload(self, key: str, body: bytes) -> str:
        """Store a new version of `key`, as a versioned bucket does; its version id."""
        version_id = f"v{len(self.versions) + 1}"
        self.versions[key, version_id] = self.objects[key] = body
        return version_id

    def put_json(self, key: str, document: Mapping[str, Any]) -> None:
        self.objects[key] = json.dumps(document, sort_keys=True).encode()

    def get_bytes(self, key: str, max_bytes: int, version_id: str | None = None) -> bytes:
        try:
            body = self.objects[key] if version_id is None else self.versions[key, version_id]
        except KeyError:
            raise ObjectMissing(key, version_id) from None
        if len(body) > max_bytes:
            raise ObjectTooLarge(key, len(body), max_bytes)
        return body


@dataclass
class RecordingWorkflow:
    """Starts are idempotent per execution name, as with named executions (the job id, then
    `<job_id>-<n>`); tasks complete once."""

    started: list[str] = field(default_factory=list)  # execution names
    inputs: dict[str, dict[str, Any]] = field(default_factory=dict)  # each start's state
    completed: dict[str, dict[str, Any]] = field(default_factory=dict)
    heartbeats: list[str] = field(default_factory=list)
    ended: dict[str, WorkflowRun] = field(default_factory=dict)  # set by tests: how runs ended

    def start(self, job_id: str, state: Mapping[str, Any], continuation: int = 0) -> None:
        name = execution_name(job_id, continuation)
        if name not in self.started:
            self.started.append(name)
            self.inputs[name] = dict(state)

    def complete_task(self, token: str, output: Mapping[str, Any]) -> bool:
        if token in self.completed:
            return False
        self.completed[token] = dict(output)
        return True

    def heartbeat(self, token: str) -> bool:
        if token in self.completed:
            return False
        self.heartbeats.append(token)
        return True

    def running_jobs(self) -> frozenset[str]:
        return frozenset(
            job_of_execution(name)[0] for name in self.started if name not in self.ended
        )

    def run_of(self, job_id: str) -> WorkflowRun | None:
        return latest_run(job_id, self._run_named)

    def _run_named(self, name: str) -> WorkflowRun | None:
        if name in self.ended:
            return self.ended[name]
        return WorkflowRun("RUNNING") if name in self.started else None


class InMemoryCapacityMemory:
    def __init__(self) -> None:
        self._until: dict[str, float] = {}

    def remember(self, keys: Iterable[str], until: float) -> None:
        for key in keys:
            self._until[key] = max(until, self._until.get(key, 0.0))

    def unavailable(self, now: float) -> frozenset[str]:
        return frozenset(key for key, until in self._until.items() if until > now)


# Decides a launch's fate: None launches it, a list of error codes fails it.
LaunchRule = Callable[[LaunchRequest], list[str] | None]


def _private_ip(instance_id: str) -> str:
    """A fake instance's private IP, in 10.0.0.0/8 as a VPC's would be, one per instance."""
    number = int(instance_id.removeprefix("i-"), 16)
    return f"10.{number >> 16 & 255}.{number >> 8 & 255}.{number & 255}"


class FakeFleet:
    """Launches instantly on the first override unless `rule` says otherwise. With a warm
    pool, a launch that may use it takes an idle warm instance first, as `Ec2Fleet` does."""

    def __init__(
        self,
        rule: LaunchRule | None = None,
        *,
        warm_pool: WarmPool | None = None,
        clock: Clock | None = None,
    ) -> None:
        self._rule = rule or (lambda _request: None)
        self._next_id = 0
        self._lock = threading.RLock()
        self.live: dict[str, str] = {}  # instance id -> job id
        self.owners: dict[str, str] = {}  # every instance ever launched -> job id
        self.launched_at: dict[str, float] = {}  # set by tests that need ages
        self.placement_groups: set[str] = set()  # jobs with a cluster placement group
        self.requests: list[LaunchRequest] = []
        self._warm_pool = warm_pool
        self._clock = clock or ManualClock()
        self.warm_idle: dict[str, float] = {}  # idle warm instance -> launched at
        self.claimed_at: dict[str, float] = {}  # warm instance a launch took -> when
        self._demand_at: float | None = None

    def launch(self, request: LaunchRequest) -> LaunchResult:
        with self._lock:
            self.requests.append(request)
            result = self._claim_warm(request) or self._launch(request)
            # As on EC2: the job holds what this launch returned and nothing else.
            for instance_id, job_id in list(self.live.items()):
                if job_id == request.job_id and instance_id not in result.instance_ids:
                    del self.live[instance_id]
            return result

    def _new_instance_id(self) -> str:
        self._next_id += 1
        return f"i-{self._next_id:017x}"

    def _claim_warm(self, request: LaunchRequest) -> LaunchResult | None:
        pool = self._warm_pool
        if pool is None or request.nodes != 1 or request.capacity_type.value != pool.capacity_type:
            return None
        override = next(
            (o for o in request.overrides if o.instance_type == pool.instance_type), None
        )
        if override is None:
            return None
        self._demand_at = self._clock.now()
        mine = [i for i in self.claimed_at if self.live.get(i) == request.job_id]
        if mine:  # a retried launch of the same job
            instance_id = mine[0]
        elif self.warm_idle:
            instance_id = min(self.warm_idle, key=lambda i: (self.warm_idle[i], i))
            del self.warm_idle[instance_id]
            self.claimed_at[instance_id] = self._clock.now()
            self.live[instance_id] = self.owners[instance_id] = request.job_id
        else:
            return None
        return LaunchResult(
            instance_ids=[instance_id],
            instance_type=pool.instance_type,
            zone=override.zone,
            capacity_type=request.capacity_type,
            private_ips={instance_id: _private_ip(instance_id)},
        )

    def _launch(self, request: LaunchRequest) -> LaunchResult:
        codes = self._rule(request)
        if codes:
            # Like EC2: one error per override it could not fill.
            return LaunchResult(
                capacity_type=request.capacity_type,
                errors=[
                    LaunchError(code=code, instance_type=o.instance_type, zone=o.zone)
                    for code in codes
                    for o in request.overrides
                ],
            )
        first = request.overrides[0]
        if request.nodes > 1:
            self.placement_groups.add(request.job_id)
        instance_ids = []
        for _ in range(request.nodes):
            instance_id = self._new_instance_id()
            self.live[instance_id] = request.job_id
            self.owners[instance_id] = request.job_id
            instance_ids.append(instance_id)
        return LaunchResult(
            instance_ids=instance_ids,
            instance_type=first.instance_type,
            zone=first.zone,
            capacity_type=request.capacity_type,
            private_ips={instance_id: _private_ip(instance_id) for instance_id in instance_ids},
        )

    def job_of(self, instance_id: str) -> str | None:
        return self.owners.get(instance_id)

    def managed_instances(self) -> list[ManagedInstance]:
        with self._lock:
            held = [
                ManagedInstance(
                    instance_id,
                    job_id,
                    self.claimed_at.get(instance_id, self.launched_at.get(instance_id, 0.0)),
                )
                for instance_id, job_id in self.live.items()
            ]
            return sorted([*held, *self._idle_warm()], key=lambda i: i.instance_id)

    def terminate_instances(self, instance_ids: list[str]) -> None:
        with self._lock:
            for instance_id in instance_ids:
                self.live.pop(instance_id, None)
                self.warm_idle.pop(instance_id, None)

    def _idle_warm(self) -> list[ManagedInstance]:
        return [ManagedInstance(i, None, at, warm=True) for i, at in sorted(self.warm_idle.items())]

    def warm_pool(self) -> WarmPoolStatus:
        with self._lock:
            if self._warm_pool is None:
                raise RuntimeError("this fleet has no warm pool configured")
            if self._demand_at is None:
                self._demand_at = self._clock.now()  # a new pool starts in demand
            return WarmPoolStatus(idle=self._idle_warm(), demand_at=self._demand_at)

    def add_warm_instances(self, count: int) -> list[str]:
        with self._lock:
            if self._warm_pool is None:
                raise RuntimeError("this fleet has no warm pool configured")
            added = [self._new_instance_id() for _ in range(count)]
            for instance_id in added:
                self.warm_idle[instance_id] = self._clock.now()
            return added

    def delete_placement_group(self, job_id: str) -> bool:
        if job_id in self.placement_groups and job_id not in self.live.values():
            self.placement_groups.discard(job_id)
            return True
        return False

    def placement_group_jobs(self) -> list[str]:
        return sorted(self.placement_groups)

    def terminate_job_instances(self, job_id: str) -> list[str]:
        ids = sorted(i for i, owner in self.live.items() if owner == job_id)
        for instance_id in ids:
            del self.live[instance_id]
        return ids


class InMemoryJobQueue:
    """The queue's semantics without DynamoDB: the same conditions, checked under a lock."""

    def __init__(self, jobs: InMemoryJobStore | None = None) -> None:
        self._lock = threading.Lock()
        self._jobs = jobs  # whose records enqueue and admit-on-arrival check, as on DynamoDB
        self._waiting: dict[str, QueueEntry] = {}
        self._nominees: dict[str, QueuedJob] = {}  # waiting jobs that preempted others
        self._running: dict[str, RunningEntry] = {}
        self._bookings: list[Booking] = []
        self._notices: set[str] = set()
        self._shortages_until = 0.0
        self._ledgers: dict[str, dict[str, float]] = {}  # each team's fair-share ledger
        self._read = 0
        self._transactions = 0

    def items_read(self) -> int:
        return self._read

    def transactions(self) -> int:
        return self._transactions

    def _still_queued(self, job_id: str) -> bool:
        if self._jobs is None:
            return True
        try:
            return self._jobs.get(job_id).status is JobStatus.QUEUED
        except JobNotFound:
            return False

    def enqueue(self, entry: QueueEntry) -> bool:
        with self._lock:
            if not self._still_queued(entry.job.job_id):
                return False
            admitted = self._running.get(entry.job.job_id)
            if admitted is not None:
                self._running[entry.job.job_id] = RunningEntry(
                    admitted.job, entry.task_token, notified=False
                )
                return True
            self._waiting[entry.job.job_id] = entry
            return True

    def enqueue_all(self, entries: Sequence[QueueEntry]) -> None:
        for entry in entries:
            self.enqueue(entry)

    def waiting(self) -> list[QueueEntry]:
        with self._lock:
            self._read += len(self._waiting)
            return list(self._waiting.values())

    def _in_streams(self) -> list[QueueEntry]:
        """The waiting jobs not held on a dependency (under the lock)."""
        return [e for e in self._waiting.values() if e.held_on is None]

    def held(self, dependency: Dependency) -> Iterator[QueueEntry]:
        with self._lock:
            members = [e for e in self._waiting.values() if e.held_on == dependency]
        for entry in sorted(members, key=lambda e: (e.job.enqueued_at, e.job.job_id)):
            self._read += 1
            yield entry

    def move_held(self, dependency: Dependency, entries: Sequence[QueueEntry]) -> int:
        with self._lock:
            self._transactions += 1
            moved = 0
            for entry in entries:
                current = self._waiting.get(entry.job.job_id)
                if current is not None and current.held_on == dependency:
                    self._waiting[entry.job.job_id] = entry
                    moved += 1
            return moved

    def forget_hold(self, dependency: Dependency) -> bool:
        with self._lock:  # the state's holds are those of the held entries already
            return all(e.held_on != dependency for e in self._waiting.values())

    def stream(self, team: str, priority: Priority) -> Iterator[QueueEntry]:
        with self._lock:
            members = [e for e in self._in_streams() if e.job.team == team]
        entries = sorted(
            (e for e in members if e.job.priority is priority),
            key=lambda e: (e.job.enqueued_at, e.job.job_id),
        )
        for entry in entries:
            self._read += 1
            yield entry

    def waiting_entry(self, job: QueuedJob) -> QueueEntry | None:
        with self._lock:
            entry = self._waiting.get(job.job_id)
            return entry if entry is not None and entry.held_on is None else None

    def running(self) -> list[RunningEntry]:
        with self._lock:
            return list(self._running.values())

    def state(self) -> QueueState:
        with self._lock:
            running = list(self._running.values())
            waiting = Counter(e.job.priority for e in self._in_streams())
            streams: dict[tuple[str, Priority], set[Shape]] = {}
            for entry in self._in_streams():
                job = entry.job
                streams.setdefault((job.team, job.priority), set()).add((job.gpus, job.instances))
            return QueueState(
                running=running,
                bookings=list(self._bookings),
                waiting={p: waiting.get(p, 0) for p in Priority},
                gpus_held=sum(r.job.gpus for r in running),
                shortages_until=self._shortages_until,
                streams={key: frozenset(shapes) for key, shapes in streams.items()},
                nominees=list(self._nominees.values()),
                team_usage={team: dict(ledger) for team, ledger in self._ledgers.items()},
                holds=frozenset(e.held_on for e in self._waiting.values() if e.held_on),
            )

    def admit(
        self, entry: QueueEntry, job: RunningJob, limits: AdmissionLimits, *, waiting: bool = True
    ) -> bool:
        request = AdmissionRequest(entry, job, limits)
        if waiting:
            return self.admit_all([request]) == [job.job_id]
        with self._lock:
            self._transactions += 1
            if job.job_id in self._running or not self._still_queued(job.job_id):
                return False
            if not self._within(rooms([request])):
                return False
            self._running[job.job_id] = RunningEntry(job, entry.task_token, notified=False)
            return True

    def admit_all(self, requests: Sequence[AdmissionRequest]) -> list[str]:
        return admit_in_batches(requests, self._write_batch)

    def _write_batch(self, batch: list[AdmissionRequest]) -> BatchOutcome:
        """The batch's transaction, as DynamoDB's: refused past its limits, and all or
        nothing; each job's own items and each counter item checked."""
        keys: list[tuple[str, str]] = []
        for request in batch:
            job_id = request.job.job_id
            keys += [("entry", job_id), ("running", job_id)]
        keys += [("usage", "global"), *(("usage", team) for team in {r.job.team for r in batch})]
        check_transaction(keys, sum(admission_bytes(r) for r in batch))
        with self._lock:
            self._transactions += 1
            gone = frozenset(
                r.job.job_id
                for r in batch
                if r.job.job_id not in self._waiting
                or self._waiting[r.job.job_id].held_on is not None
                or r.job.job_id in self._running
            )
            room = rooms(batch)
            if gone or not self._within(room):
                return BatchOutcome(False, gone)
            for request in batch:
                job_id = request.job.job_id
                self._waiting.pop(job_id)
                self._nominees.pop(job_id, None)
                self._running[job_id] = RunningEntry(
                    request.job, request.entry.task_token, notified=False
                )
            return BatchOutcome(True)

    def _within(self, room: Rooms) -> bool:
        """Whether what the running jobs hold meets a batch's conditions (under the lock)."""
        held = [r.job for r in self._running.values()]
        if not room.possible:
            return False
        if sum(j.gpus for j in held) > room.gpus or sum(j.instances for j in held) > room.instances:
            return False
        return all(
            sum(j.gpus for j in held if j.team == team) <= team_room
            for team, team_room in room.teams.items()
        )

    def note_launch(self, job_id: str, hourly_usd: float, stop_at: float | None) -> None:
        with self._lock:
            entry = self._running.get(job_id)
            if entry is not None:
                job = replace(entry.job, hourly_usd=hourly_usd, stop_at=stop_at)
                self._running[job_id] = RunningEntry(job, entry.task_token, notified=True)

    def record_launch(self, change: StatusChange, hourly_usd: float, stop_at: float | None) -> bool:
        if self._jobs is None:
            raise ValueError("record_launch needs the job store")
        with self._lock:
            if change.job_id not in self._running:
                return False
            try:
                self._jobs.apply(change)
            except (IllegalTransition, JobNotFound):
                return False
            entry = self._running[change.job_id]
            job = replace(entry.job, hourly_usd=hourly_usd, stop_at=stop_at)
            self._running[change.job_id] = RunningEntry(job, entry.task_token, notified=True)
            return True

    def note_shortage(self, until: float) -> None:
        with self._lock:
            self._shortages_until = max(self._shortages_until, until)

    def record_release(
        self,
        change: StatusChange,
        share: RunningShare,
        charge: UsageCharge | None = None,
        *,
        settles: Collection[Dependency],
    ) -> Freed | None:
        if self._jobs is None:
            raise ValueError("record_release needs the job store")
        with self._lock:
            entry = self._running.get(change.job_id)
            held = entry and RunningShare(entry.job.team, entry.job.gpus, entry.job.instances)
            if held != share:
                return None
            try:
                self._jobs.apply(change)
            except (IllegalTransition, JobNotFound):
                return None
            del self._running[change.job_id]
            if charge is not None:
                add_charge(self._ledgers, share.team, charge)
            holds = frozenset(settles)
            dependants = any(e.held_on in holds for e in self._waiting.values())
            return Freed.OTHERS_WAIT if dependants or self._in_streams() else Freed.NOBODY_WAITS

    def mark_draining(self, job_id: str, for_job_id: str) -> bool:
        with self._lock:
            return self._mark_draining(job_id, for_job_id)

    def _mark_draining(self, job_id: str, for_job_id: str) -> bool:
        entry = self._running.get(job_id)
        if entry is None or entry.job.draining:
            return False
        job = replace(entry.job, draining_for=for_job_id)
        self._running[job_id] = RunningEntry(job, entry.task_token, entry.notified)
        return True

    def preempt(self, victim_id: str, for_job: QueuedJob) -> bool:
        with self._lock:
            if for_job.job_id not in self._waiting:
                return False
            if not self._mark_draining(victim_id, for_job.job_id):
                return False
            self._nominees[for_job.job_id] = for_job
            return True

    def charge(self, team: str, charge: UsageCharge) -> None:
        with self._lock:
            add_charge(self._ledgers, team, charge)

    def release(self, job_id: str, charge: UsageCharge | None = None) -> bool:
        with self._lock:
            entry = self._running.pop(job_id, None)
            if entry is not None and charge is not None:
                add_charge(self._ledgers, entry.job.team, charge)
            return entry is not None

    def remove(self, job_id: str) -> QueueEntry | None:
        with self._lock:
            self._nominees.pop(job_id, None)
            return self._waiting.pop(job_id, None)

    def book(self, booking: Booking, check: Callable[[list[Booking]], None]) -> None:
        with self._lock:  # checked and written under one lock: nothing books in between
            check(list(self._bookings))
            self._bookings.append(booking)

    def cancel_booking(self, booking_id: str) -> Booking | None:
        with self._lock:
            found = next((b for b in self._bookings if b.booking_id == booking_id), None)
            if found is not None:
                self._bookings.remove(found)
            return found

    def expire_bookings(self, now: float) -> list[Booking]:
        with self._lock:
            ended = [b for b in self._bookings if b.end <= now]
            self._bookings = [b for b in self._bookings if b.end > now]
            return ended

    def bookings(self) -> list[Booking]:
        with self._lock:
            return list(self._bookings)

    def first_notice(self, key: str) -> bool:
        with self._lock:
            if key in self._notices:
                return False
            self._notices.add(key)
            return True


@dataclass
class InMemoryMetrics:
    """Series as a test sets them; each batch read is kept, as GetMetricData's calls."""

    series: dict[SeriesQuery, list[tuple[float, float]]] = field(default_factory=dict)
    batches: list[MetricBatch] = field(default_factory=list)

    def read(self, batch: MetricBatch) -> dict[SeriesQuery, Series]:
        self.batches.append(batch)
        return {
            query: [
                (at, value) for at, value in self.series[query] if batch.start <= at <= batch.end
            ]
            for query in batch.queries
            if query in self.series
        }


@dataclass
class RecordingNotifier:
    sent: list[tuple[str, str]] = field(default_factory=list)
    # (topic ARN, subject, message): what went to the teams' topics.
    published: list[tuple[str, str, str]] = field(default_factory=list)

    def notify(self, subject: str, message: str) -> None:
        self.sent.append((subject, message))

    def publish(self, topic_arn: str, subject: str, message: str) -> None:
        self.published.append((topic_arn, subject, message))


def in_memory_ports(**overrides: Any) -> Ports:
    """Every port in memory (a manual clock, a fake fleet); `overrides` replace some."""
    jobs = overrides.get("jobs") or InMemoryJobStore()
    ports: dict[str, Any] = {
        "clock": ManualClock(),
        "jobs": jobs,
        "events": RecordingPublisher(),
        "objects": InMemoryObjects(),
        "workflow": RecordingWorkflow(),
        "fleet": FakeFleet(),
        "capacity": InMemoryCapacityMemory(),
        "queue": InMemoryJobQueue(jobs if isinstance(jobs, InMemoryJobStore) else None),
        "metrics": InMemoryMetrics(),
        "notifier": RecordingNotifier(),
        **overrides,
    }
    return Ports(**ports)
