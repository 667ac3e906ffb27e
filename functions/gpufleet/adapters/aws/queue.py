"""The admission queue on DynamoDB (one table, see docs/queues.md).

    pk            sk                                     what
    q#<team>      <3-rank>#<enqueued, 17 digits>#<job>   a waiting job
    waiting#<job> at                                     where a waiting job's entry is (kept
                                                         till its release once admitted)
    state         running#<job>                          an admitted job and its share
    state         usage#global                           GPUs and instances held; jobs waiting
                                                         per class
    state         usage#team#<team>                      GPUs the team holds; its jobs waiting
                                                         per class and shape; its fair-share
                                                         ledger (`fair#<entry>`: GPU-hours)
    state         nominee#<job>                          a waiting job that preempted others
    state         booking#<start, 17 digits>#<booking>   GPUs a team booked for a window
    state         shortage                               until when the latest capacity
                                                         shortage is remembered (the capacity
                                                         memory holds which offerings)
    state         hold#<on>#<dependency>[#element]       how many jobs are held on it (`held`)
    held#<on>#<dep>[#element] <order as q#>              a job held on that dependency, out of
                                                         the streams until it settles

Each team's waiting jobs have their own partition, sorted by class (critical first) and then
submission time, so every (team, class) pair is a stream already ordered by effective
priority: waiting longer raises every job of a class alike. A pass merges the streams lazily,
reading only as many items of each as it needs, and none of a stream whose shapes cannot be
admitted now (`decide_streams`).

Everything a pass needs besides the waiting jobs lives in the one `state` partition, so a pass
starts with a single query: the counters of waiting jobs per team, class and shape (kept in the
same transactions that add and remove waiting jobs) say which streams there are and what they
hold, without reading them.

A job that waits for a dependency is held apart (`QueueEntry.held_on`): in its dependency's own
partition, counted in that dependency's hold item, not in the waiting counters, so no stream
holds it and no pass reads it. A pass reads the holds with the state (one item a dependency,
however many jobs it holds) and moves the jobs of a settled one into their streams.
"""

from __future__ import annotations

import contextlib
import json
from collections import Counter
from collections.abc import Callable, Collection, Iterator, Sequence
from typing import Any

from pydantic import TypeAdapter

from gpufleet.adapters.admission_batches import (
    TRANSACTION_BYTES,
    TRANSACTION_ITEMS,
    BatchOutcome,
    admit_in_batches,
    check_transaction,
    rooms,
)
from gpufleet.adapters.aws.job_store import transition_write
from gpufleet.adapters.aws.transactions import (
    BACKOFF,
    Backoff,
    ConditionsFailed,
    transact,
    write,
    written,
)
from gpufleet.domain.fair_share import UsageCharge
from gpufleet.domain.job import JobStatus
from gpufleet.domain.queueing import (
    CLASS_RANK,
    Booking,
    QueuedJob,
    RunningJob,
    Shape,
)
from gpufleet.domain.spec import DEFAULT_EXPECTED_SECONDS, Dependency, DependencyMode, Priority
from gpufleet.errors import ConditionFailed, TransientError
from gpufleet.ports import (
    AdmissionLimits,
    AdmissionRequest,
    Freed,
    QueueEntry,
    QueueState,
    RunningEntry,
    RunningShare,
    StatusChange,
)
from gpufleet.topology import QUEUE_STATE_PARTITION

# A stream's first page is small (most passes take a job or two of a stream, or find its head
# blocked); each later page is twice as large, up to PAGE: what a pass reads past what it takes
# stays below what it takes, in few queries.
FIRST_PAGE = 2
PAGE = 25
_STATE = QUEUE_STATE_PARTITION
_RUNNING = "running#"
_GLOBAL = "usage#global"
_TEAM = "usage#team#"
_NOMINEE = "nominee#"
_BOOKING = "booking#"
_LEDGER = "ledger#bookings"  # the bookings' version, which every new booking bumps
BOOKING_TRIES = 5
_SHORTAGE = "shortage"
_QUEUE = "q#"
_LOCATOR_SK = "at"
# Notices sent once (a team over its monthly budget): apart, so passes never read them.
_NOTICES = "notices"
_PRIORITIES = sorted(Priority, key=lambda p: CLASS_RANK[p])
_HOLD = "hold#"  # in the state partition: a dependency's count of jobs held on it
_HELD = "held#"  # the partition of the jobs held on one dependency
_HELD_COUNTER = "held"


def _waiting_counter(priority: Priority) -> str:
    return f"waiting_{priority.value}"


_SHAPE_COUNTER = "waiting#"
# On the team's usage item: its fair-share ledger's entries (`domain.fair_share`), each only
# ever added to (an atomic ADD in the write that releases a run's share).
_LEDGER_ENTRY = "fair#"


def _shape_counter(job: QueuedJob) -> str:
    """On the team's usage item: how many of its jobs of this class and shape wait."""
    return f"{_SHAPE_COUNTER}{job.priority.value}#{job.gpus}#{job.instances}"


def _queue_partition(team: str) -> str:
    return f"{_QUEUE}{team}"


def _locator(job_id: str) -> dict[str, dict[str, str]]:
    return {"pk": _s(f"waiting#{job_id}"), "sk": _s(_LOCATOR_SK)}


def _locator_item(entry_item: dict[str, dict[str, str]]) -> dict[str, dict[str, str]]:
    """Where the entry is, found from its job id alone (to take it out of the queue)."""
    return {
        **_locator(entry_item["job_id"]["S"]),
        "entry_pk": entry_item["pk"],
        "entry_sk": entry_item["sk"],
    }


# A counter update of a batch of new waiting jobs weighs less than this, in bytes.
_COUNTERS_BYTES = 1024


