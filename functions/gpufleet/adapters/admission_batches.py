"""A pass's admissions, written as many to a DynamoDB transaction as fit (docs/queues.md).

A dispatcher pass may admit thousands of jobs (a large array on a fleet that can hold it). Each
admission is all or nothing, so it is a transaction; but a transaction may hold up to 100
items, and most of an admission's items are shared by every admission of the pass: the
fleet's counters (`usage#global`) and its team's. So the admissions of a pass go in batches:
each batch is one transaction with every job's own items (its queue entry deleted, its running
item put) and one update per counter item, adding the
batch's total with a condition that is exactly what the batch's admissions, written one after
another in their order, would each have checked (`rooms`).

A transaction is all or nothing, so one stale job (admitted or cancelled meanwhile, by another
pass) cancels its batch: the batch is written again without the jobs whose own items failed
their conditions, and a batch whose counters failed (another pass admitted meanwhile) is split
in halves, the first (the jobs the policy put first) written first, down to one job, which then
does not fit. A throttled or conflicting transaction is tried again as every transaction is
(`adapters/aws/transactions.transact`).

Both queues, DynamoDB's and the in-memory twin, batch with these functions, so they write the
same batches and admit the same jobs.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Hashable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field

from gpufleet.errors import RefusedInput
from gpufleet.ports import AdmissionRequest

# DynamoDB's TransactWriteItems: at most 100 items, 4 MB in all, no two actions on one item.
TRANSACTION_ITEMS = 100
TRANSACTION_BYTES = 4 * 1024 * 1024
# An admission's own items: its entry (deleted) and its running item (put); its locator and
# nominee item go at its release. The counters' items are the batch's: `usage#global`, and each
# team's usage item.
ITEMS_PER_ADMISSION = 2
# Of an admission's items besides its task token (keys, a few numbers), in bytes at most. Step
# Functions' tokens are at most 2,048 characters (SendTaskSuccess): a batch stays far from 4 MB.
ADMISSION_BYTES = 1024


class TransactionTooLarge(RefusedInput):
    """What DynamoDB refuses with a ValidationException, the transaction unwritten: over 100
    items, over 4 MB, or two actions on one item."""


def check_transaction(keys: Sequence[Hashable], size: int) -> None:
    """Refuse a transaction of items `keys` and `size` bytes in all as DynamoDB does."""
    if len(keys) > TRANSACTION_ITEMS:
        raise TransactionTooLarge(f"{len(keys)} items; a transaction holds {TRANSACTION_ITEMS}")
    if size > TRANSACTION_BYTES:
        raise TransactionTooLarge(f"{size} bytes; a transaction holds {TRANSACTION_BYTES}")
    repeated = [key for key, count in Counter(keys).items() if count > 1]
    if repeated:
        raise TransactionTooLarge(f"two actions on one item: {repeated[0]!r}")


def admission_bytes(request: AdmissionRequest) -> int:
    """At most what one admission's items weigh (as the in-memory queue counts a batch's size;
    the DynamoDB queue measures its items)."""
    return ADMISSION_BYTES + len(request.entry.task_token.encode())


def items_of(batch: Iterable[AdmissionRequest]) -> int:
    """The items of a batch's transaction: each job's own, and one per counter item."""
    requests = list(batch)
    teams = {r.job.team for r in requests}
    return ITEMS_PER_ADMISSION * len(requests) + 1 + len(teams)


def batches(requests: Sequence[AdmissionRequest]) -> list[list[AdmissionRequest]]:
    """The requests in order, cut into batches as large as a transaction holds."""
    cut: list[list[AdmissionRequest]] = []
    batch: list[AdmissionRequest] = []
    for request in requests:
        if batch and items_of([*batch, request]) > TRANSACTION_ITEMS:
            cut.append(batch)
            batch = []
        batch.append(request)
    if batch:
        cut.append(batch)
    return cut


@dataclass(frozen=True)
class Rooms:
    """What a batch's counters must hold before it for every admission of it to be within its
    limits: GPUs and instances held at most `gpus` and `instances`, and each team's GPUs at most
    `teams[team]` (only teams of which an admission is bound by its quota)."""

    gpus: int
    instances: int
    teams: Mapping[str, int] = field(default_factory=dict)
    gpus_added: int = 0
    instances_added: int = 0
    team_gpus_added: Mapping[str, int] = field(default_factory=dict)

    @property
    def possible(self) -> bool:
        """False when the batch exceeds a limit even from nothing held (no condition on a
        counter item that does not exist yet could say so)."""
        return min(self.gpus, self.instances, *self.teams.values()) >= 0


def rooms(batch: Sequence[AdmissionRequest]) -> Rooms:
    """The conditions of the batch on the counters: the k-th admission, written after the ones
    before it, checks `held + (its and theirs) <= its limit`; the batch checks `held <=` the
    least of those rooms, which is the same."""
    gpus = instances = 0
    team_gpus: Counter[str] = Counter()
    gpu_room = instance_room = None
    team_rooms: dict[str, int] = {}
    for request in batch:
        job, limits = request.job, request.limits
        gpus += job.gpus
        instances += job.instances
        team_gpus[job.team] += job.gpus
        gpu_room = _least(gpu_room, limits.max_gpus - gpus)
        instance_room = _least(instance_room, limits.max_instances - instances)
        if limits.team_gpus is not None:
            team_rooms[job.team] = _least(
                team_rooms.get(job.team), limits.team_gpus - team_gpus[job.team]
            )
    return Rooms(
        gpus=gpu_room if gpu_room is not None else 0,
        instances=instance_room if instance_room is not None else 0,
        teams=team_rooms,
        gpus_added=gpus,
        instances_added=instances,
        team_gpus_added=dict(team_gpus),
    )


def _least(room: int | None, candidate: int) -> int:
    return candidate if room is None else min(room, candidate)


@dataclass(frozen=True)
class BatchOutcome:
    """A batch's transaction: written, or not, and then which jobs' own items failed their
    conditions (they no longer wait, or hold a running item already); none named: a counter's
    condition failed."""

    written: bool
    gone: frozenset[str] = frozenset()


def admit_in_batches(
    requests: Sequence[AdmissionRequest],
    write: Callable[[list[AdmissionRequest]], BatchOutcome],
) -> list[str]:
    """Write the requests in batches (`write`: one batch's transaction); the jobs admitted, in
    the requests' order (a job asked for twice is written once, as first asked)."""
    unique: dict[str, AdmissionRequest] = {}
    for request in requests:
        unique.setdefault(request.job.job_id, request)
    admitted: set[str] = set()
    pending = batches(list(unique.values()))[::-1]  # a stack: the next batch last
    while pending:
        batch = pending.pop()
        outcome = write(batch) if rooms(batch).possible else BatchOutcome(False)
        if outcome.written:
            admitted.update(r.job.job_id for r in batch)
            continue
        rest = [r for r in batch if r.job.job_id not in outcome.gone]
        if len(rest) < len(batch):
            if rest:
                pending.append(rest)  # the others still may be admitted together
        elif len(batch) > 1:
            half = len(batch) // 2
            pending += [batch[half:], batch[:half]]
        # else: one job that does not fit (any more): it waits
    return [job_id for job_id in unique if job_id in admitted]
