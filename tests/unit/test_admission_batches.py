"""A pass's admissions in batches (`adapters/admission_batches.py`): cut to what a DynamoDB
transaction holds, conditioned exactly as the admissions one after another would be, and
written again without what went stale; and one dispatcher pass that admits a hundred jobs."""

from __future__ import annotations

from collections import Counter
from typing import cast

import pytest
from hypothesis import given
from hypothesis import strategies as st

from gpufleet.adapters.admission_batches import (
    TRANSACTION_BYTES,
    TRANSACTION_ITEMS,
    BatchOutcome,
    TransactionTooLarge,
    admit_in_batches,
    batches,
    check_transaction,
    items_of,
    rooms,
)
from gpufleet.adapters.local.memory import (
    InMemoryJobQueue,
    ManualClock,
    RecordingWorkflow,
    in_memory_ports,
)
from gpufleet.domain.queueing import QueuedJob, QueuePolicy, RunningJob, TeamQuota
from gpufleet.domain.spec import Priority
from gpufleet.ports import AdmissionLimits, AdmissionRequest, QueueEntry
from gpufleet.services.dispatcher import DispatcherService
from gpufleet.services.factory import build_lifecycle
from tests.helpers import make_settings

NOW = 1_767_225_600.0


def request(
    job_id: str, team: str = "t", gpus: int = 1, limits: AdmissionLimits | None = None
) -> AdmissionRequest:
    queued = QueuedJob(job_id, team, Priority.NORMAL, gpus, 1, NOW)
    return AdmissionRequest(
        QueueEntry(queued, f"token-{job_id}", NOW),
        RunningJob(job_id, team, Priority.NORMAL, gpus, 1, NOW),
        limits or AdmissionLimits(10_000, 10_000, None),
    )


@given(st.lists(st.sampled_from(["a", "b", "c", "d", "e"]), max_size=400))
def test_batches_keep_the_order_and_are_as_large_as_a_transaction_holds(teams: list[str]) -> None:
    requests = [request(f"j{i}", team) for i, team in enumerate(teams)]
    cut = batches(requests)
    assert [r for batch in cut for r in batch] == requests
    for index, batch in enumerate(cut):
        assert items_of(batch) <= TRANSACTION_ITEMS
        if index + 1 < len(cut):  # the next one's first would not have fitted
            assert items_of([*batch, cut[index + 1][0]]) > TRANSACTION_ITEMS


def _one_by_one(held: Counter[str], batch: list[AdmissionRequest]) -> bool:
    """Whether each admission, written after the ones before it, keeps within its limits."""
    gpus, instances, team_gpus = held["gpus"], held["instances"], Counter[str]()
    team_gpus.update({team: held[team] for team in ("a", "b")})
    for r in batch:
        gpus, instances = gpus + r.job.gpus, instances + r.job.instances
        team_gpus[r.job.team] += r.job.gpus
        if gpus > r.limits.max_gpus or instances > r.limits.max_instances:
            return False
        if r.limits.team_gpus is not None and team_gpus[r.job.team] > r.limits.team_gpus:
            return False
    return True


limits_strategy = st.builds(
    AdmissionLimits,
    st.integers(0, 40),
    st.integers(0, 40),
    st.one_of(st.none(), st.integers(0, 20)),
)


@given(
    st.lists(
        st.tuples(st.sampled_from(["a", "b"]), st.integers(0, 8), limits_strategy),
        min_size=1,
        max_size=8,
    ),
    st.integers(0, 20),
    st.integers(0, 10),
    st.integers(0, 10),
)
def test_a_batchs_condition_is_the_admissions_one_after_another(
    jobs: list[tuple[str, int, AdmissionLimits]], held_gpus: int, held_a: int, held_b: int
) -> None:
    batch = [request(f"j{i}", team, gpus, limits) for i, (team, gpus, limits) in enumerate(jobs)]
    held = Counter({"gpus": held_gpus + held_a + held_b, "instances": held_gpus, "a": held_a})
    held["b"] = held_b
    room = rooms(batch)
    condition = (
        room.possible
        and held["gpus"] <= room.gpus
        and held["instances"] <= room.instances
        and all(held[team] <= team_room for team, team_room in room.teams.items())
    )
    assert condition == _one_by_one(held, batch)


def test_a_transaction_is_refused_as_dynamodb_refuses_it() -> None:
    check_transaction([("item", i) for i in range(TRANSACTION_ITEMS)], TRANSACTION_BYTES)
    with pytest.raises(TransactionTooLarge, match="101 items"):
        check_transaction([("item", i) for i in range(TRANSACTION_ITEMS + 1)], 0)
    with pytest.raises(TransactionTooLarge, match="bytes"):
        check_transaction([("item", 1)], TRANSACTION_BYTES + 1)
    with pytest.raises(TransactionTooLarge, match="two actions on one item"):
        check_transaction([("usage", "global"), ("running", "j"), ("usage", "global")], 10)


def test_stale_jobs_are_dropped_and_a_batch_over_a_cap_is_split_in_its_order() -> None:
    written: list[list[str]] = []
    stale = {"j3"}
    room = 5  # what the counters still hold room for, in jobs

    def write(batch: list[AdmissionRequest]) -> BatchOutcome:
        ids = [r.job.job_id for r in batch]
        gone = frozenset(ids) & stale
        if gone:
            return BatchOutcome(False, gone)
        if len(ids) > room - sum(len(w) for w in written):
            return BatchOutcome(False)
        written.append(ids)
        return BatchOutcome(True)

    requests = [request(f"j{i}") for i in range(10)]
    admitted = admit_in_batches([*requests, requests[0]], write)  # j0 asked for twice
    assert admitted == ["j0", "j1", "j2", "j4", "j5"]  # the first that fit, in order
    assert written == [["j0", "j1", "j2", "j4"], ["j5"]]


def test_a_pass_admits_a_hundred_jobs_in_three_transactions_and_tells_each_once() -> None:
    ports = in_memory_ports(clock=ManualClock(NOW), queue=InMemoryJobQueue())
    policy = QueuePolicy(
        max_gpus=100, max_instances=100, reserve_share=0.0, teams={"t": TeamQuota(gpus=100)}
    )
    dispatcher = DispatcherService(ports, build_lifecycle(ports, make_settings()), policy)
    for i in range(100):
        queued = QueuedJob(f"j-{i:03d}", "t", Priority.NORMAL, 1, 1, NOW - 100 + i)
        ports.queue.enqueue(QueueEntry(queued, f"token-{i}", NOW - 10))
    before = ports.queue.transactions()
    result = dispatcher.run_pass()
    assert result.admitted == [f"j-{i:03d}" for i in range(100)]
    assert ports.queue.transactions() - before == 3  # 49 + 49 + 2
    assert result.waited_seconds == [10.0] * 100 and result.lost_races == 0
    completed = cast(RecordingWorkflow, ports.workflow).completed
    assert set(completed) == {f"token-{i}" for i in range(100)}
    assert all(told["admitted"] is True for told in completed.values())
    assert dispatcher.run_pass().admitted == []  # and nothing is told twice
    assert len(completed) == 100