def _counters(entry: QueueEntry) -> tuple[tuple[str, str], ...]:
    """The counters a waiting job counts in, as (sk, counter): its class's (global), and its
    team's, class's and shape's (on the team's usage item); a held one, its hold's alone."""
    if entry.held_on is not None:
        return ((_HOLD + _hold_name(entry.held_on), _HELD_COUNTER),)
    job = entry.job
    return ((_GLOBAL, _waiting_counter(job.priority)), (_TEAM + job.team, _shape_counter(job)))


def _hold_name(dependency: Dependency) -> str:
    name = f"{dependency.on}#{dependency.job}"
    return name if dependency.mode is DependencyMode.ALL else f"{name}#{dependency.mode.value}"


def _hold_of(name: str) -> Dependency:
    on, job, *mode = name.split("#")
    return Dependency.model_validate({"job": job, "on": on, "mode": mode[0] if mode else "all"})


def _held_partition(dependency: Dependency) -> str:
    return _HELD + _hold_name(dependency)


def order_key(job: QueuedJob) -> str:
    return f"{3 - CLASS_RANK[job.priority]}#{job.enqueued_at:017.6f}#{job.job_id}"


def _entry_key(job: QueuedJob) -> dict[str, dict[str, str]]:
    return {"pk": _s(_queue_partition(job.team)), "sk": _s(order_key(job))}


def _s(value: str) -> dict[str, str]:
    return {"S": value}


def _n(value: float) -> dict[str, str]:
    return {"N": repr(value) if isinstance(value, float) else str(value)}


def _entry_item(entry: QueueEntry) -> dict[str, dict[str, str]]:
    """A waiting job's entry: in its stream, or in the partition of the dependency it is held on
    (in the same order)."""
    item = {
        **_job_attributes(entry.job),
        "task_token": _s(entry.task_token),
        "queued_at": _n(entry.queued_at),
    }
    if entry.held_on is not None:
        item["pk"] = _s(_held_partition(entry.held_on))
        item["held_on"] = _s(_hold_name(entry.held_on))
    return item


# A waiting job's dependencies, in its entry as one JSON string (few, and read together).
_DEPENDENCIES: TypeAdapter[tuple[Dependency, ...]] = TypeAdapter(tuple[Dependency, ...])


def _job_attributes(job: QueuedJob) -> dict[str, dict[str, str]]:
    """A waiting job as its entry (and its nominee item) store it."""
    item = {
        **_entry_key(job),
        "job_id": _s(job.job_id),
        "team": _s(job.team),
        "priority": _s(job.priority.value),
        "gpus": _n(job.gpus),
        "instances": _n(job.instances),
        "enqueued_at": _n(job.enqueued_at),
        "preemptions": _n(job.preemptions),
        "estimated_cost_usd": _n(float(job.estimated_cost_usd)),
        "expected_seconds": _n(float(job.expected_seconds)),
    }
    if job.preempted_for:
        item["preempted_for"] = _s(job.preempted_for)
    if job.depends_on:
        item["depends_on"] = _s(_DEPENDENCIES.dump_json(job.depends_on).decode())
    if job.not_before is not None:
        item["not_before"] = _n(job.not_before)
    if job.array_index is not None:
        item["array_index"] = _n(job.array_index)
    return item


def _entry(item: dict[str, Any]) -> QueueEntry:
    return QueueEntry(
        job=_queued_job(item),
        task_token=item["task_token"]["S"],
        queued_at=float(item["queued_at"]["N"]),
        held_on=_hold_of(item["held_on"]["S"]) if "held_on" in item else None,
    )


def _queued_job(item: dict[str, Any]) -> QueuedJob:
    return QueuedJob(
        job_id=item["job_id"]["S"],
        team=item["team"]["S"],
        priority=Priority(item["priority"]["S"]),
        gpus=int(item["gpus"]["N"]),
        instances=int(item["instances"]["N"]),
        enqueued_at=float(item["enqueued_at"]["N"]),
        preempted_for=item.get("preempted_for", {}).get("S"),
        preemptions=int(item.get("preemptions", {}).get("N", "0")),
        estimated_cost_usd=float(item.get("estimated_cost_usd", {}).get("N", "0")),
        expected_seconds=float(
            item.get("expected_seconds", {}).get("N", str(DEFAULT_EXPECTED_SECONDS))
        ),
        depends_on=_DEPENDENCIES.validate_json(item.get("depends_on", {}).get("S", "[]")),
        not_before=float(item["not_before"]["N"]) if "not_before" in item else None,
        array_index=int(item["array_index"]["N"]) if "array_index" in item else None,
    )


def _running(item: dict[str, Any]) -> RunningEntry:
    job = RunningJob(
        job_id=item["sk"]["S"].removeprefix(_RUNNING),
        team=item["team"]["S"],
        priority=Priority(item["priority"]["S"]),
        gpus=int(item["gpus"]["N"]),
        instances=int(item["instances"]["N"]),
        admitted_at=float(item["admitted_at"]["N"]),
        borrowed=item["borrowed"]["BOOL"],
        in_reserve=item["in_reserve"]["BOOL"],
        draining_for=item.get("draining_for", {}).get("S"),
        stop_at=float(item["stop_at"]["N"]) if "stop_at" in item else None,
        hourly_usd=float(item.get("hourly_usd", {}).get("N", "0")),
        preemptions=int(item.get("preemptions", {}).get("N", "0")),
        expected_end=float(item["expected_end"]["N"]) if "expected_end" in item else None,
    )
    return RunningEntry(
        job=job, task_token=item["task_token"]["S"], notified=item["notified"]["BOOL"]
    )


class BookingContended(TransientError):
    """Other bookings kept going in while this one was checked: nothing was booked."""


class DynamoJobQueue:
    def __init__(
        self,
        client: Any,
        table_name: str,
        jobs_table: str | None = None,
        backoff: Backoff = BACKOFF,
    ) -> None:
        """`jobs_table`: the job store's table, whose job records the writes that put a job in
        the queue (or admit it straight away) check: a job that ended meanwhile (cancelled) is
        neither queued nor admitted. Without it, those writes do not look at the job.
        `backoff`: how writes that DynamoDB refused for throughput or for another writer are
        tried again (see `transactions`)."""
        self._client = client
        self._table = table_name
        self._jobs_table = jobs_table
        self._backoff = backoff
        self._items_read = 0
        self._transactions = 0

    def items_read(self) -> int:
        return self._items_read

    def transactions(self) -> int:
        return self._transactions

    def _query(self, **kwargs: Any) -> Iterator[dict[str, Any]]:
        kwargs["TableName"] = self._table
        while True:
            page = self._client.query(**kwargs)
            self._items_read += len(page.get("Items", []))
            yield from page.get("Items", [])
            if "LastEvaluatedKey" not in page:
                return
            kwargs["ExclusiveStartKey"] = page["LastEvaluatedKey"]

    # -- waiting jobs --------------------------------------------------------------------------

    def _still_queued(self, job_id: str) -> list[dict[str, Any]]:
        """The check that the job is still QUEUED in the job store (not cancelled meanwhile)."""
        if self._jobs_table is None:
            return []
        return [
            {
                "ConditionCheck": {
                    "TableName": self._jobs_table,
                    "Key": {"job_id": _s(job_id)},
                    "ConditionExpression": "#status = :queued",
                    "ExpressionAttributeNames": {"#status": "status"},
                    "ExpressionAttributeValues": {":queued": _s(JobStatus.QUEUED.value)},
                }
            }
        ]

    def enqueue(self, entry: QueueEntry) -> bool:
        # A requeued job keeps its submission time, so its key (and place) are the same.
        own = self._waits(entry)
        items = [*own, *self._count_entry(entry, +1)]
        try:
            self._transact(items)
        except ConditionsFailed as cancelled:
            still_queued = self._jobs_table is not None
            if still_queued and cancelled.failed(len(own) - 1):
                return False  # the job ended meanwhile
            # A repeated step (its earlier attempt crashed after writing): the job waits
            # already (the entry's condition failed) or was admitted (the running entry's): only
            # the token changes.
            if not self._hand_admission_to(entry):
                self._write(self._client.put_item, TableName=self._table, Item=_entry_item(entry))
        return True

    def enqueue_all(self, entries: Sequence[QueueEntry]) -> None:
        _in_transactions(entries, self._waits, _counters, self._enqueue_batch)

    def _enqueue_batch(self, batch: list[QueueEntry], own: list[dict[str, Any]]) -> None:
        """New waiting jobs' items and their counters in one transaction. When one of them
        waits, was admitted or ended already (a repeated delivery), nothing of the batch is
        written: each then goes as `enqueue` decides."""
        counted = Counter(key for entry in batch for key in _counters(entry))
        items = [*own, *self._count_all(counted)]
        check_transaction([_item_key(item) for item in items], len(json.dumps(items)))
        try:
            self._transact(items)
        except ConditionsFailed:
            for entry in batch:
                self.enqueue(entry)

    def move_held(self, dependency: Dependency, entries: Sequence[QueueEntry]) -> int:
        moved = 0

        def counters(entry: QueueEntry) -> tuple[tuple[str, str], ...]:
            return ((_HOLD + _hold_name(dependency), _HELD_COUNTER), *_counters(entry))

        def write(batch: list[QueueEntry], own: list[dict[str, Any]]) -> None:
            nonlocal moved
            moved += self._move_batch(dependency, batch, own)

        staying = [e for e in entries if e.held_on != dependency]  # moved nowhere
        _in_transactions(staying, lambda e: self._moves(dependency, e), counters, write)
        return moved

    def _moves(self, dependency: Dependency, entry: QueueEntry) -> list[dict[str, Any]]:
        """A held job's own items of a move: its held entry leaves (it must still be there),
        its new entry goes in (new), its locator follows it."""
        item = _entry_item(entry)
        held = {"pk": _s(_held_partition(dependency)), "sk": _s(order_key(entry.job))}
        leaves = {
            "TableName": self._table,
            "Key": held,
            "ConditionExpression": "attribute_exists(pk)",
        }
        put = {
            "TableName": self._table,
            "Item": item,
            "ConditionExpression": "attribute_not_exists(pk)",
        }
        locator = {"TableName": self._table, "Item": _locator_item(item)}
        return [{"Delete": leaves}, {"Put": put}, {"Put": locator}]

    def _move_batch(
        self, dependency: Dependency, batch: list[QueueEntry], own: list[dict[str, Any]]
    ) -> int:
        """A batch of moves and their counters in one transaction: how many moved. When one of
        them left the hold meanwhile, nothing of the batch is written, and each goes alone."""
        counted: Counter[tuple[str, str]] = Counter()
        for entry in batch:
            counted[(_HOLD + _hold_name(dependency), _HELD_COUNTER)] -= 1
            counted.update(_counters(entry))
        items = [*own, *self._count_all(counted)]
        check_transaction([_item_key(item) for item in items], len(json.dumps(items)))
        try:
            self._transact(items)
        except ConditionsFailed:
            if len(batch) == 1:
                return 0  # moved by another pass, or removed
            return sum(self._move_batch(dependency, [e], self._moves(dependency, e)) for e in batch)
        return len(batch)

    def forget_hold(self, dependency: Dependency) -> bool:
        try:
            self._write(self._client.delete_item, **self._holds_none(dependency))
        except ConditionFailed:
            return False
        return True

    def _waits(self, entry: QueueEntry) -> list[dict[str, Any]]:
        """A new waiting job's own items of `enqueue`'s transaction: its entry (new), the check
        that it was not admitted, its locator and the check that it is still QUEUED."""
        item = _entry_item(entry)
        put = {
            "TableName": self._table,
            "Item": item,
            "ConditionExpression": "attribute_not_exists(pk)",
        }
        not_admitted = {
            "ConditionCheck": {
                "TableName": self._table,
                "Key": {"pk": _s(_STATE), "sk": _s(_RUNNING + entry.job.job_id)},
                "ConditionExpression": "attribute_not_exists(pk)",
            }
        }
        locator = {"Put": {"TableName": self._table, "Item": _locator_item(item)}}
        return [{"Put": put}, not_admitted, locator, *self._still_queued(entry.job.job_id)]

    def _hand_admission_to(self, entry: QueueEntry) -> bool:
        """The job was admitted under the token of an attempt that crashed, whose workflow no
        longer waits: the admission is this attempt's now, and the next pass tells it. False
        when the job was not admitted (it waits)."""
        try:
            self._write(
                self._client.update_item,
                TableName=self._table,
                Key={"pk": _s(_STATE), "sk": _s(_RUNNING + entry.job.job_id)},
                UpdateExpression="SET task_token = :token, notified = :no",
                ConditionExpression="attribute_exists(pk)",
                ExpressionAttributeValues={":token": _s(entry.task_token), ":no": {"BOOL": False}},
            )
        except ConditionFailed:
            return False
        return True

    def _transact(self, items: list[dict[str, Any]]) -> None:
        """See `transact`: written, or `ConditionsFailed` naming each item's reason."""
        self._transactions += 1
        transact(self._client, items, self._backoff)

    def _written(self, items: list[dict[str, Any]]) -> bool:
        """See `written`: False when a condition failed."""
        self._transactions += 1
        return written(self._client, items, self._backoff)

    def _write(self, operation: Callable[..., dict[str, Any]], **request: Any) -> dict[str, Any]:
        """See `write`: one item, or `ConditionFailed`."""
        return write(operation, self._backoff, **request)

    def _count_entry(self, entry: QueueEntry, change: int) -> list[dict[str, Any]]:
        """The counters the waiting job counts in (`_counters`), changed by `change`."""
        return self._count_all(Counter(dict.fromkeys(_counters(entry), change)))

    def _count_all(self, changes: Counter[tuple[str, str]]) -> list[dict[str, Any]]:
        """One update per counter item (sk) of `changes` ((sk, counter) -> change), adding
        each change to its counter."""
        updates: dict[str, dict[str, Any]] = {}
        for index, ((sk, counter), change) in enumerate(sorted(changes.items())):
            update = updates.setdefault(
                sk,
                {
                    "TableName": self._table,
                    "Key": {"pk": _s(_STATE), "sk": _s(sk)},
                    "UpdateExpression": "ADD ",
                    "ExpressionAttributeNames": {},
                    "ExpressionAttributeValues": {},
                },
            )
            separator = ", " if update["ExpressionAttributeNames"] else ""
            update["UpdateExpression"] += f"{separator}#c{index} :c{index}"
            update["ExpressionAttributeNames"][f"#c{index}"] = counter
            update["ExpressionAttributeValues"][f":c{index}"] = _n(change)
        return [{"Update": update} for update in updates.values()]

    def state(self) -> QueueState:
        running: list[RunningEntry] = []
        bookings: list[Booking] = []
        waiting: dict[Priority, int] = {}
        streams: dict[tuple[str, Priority], set[Shape]] = {}
        nominees: list[QueuedJob] = []
        team_usage: dict[str, dict[str, float]] = {}
        holds: set[Dependency] = set()
        gpus_held = 0
        shortages_until = 0.0
        for item in self._query(
            KeyConditionExpression="pk = :pk", ExpressionAttributeValues={":pk": _s(_STATE)}
        ):
            sk = item["sk"]["S"]
            if sk.startswith(_RUNNING):
                running.append(_running(item))
            elif sk.startswith(_TEAM):
                team = sk.removeprefix(_TEAM)
                for (priority, shape), count in _shape_counts(item).items():
                    if count > 0:
                        streams.setdefault((team, priority), set()).add(shape)
                ledger = _ledger(item)
                if ledger:
                    team_usage[team] = ledger
            elif sk.startswith(_NOMINEE):
                nominees.append(_queued_job(item))
            elif sk.startswith(_BOOKING):
                bookings.append(_booking(item))
            elif sk.startswith(_HOLD):
                if int(item.get(_HELD_COUNTER, {}).get("N", "0")) > 0:
                    holds.add(_hold_of(sk.removeprefix(_HOLD)))
            elif sk == _SHORTAGE:
                shortages_until = float(item["until"]["N"])
            elif sk == _GLOBAL:
                gpus_held = int(item.get("gpus", {}).get("N", "0"))
                for priority in _PRIORITIES:
                    count = int(item.get(_waiting_counter(priority), {}).get("N", "0"))
                    waiting[priority] = max(0, count)
        admitted = {r.job.job_id for r in running}
        return QueueState(
            running=running,
            bookings=bookings,
            waiting=waiting,
            gpus_held=gpus_held,
            shortages_until=shortages_until,
            streams={key: frozenset(shapes) for key, shapes in streams.items()},
            # A nominee admitted keeps its item until its release (`_leaving`): not a nominee.
            nominees=[job for job in nominees if job.job_id not in admitted],
            team_usage=team_usage,
            holds=frozenset(holds),
        )

    def waiting(self) -> list[QueueEntry]:
        state = self.state()
        partitions = [_queue_partition(team) for team in sorted({t for t, _ in state.streams})]
        partitions += sorted(_held_partition(dependency) for dependency in state.holds)
        return [
            _entry(item)
            for partition in partitions
            for item in self._query(
                KeyConditionExpression="pk = :pk",
                ExpressionAttributeValues={":pk": _s(partition)},
            )
        ]

    def stream(self, team: str, priority: Priority) -> Iterator[QueueEntry]:
        return self._pages(
            {
                "KeyConditionExpression": "pk = :pk AND begins_with(sk, :class)",
                "ExpressionAttributeValues": {
                    ":pk": _s(_queue_partition(team)),
                    ":class": _s(f"{3 - CLASS_RANK[priority]}#"),
                },
            }
        )

    def held(self, dependency: Dependency) -> Iterator[QueueEntry]:
        return self._pages(
            {
                "KeyConditionExpression": "pk = :pk",
                "ExpressionAttributeValues": {":pk": _s(_held_partition(dependency))},
            }
        )

    def _pages(self, query: dict[str, Any]) -> Iterator[QueueEntry]:
        """The entries a query finds, a page at a time as the iterator is advanced: the first
        small, each next twice as large up to PAGE."""
        kwargs: dict[str, Any] = {"TableName": self._table, **query, "Limit": FIRST_PAGE}
        while True:
            page = self._client.query(**kwargs)
            items = page.get("Items", [])
            self._items_read += len(items)
            yield from (_entry(item) for item in items)
            if "LastEvaluatedKey" not in page:
                return
            kwargs.update(
                ExclusiveStartKey=page["LastEvaluatedKey"], Limit=min(PAGE, 2 * kwargs["Limit"])
            )

    def waiting_entry(self, job: QueuedJob) -> QueueEntry | None:
        item = self._client.get_item(
            TableName=self._table, Key=_entry_key(job), ConsistentRead=True
        ).get("Item")
        self._items_read += item is not None
        return None if item is None else _entry(item)

    def remove(self, job_id: str) -> QueueEntry | None:
        locator = self._client.get_item(
            TableName=self._table, Key=_locator(job_id), ConsistentRead=True
        ).get("Item")
        if locator is None:
            return None
        key = {"pk": locator["entry_pk"], "sk": locator["entry_sk"]}
        item = self._client.get_item(TableName=self._table, Key=key, ConsistentRead=True).get(
            "Item"
        )
        if item is None:
            return None  # admitted or removed meanwhile
        entry = _entry(item)
        delete = {
            "TableName": self._table,
            "Key": key,
            "ConditionExpression": "attribute_exists(pk)",
        }
        leaves = [
            {"Delete": delete},
            *self._leaving(entry.job.job_id),
            *self._count_entry(entry, -1),
        ]
        if not self._written(leaves):
            return None  # admitted or removed by someone else meanwhile
        return entry

    def _leaving(self, job_id: str) -> list[dict[str, Any]]:
        """What goes with a job's entry when it is removed from the queue, and with its running
        item when it is released: its locator, and its nominee item if it has one. (An
        admission leaves them: it writes only the entry and the running item, so that a
        transaction holds as many admissions as it can; a job released holds no entry, so
        neither is of use any more, and until then `remove` finds no entry at the locator and
        `state` no nominee in a running job.)"""
        return [
            {"Delete": {"TableName": self._table, "Key": key}}
            for key in (_locator(job_id), {"pk": _s(_STATE), "sk": _s(_NOMINEE + job_id)})
        ]

    # -- running jobs --------------------------------------------------------------------------

    def running(self) -> list[RunningEntry]:
        return self.state().running

    def admit(
        self, entry: QueueEntry, job: RunningJob, limits: AdmissionLimits, *, waiting: bool = True
    ) -> bool:
        batch = [AdmissionRequest(entry, job, limits)]
        if not rooms(batch).possible:
            return False
        items, _ = self._admission_items(batch, waiting=waiting)
        return self._written(items)

    def admit_all(self, requests: Sequence[AdmissionRequest]) -> list[str]:
        return admit_in_batches(requests, self._write_batch)

    def _write_batch(self, batch: list[AdmissionRequest]) -> BatchOutcome:
        items, owners = self._admission_items(batch, waiting=True)
        try:
            self._transact(items)
        except ConditionsFailed as cancelled:
            gone = {owners[p] for p in cancelled.failed_positions}
            return BatchOutcome(False, frozenset(job_id for job_id in gone if job_id))
        return BatchOutcome(True)

    def _admission_items(
        self, batch: list[AdmissionRequest], *, waiting: bool
    ) -> tuple[list[dict[str, Any]], list[str | None]]:
        """The transaction that admits the batch, and whose each item is (a job's own, or None:
        a counter's). Each job's own: with `waiting`, its entry leaves the queue (it must still
        be there: the proof that it still waits); without, its job record must still say QUEUED
        (admitted as it arrives, never queued); and its running item is put (it must not
        exist). Then one update per counter item: the batch's GPUs and instances added,
        conditioned on `rooms`, and with `waiting`, its jobs counted out of the waiting counters
        of their classes and shapes."""
        room = rooms(batch)
        items: list[dict[str, Any]] = []
        owners: list[str | None] = []
        for request in batch:
            own = [*self._leaves(request.entry.job, waiting), self._running_put(request)]
            items += own
            owners += [request.job.job_id] * len(own)
        usage: dict[str, Any] = {
            "TableName": self._table,
            "Key": {"pk": _s(_STATE), "sk": _s(_GLOBAL)},
            "UpdateExpression": "ADD gpus :gpus, instances :instances",
            "ConditionExpression": (
                "attribute_not_exists(gpus) OR (gpus <= :gpu_room AND instances <= :instance_room)"
            ),
            "ExpressionAttributeValues": {
                ":gpus": _n(room.gpus_added),
                ":instances": _n(room.instances_added),
                ":gpu_room": _n(room.gpus),
                ":instance_room": _n(room.instances),
            },
        }
        updates = {_GLOBAL: usage}
        for team, gpus in room.team_gpus_added.items():
            team_update: dict[str, Any] = {
                "TableName": self._table,
                "Key": {"pk": _s(_STATE), "sk": _s(_TEAM + team)},
                "UpdateExpression": "ADD gpus :gpus",
                "ExpressionAttributeValues": {":gpus": _n(gpus)},
            }
            if team in room.teams:
                team_update["ConditionExpression"] = "attribute_not_exists(gpus) OR gpus <= :room"
                team_update["ExpressionAttributeValues"][":room"] = _n(room.teams[team])
            updates[_TEAM + team] = team_update
        if waiting:
            counted: Counter[tuple[str, str]] = Counter()
            for request in batch:
                queued = request.entry.job
                counted[(_GLOBAL, _waiting_counter(queued.priority))] += 1
                counted[(_TEAM + queued.team, _shape_counter(queued))] += 1
            for index, ((sk, counter), count) in enumerate(sorted(counted.items())):
                update = updates[sk]
                update["UpdateExpression"] += f", #w{index} :w{index}"
                update.setdefault("ExpressionAttributeNames", {})[f"#w{index}"] = counter
                update["ExpressionAttributeValues"][f":w{index}"] = _n(-count)
        items += [{"Update": update} for update in updates.values()]
        owners += [None] * len(updates)
        keys = [_item_key(item) for item in items]
        check_transaction(keys, len(json.dumps(items)))
        return items, owners

    def _leaves(self, queued: QueuedJob, waiting: bool) -> list[dict[str, Any]]:
        if not waiting:
            return self._still_queued(queued.job_id)
        delete = {
            "TableName": self._table,
            "Key": _entry_key(queued),
            "ConditionExpression": "attribute_exists(pk)",
        }
        return [{"Delete": delete}]

    def _running_put(self, request: AdmissionRequest) -> dict[str, Any]:
        job = request.job
        return {
            "Put": {
                "TableName": self._table,
                "Item": {
                    "pk": _s(_STATE),
                    "sk": _s(_RUNNING + job.job_id),
                    "team": _s(job.team),
                    "priority": _s(job.priority.value),
                    "gpus": _n(job.gpus),
                    "instances": _n(job.instances),
                    "admitted_at": _n(job.admitted_at),
                    "borrowed": {"BOOL": job.borrowed},
                    "in_reserve": {"BOOL": job.in_reserve},
                    "preemptions": _n(job.preemptions),
                    **(
                        {"expected_end": _n(job.expected_end)}
                        if job.expected_end is not None
                        else {}
                    ),
                    "notified": {"BOOL": False},
                    "task_token": _s(request.entry.task_token),
                },
                "ConditionExpression": "attribute_not_exists(pk)",
            }
        }

    def _launch_note(self, job_id: str, hourly_usd: float, stop_at: float | None) -> dict[str, Any]:
        values: dict[str, Any] = {":yes": {"BOOL": True}, ":hourly": _n(hourly_usd)}
        expression = "SET notified = :yes, hourly_usd = :hourly"
        if stop_at is not None:
            expression += ", stop_at = :at"
            values[":at"] = _n(stop_at)
        return {
            "TableName": self._table,
            "Key": {"pk": _s(_STATE), "sk": _s(_RUNNING + job_id)},
            "UpdateExpression": expression,
            "ConditionExpression": "attribute_exists(pk)",
            "ExpressionAttributeValues": values,
        }

    def record_launch(self, change: StatusChange, hourly_usd: float, stop_at: float | None) -> bool:
        if self._jobs_table is None:
            raise ValueError("record_launch needs the job store's table")
        note = self._launch_note(change.job_id, hourly_usd, stop_at)
        return self._written(
            [{"Update": transition_write(self._jobs_table, change)}, {"Update": note}]
        )

    def note_launch(self, job_id: str, hourly_usd: float, stop_at: float | None) -> None:
        with contextlib.suppress(ConditionFailed):  # released meanwhile: nothing left to note
            self._write(self._client.update_item, **self._launch_note(job_id, hourly_usd, stop_at))

    def note_shortage(self, until: float) -> None:
        with contextlib.suppress(ConditionFailed):  # a later shortage is noted already
            self._write(
                self._client.update_item,
                TableName=self._table,
                Key={"pk": _s(_STATE), "sk": _s(_SHORTAGE)},
                UpdateExpression="SET #until = :until",
                ConditionExpression="attribute_not_exists(#until) OR #until < :until",
                ExpressionAttributeNames={"#until": "until"},
                ExpressionAttributeValues={":until": _n(until)},
            )

    def _draining(self, job_id: str, for_job_id: str) -> dict[str, Any]:
        return {
            "TableName": self._table,
            "Key": {"pk": _s(_STATE), "sk": _s(_RUNNING + job_id)},
            "UpdateExpression": "SET draining_for = :for",
            "ConditionExpression": "attribute_exists(pk) AND attribute_not_exists(draining_for)",
            "ExpressionAttributeValues": {":for": _s(for_job_id)},
        }

    def mark_draining(self, job_id: str, for_job_id: str) -> bool:
        try:
            self._write(self._client.update_item, **self._draining(job_id, for_job_id))
        except ConditionFailed:
            return False
        return True

    def preempt(self, victim_id: str, for_job: QueuedJob) -> bool:
        still_waits = {
            "TableName": self._table,
            "Key": _entry_key(for_job),
            "ConditionExpression": "attribute_exists(pk)",
        }
        nominee = {
            **_job_attributes(for_job),
            "pk": _s(_STATE),
            "sk": _s(_NOMINEE + for_job.job_id),
        }
        return self._written(
            [
                {"Update": self._draining(victim_id, for_job.job_id)},
                {"ConditionCheck": still_waits},
                {"Put": {"TableName": self._table, "Item": nominee}},
            ]
        )

    def record_release(
        self,
        change: StatusChange,
        share: RunningShare,
        charge: UsageCharge | None = None,
        *,
        settles: Collection[Dependency],
    ) -> Freed | None:
        if self._jobs_table is None:
            raise ValueError("record_release needs the job store's table")
        job_id = change.job_id
        nobody_waits = " AND ".join(
            f"(attribute_not_exists(#w{i}) OR #w{i} <= :zero)" for i in range(len(_PRIORITIES))
        )
        usage: dict[str, Any] = {
            "TableName": self._table,
            "Key": {"pk": _s(_STATE), "sk": _s(_GLOBAL)},
            "UpdateExpression": "ADD gpus :gpus, instances :instances",
            "ConditionExpression": nobody_waits,
            "ExpressionAttributeNames": {
                f"#w{i}": _waiting_counter(p) for i, p in enumerate(_PRIORITIES)
            },
            "ExpressionAttributeValues": {
                ":gpus": _n(-share.gpus),
                ":instances": _n(-share.instances),
                ":zero": _n(0),
            },
        }
        items: list[dict[str, Any]] = [
            {"Update": transition_write(self._jobs_table, change)},
            {
                "Delete": {
                    "TableName": self._table,
                    "Key": {"pk": _s(_STATE), "sk": _s(_RUNNING + job_id)},
                    "ConditionExpression": (
                        "attribute_exists(pk) AND team = :team AND gpus = :gpus"
                        " AND instances = :instances"
                    ),
                    "ExpressionAttributeValues": {
                        ":team": _s(share.team),
                        ":gpus": _n(share.gpus),
                        ":instances": _n(share.instances),
                    },
                }
            },
            {"Update": usage},
            self._team_usage(share.team, -share.gpus, charge),
            *self._leaving(job_id),
        ]
        # Whether jobs wait for the share (the usage's condition) or are held on this end (a
        # check of each hold it may settle, absent or holding none): asked in the same write,
        # so that an end nobody waits on wakes no pass.
        asks = {2, *range(len(items), len(items) + len(settles))}
        holds = [{"ConditionCheck": self._holds_none(d)} for d in sorted(settles, key=_hold_name)]
        try:
            self._transact([*items, *holds])
        except ConditionsFailed as cancelled:
            if not cancelled.failed_positions <= asks:
                return None  # the job or its share is not as the caller saw it
        else:
            return Freed.NOBODY_WAITS
        # Jobs wait or are held (only those conditions failed): the same write without asking,
        # and a pass is to be woken.
        usage.pop("ConditionExpression")
        usage.pop("ExpressionAttributeNames")
        usage["ExpressionAttributeValues"].pop(":zero")
        return Freed.OTHERS_WAIT if self._written(items) else None

    def _holds_none(self, dependency: Dependency) -> dict[str, Any]:
        """The hold on `dependency`, on condition that it holds no job (absent, or emptied)."""
        return {
            "TableName": self._table,
            "Key": {"pk": _s(_STATE), "sk": _s(_HOLD + _hold_name(dependency))},
            "ConditionExpression": "attribute_not_exists(#held) OR #held <= :zero",
            "ExpressionAttributeNames": {"#held": _HELD_COUNTER},
            "ExpressionAttributeValues": {":zero": _n(0)},
        }

    def _team_usage(
        self, team: str, gpus: int, charge: UsageCharge | None = None
    ) -> dict[str, Any]:
        update: dict[str, Any] = {
            "TableName": self._table,
            "Key": {"pk": _s(_STATE), "sk": _s(_TEAM + team)},
            "UpdateExpression": "ADD gpus :gpus",
            "ExpressionAttributeValues": {":gpus": _n(gpus)},
        }
        if charge is not None:
            update["UpdateExpression"] += ", #entry :amount"
            update["ExpressionAttributeNames"] = {"#entry": _LEDGER_ENTRY + charge.key}
            update["ExpressionAttributeValues"][":amount"] = _n(charge.amount)
        return {"Update": update}

    def charge(self, team: str, charge: UsageCharge) -> None:
        update = self._team_usage(team, 0, charge)["Update"]
        self._write(self._client.update_item, **update)

    def release(self, job_id: str, charge: UsageCharge | None = None) -> bool:
        response = self._client.get_item(
            TableName=self._table,
            Key={"pk": _s(_STATE), "sk": _s(_RUNNING + job_id)},
            ConsistentRead=True,
        )
        item = response.get("Item")
        if item is None:
            return False
        gpus, instances = int(item["gpus"]["N"]), int(item["instances"]["N"])
        return self._written(
            [
                {
                    "Delete": {
                        "TableName": self._table,
                        "Key": {"pk": _s(_STATE), "sk": _s(_RUNNING + job_id)},
                        "ConditionExpression": "attribute_exists(pk)",
                    }
                },
                {
                    "Update": {
                        "TableName": self._table,
                        "Key": {"pk": _s(_STATE), "sk": _s(_GLOBAL)},
                        "UpdateExpression": "ADD gpus :gpus, instances :instances",
                        "ExpressionAttributeValues": {
                            ":gpus": _n(-gpus),
                            ":instances": _n(-instances),
                        },
                    }
                },
                self._team_usage(item["team"]["S"], -gpus, charge),
                *self._leaving(job_id),
            ]
        )  # False: released by someone else in the meantime

    # -- bookings ------------------------------------------------------------------------------

    def book(self, booking: Booking, check: Callable[[list[Booking]], None]) -> None:
        # Optimistic concurrency on the bookings ledger: every booking bumps its version, and
        # is written only if the version is still the one read with the bookings it was checked
        # against. Of two bookings made at once, the second is checked again, against the first.
        for _ in range(BOOKING_TRIES):
            ledger = self._client.get_item(
                TableName=self._table,
                Key={"pk": _s(_STATE), "sk": _s(_LEDGER)},
                ConsistentRead=True,
            ).get("Item", {})
            seen = int(ledger.get("version", {}).get("N", "0"))
            check([_booking(item) for item in self._booking_items()])
            ledger_write = {
                "Update": {
                    "TableName": self._table,
                    "Key": {"pk": _s(_STATE), "sk": _s(_LEDGER)},
                    "UpdateExpression": "SET version = :next",
                    "ConditionExpression": "attribute_not_exists(version) OR version = :seen",
                    "ExpressionAttributeValues": {":seen": _n(seen), ":next": _n(seen + 1)},
                }
            }
            put = {"Put": {"TableName": self._table, "Item": _booking_item(booking)}}
            try:
                self._transact([ledger_write, put])
            except ConditionsFailed:
                continue  # another booking went in meanwhile: check against it too
            return
        raise BookingContended(f"bookings kept changing over {BOOKING_TRIES} tries")

    def _booking_items(self) -> list[dict[str, Any]]:
        return list(
            self._query(
                KeyConditionExpression="pk = :pk AND begins_with(sk, :booking)",
                ExpressionAttributeValues={":pk": _s(_STATE), ":booking": _s(_BOOKING)},
                ConsistentRead=True,
            )
        )

    def cancel_booking(self, booking_id: str) -> Booking | None:
        found = [i for i in self._booking_items() if i["booking_id"]["S"] == booking_id]
        return next(iter(self._delete_bookings(found)), None)

    def expire_bookings(self, now: float) -> list[Booking]:
        ended = [i for i in self._booking_items() if float(i["end"]["N"]) <= now]
        return self._delete_bookings(ended)

    def _delete_bookings(self, items: list[dict[str, Any]]) -> list[Booking]:
        """Delete these booking items; the ones this call deleted (not another one meanwhile).
        A removal needs no new version: a booking checked against one more booking than there
        is was only checked the stricter way."""
        deleted = []
        for item in items:
            old = self._write(
                self._client.delete_item,
                TableName=self._table,
                Key={"pk": item["pk"], "sk": item["sk"]},
                ReturnValues="ALL_OLD",
            ).get("Attributes")
            if old:
                deleted.append(_booking(old))
        return deleted

    def bookings(self) -> list[Booking]:
        return self.state().bookings

    def first_notice(self, key: str) -> bool:
        try:
            self._write(
                self._client.put_item,
                TableName=self._table,
                Item={"pk": _s(_NOTICES), "sk": _s(key)},
                ConditionExpression="attribute_not_exists(pk)",
            )
        except ConditionFailed:
            return False
        return True


def _in_transactions(
    entries: Sequence[QueueEntry],
    own_items: Callable[[QueueEntry], list[dict[str, Any]]],
    counters: Callable[[QueueEntry], tuple[tuple[str, str], ...]],
    write: Callable[[list[QueueEntry], list[dict[str, Any]]], None],
) -> None:
    """Hand `write` the entries in batches that fit one transaction: each entry's own items,
    and one update per counter item the batch's entries count in."""
    batch: list[QueueEntry] = []
    items: list[dict[str, Any]] = []
    size = 0
    for entry in entries:
        own = own_items(entry)
        own_size = len(json.dumps(own))
        updates = len({sk for e in [*batch, entry] for sk, _ in counters(e)})
        if batch and (
            len(items) + len(own) + updates > TRANSACTION_ITEMS
            or size + own_size + _COUNTERS_BYTES * updates > TRANSACTION_BYTES
        ):
            write(batch, items)
            batch, items, size = [], [], 0
        batch.append(entry)
        items += own
        size += own_size
    if batch:
        write(batch, items)


def _item_key(item: dict[str, Any]) -> tuple[str, str]:
    """The table and key of one item of a transaction (a Put's is in its item: the queue's)."""
    ((_, action),) = item.items()
    key = action.get("Key") or {name: action["Item"][name] for name in ("pk", "sk")}
    return action["TableName"], json.dumps(key, sort_keys=True)


def _booking_item(booking: Booking) -> dict[str, Any]:
    return {
        "pk": _s(_STATE),
        "sk": _s(f"{_BOOKING}{booking.start:017.6f}#{booking.booking_id}"),
        "booking_id": _s(booking.booking_id),
        "team": _s(booking.team),
        "gpus": _n(booking.gpus),
        "start": _n(booking.start),
        "end": _n(booking.end),
    }


def _booking(item: dict[str, Any]) -> Booking:
    return Booking(
        booking_id=item["booking_id"]["S"],
        team=item["team"]["S"],
        gpus=int(item["gpus"]["N"]),
        start=float(item["start"]["N"]),
        end=float(item["end"]["N"]),
    )


def _shape_counts(item: dict[str, Any]) -> dict[tuple[Priority, Shape], int]:
    """A team's usage item's counters of waiting jobs, by class and shape."""
    counts = {}
    for name, value in item.items():
        if name.startswith(_SHAPE_COUNTER):
            priority, gpus, instances = name.removeprefix(_SHAPE_COUNTER).split("#")
            counts[(Priority(priority), (int(gpus), int(instances)))] = int(value["N"])
    return counts


def _ledger(item: dict[str, Any]) -> dict[str, float]:
    """A team's usage item's fair-share ledger: entry -> GPU-hours as the entry values them."""
    return {
        name.removeprefix(_LEDGER_ENTRY): float(value["N"])
        for name, value in item.items()
        if name.startswith(_LEDGER_ENTRY)
    }
