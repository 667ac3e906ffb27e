"""One contract, two job stores: DynamoDB (moto) and in-memory must behave the same."""

from __future__ import annotations

import threading
from collections.abc import Iterator

import pytest

from gpufleet.adapters.aws.job_store import DynamoJobStore
from gpufleet.adapters.aws.transactions import Backoff
from gpufleet.adapters.local.memory import InMemoryJobStore
from gpufleet.domain.arrays import child_spec
from gpufleet.domain.job import (
    IllegalTransition,
    InvalidJobChanges,
    Job,
    JobChanges,
    JobNotFound,
    JobStatus,
    Placement,
    StageRecord,
)
from gpufleet.domain.spec import parse_spec
from gpufleet.emulator.account import Account
from gpufleet.ports import JobStore
from gpufleet.topology import JOBS_TABLE
from tests.integration.dynamo_faults import writes_in_a_transaction

SPEC = parse_spec("name: t\nteam: ml\nimage: img\ncommand: [x]\n")
_counter = iter(range(1_000_000))


def new_job(created_at: float = 100.0) -> Job:
    return Job(
        job_id=f"j-{next(_counter):020x}",
        status=JobStatus.SUBMITTED,
        spec=SPEC,
        source="test",
        created_at=created_at,
        updated_at=created_at,
    )


@pytest.fixture(params=["dynamodb", "memory"])
def store(request: pytest.FixtureRequest, account: Account) -> Iterator[JobStore]:
    if request.param == "dynamodb":
        yield DynamoJobStore(
            account.client("dynamodb"), account.table_names[JOBS_TABLE.construct_id]
        )
    else:
        yield InMemoryJobStore()


def test_put_new_is_create_only(store: JobStore) -> None:
    job = new_job()
    assert store.put_new(job)
    assert not store.put_new(job.model_copy(update={"source": "other"}))
    assert store.get(job.job_id).source == "test"


def test_a_child_that_waits_element_by_element_reads_back(store: JobStore) -> None:
    """A child's spec has no array but keeps its array's element-by-element dependency: the
    stored record must read back (it once failed JobSpec's validation on DynamoDB)."""
    array = parse_spec(
        "name: train\nteam: ml\nimage: img\ncommand: [x]\narray: {size: 2}\n"
        "depends_on: [{job: j-00000000000000000001, mode: element}]\n"
    )
    job = new_job().model_copy(update={"spec": child_spec(array, 1)})
    store.put_new(job)
    assert store.get(job.job_id).spec == job.spec


def test_get_of_a_missing_job_raises(store: JobStore) -> None:
    with pytest.raises(JobNotFound):
        store.get("j-ffffffffffffffffffff")


def test_a_record_round_trips_with_every_field(store: JobStore) -> None:
    job = new_job()
    store.put_new(job)
    placement = Placement(
        instance_ids=["i-1", "i-2"],
        instance_type="p4d.24xlarge",
        capacity_type="spot",
        zone="use1-az6",
        hourly_usd=12.5,
        launched_at=150.25,
    )
    store.update(
        job.job_id,
        160.0,
        JobChanges(
            placement=placement,
            task_token="tok",
            run_result={"exit_code": 0, "reason": ""},
            attempts=2,
            on_demand_only=True,
            spot_held_seconds=1234.5,
        ),
    )
    got = store.get(job.job_id)
    assert got.placement == placement
    assert got.task_token == "tok" and got.run_result == {"exit_code": 0, "reason": ""}
    assert got.attempts == 2 and got.updated_at == 160.0
    assert got.on_demand_only is True and got.spot_held_seconds == 1234.5
    assert got.spec == SPEC


def test_legal_transitions_apply_with_their_changes(store: JobStore) -> None:
    job = new_job()
    store.put_new(job)
    queued = store.transition(job.job_id, JobStatus.QUEUED, 200.0, JobChanges(failure_reason=None))
    assert queued.status is JobStatus.QUEUED and queued.updated_at == 200.0
    failed = store.transition(job.job_id, JobStatus.FAILED, 201.0, JobChanges(failure_reason="x"))
    assert failed.failure_reason == "x"


def test_illegal_transitions_change_nothing_and_report_the_current_status(
    store: JobStore,
) -> None:
    job = new_job()
    store.put_new(job)
    with pytest.raises(IllegalTransition) as caught:
        store.transition(job.job_id, JobStatus.SUCCEEDED, 300.0, JobChanges(cost_usd=1.0))
    assert caught.value.current is JobStatus.SUBMITTED
    unchanged = store.get(job.job_id)
    assert unchanged.status is JobStatus.SUBMITTED and unchanged.cost_usd is None
    with pytest.raises(JobNotFound):
        store.transition("j-eeeeeeeeeeeeeeeeeeee", JobStatus.QUEUED, 1.0)


def test_update_of_a_missing_job_raises(store: JobStore) -> None:
    with pytest.raises(JobNotFound):
        store.update("j-dddddddddddddddddddd", 1.0, JobChanges(task_token="t"))


def test_concurrent_transitions_have_exactly_one_winner(store: JobStore) -> None:
    job = new_job()
    store.put_new(job)
    store.transition(job.job_id, JobStatus.QUEUED, 1.0)
    wins: list[int] = []
    barrier = threading.Barrier(8)

    def race(worker: int) -> None:
        barrier.wait()
        try:
            store.transition(job.job_id, JobStatus.LAUNCHING, 2.0, JobChanges(attempts=worker))
            wins.append(worker)
        except IllegalTransition:
            pass

    threads = [threading.Thread(target=race, args=(i,)) for i in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert len(wins) == 1
    assert store.get(job.job_id).attempts == wins[0]


def test_listing_by_status_is_newest_first(store: JobStore) -> None:
    older, newer = new_job(created_at=10.0), new_job(created_at=20.0)
    for job in (older, newer):
        store.put_new(job)
        store.transition(job.job_id, JobStatus.CANCELLED, 30.0)
    cancelled = [j.job_id for j in store.list_jobs(JobStatus.CANCELLED)]
    assert cancelled.index(newer.job_id) < cancelled.index(older.job_id)
    assert all(j.status is JobStatus.CANCELLED for j in store.list_jobs(JobStatus.CANCELLED))


def test_listing_every_status_gives_the_newest_jobs_overall(store: JobStore) -> None:
    # Newer than any other job of the module, in two statuses, created out of order.
    jobs = [new_job(created_at=1e10 + t) for t in (3, 1, 5, 2, 4)]
    for job in jobs:
        store.put_new(job)
    for job in jobs[:2]:
        store.transition(job.job_id, JobStatus.CANCELLED, 1e10)
    newest = [j.created_at for j in store.list_jobs(limit=4)]
    assert newest == [1e10 + 5, 1e10 + 4, 1e10 + 3, 1e10 + 2]


def test_recent_for_team_is_that_teams_jobs_newest_first(store: JobStore) -> None:
    team = f"team-{next(_counter)}"
    spec = SPEC.model_copy(update={"team": team})
    jobs = [new_job(created_at=float(t)).model_copy(update={"spec": spec}) for t in (1, 3, 2)]
    for job in jobs:
        store.put_new(job)
    store.put_new(new_job(created_at=5.0))  # another team's
    recent = store.recent_for_team(team, limit=2)
    assert [j.created_at for j in recent] == [3.0, 2.0]
    assert all(j.spec.team == team for j in recent)


def test_a_move_can_require_that_the_placement_holds_an_instance(store: JobStore) -> None:
    job = new_job()
    store.put_new(job)
    store.transition(job.job_id, JobStatus.QUEUED, 1.0)
    placement = Placement(
        instance_ids=["i-1", "i-2"],
        instance_type="g6.xlarge",
        capacity_type="spot",
        zone="us-east-1a",
        hourly_usd=1.0,
        launched_at=2.0,
    )
    store.transition(job.job_id, JobStatus.LAUNCHING, 2.0, JobChanges(placement=placement))
    with pytest.raises(IllegalTransition) as refused:
        store.transition(job.job_id, JobStatus.RUNNING, 3.0, holding="i-9")  # not its node
    assert refused.value.job is not None and refused.value.job.status is JobStatus.LAUNCHING
    assert store.transition(job.job_id, JobStatus.RUNNING, 3.0, holding="i-2").status == (
        JobStatus.RUNNING
    )
    # A move to the status it has, when asked for (a node's finish records its result).
    finished = store.transition(
        job.job_id,
        JobStatus.RUNNING,
        4.0,
        JobChanges(run_result={"exit_code": 0}),
        sources=[JobStatus.RUNNING],
        holding="i-1",
    )
    assert finished.run_result == {"exit_code": 0}
    # The instances checked follow the placement: a new one, then none.
    store.update(
        job.job_id,
        5.0,
        JobChanges(placement=placement.model_copy(update={"instance_ids": ["i-3"]})),
    )
    with pytest.raises(IllegalTransition):
        store.transition(
            job.job_id, JobStatus.RUNNING, 6.0, sources=[JobStatus.RUNNING], holding="i-1"
        )
    store.update(job.job_id, 7.0, JobChanges(placement=None))
    with pytest.raises(IllegalTransition):
        store.transition(
            job.job_id, JobStatus.RUNNING, 8.0, sources=[JobStatus.RUNNING], holding="i-3"
        )


# -- changes: typed once, written alike -----------------------------------------------------------

REFUSED_CHANGES = {
    "an unknown field": ({"retires": 3}, {"retires"}),
    "a mistyped field": ({"retries": "three"}, {"retries"}),
    "both at once": ({"retires": 3, "retries": "three"}, {"retires", "retries"}),
    "a counter cleared": ({"retries": None}, {"retries"}),
    "a mistyped placement": ({"placement": {"instance_ids": "i-1"}}, {"placement"}),
    "a field the store writes": ({"status": "SUCCEEDED"}, {"status"}),
}


@pytest.mark.parametrize(("fields", "named"), REFUSED_CHANGES.values(), ids=list(REFUSED_CHANGES))
def test_changes_a_job_cannot_have_are_refused_naming_the_fields_and_nothing_changes(
    store: JobStore, fields: dict[str, object], named: set[str]
) -> None:
    job = new_job()
    store.put_new(job)
    with pytest.raises(InvalidJobChanges) as refused:
        store.update(job.job_id, 2.0, JobChanges.parse(fields))
    assert set(refused.value.fields) == named
    assert all(name in str(refused.value) for name in named)
    with pytest.raises(InvalidJobChanges):
        store.transition(job.job_id, JobStatus.QUEUED, 2.0, JobChanges.parse(fields))
    assert store.get(job.job_id) == job


@pytest.fixture
def both_stores(account: Account) -> tuple[JobStore, JobStore]:
    dynamodb = DynamoJobStore(
        account.client("dynamodb"), account.table_names[JOBS_TABLE.construct_id]
    )
    return dynamodb, InMemoryJobStore()


def test_the_same_changes_leave_the_same_job_in_both_stores(
    both_stores: tuple[JobStore, JobStore],
) -> None:
    """Every kind of field (numbers, flags, text, models, lists, a clear) written as changes
    reads back the same from DynamoDB's item as from memory, and as the changes say."""
    job = new_job()
    placement = Placement(
        instance_ids=["i-1", "i-2"],
        instance_type="p4d.24xlarge",
        capacity_type="spot",
        zone="use1-az6",
        hourly_usd=12.5,
        launched_at=150.25,
        storage_gib=200,
    )
    record = StageRecord(name="train", status=JobStatus.SUCCEEDED, cost_usd=0.125)
    writes = [
        (JobStatus.QUEUED, JobChanges(estimated_cost_usd=1.5, failure_reason="waits")),
        (
            JobStatus.LAUNCHING,
            JobChanges(placement=placement, attempts=1, ondemand_fallback=True, task_token="t"),
        ),
        (None, JobChanges(run_result={"exit_code": 0, "reason": ""}, flags=["idle"])),
        (None, JobChanges(resources_override=SPEC.resources, stage_records=[record])),
        (None, JobChanges(released_at=1000.5, prior_cost_usd=0.1, failure_reason=None)),
        (JobStatus.QUEUED, JobChanges(placement=None, retries=2, on_demand_only=True)),
    ]
    results = []
    for store in both_stores:
        store.put_new(job)
        for target, changes in writes:
            if target is None:
                store.update(job.job_id, 300.0, changes)
            else:
                store.transition(job.job_id, target, 300.0, changes)
        results.append(store.get(job.job_id))
    from_dynamodb, from_memory = results
    assert from_dynamodb == from_memory
    expected = job
    for _, changes in writes:
        expected = expected.with_changes(changes)
    assert from_memory.model_dump(exclude={"status", "updated_at", "version"}) == (
        expected.model_dump(exclude={"status", "updated_at", "version"})
    )
    assert (from_memory.status, from_memory.version) == (JobStatus.QUEUED, len(writes))
    assert from_memory.failure_reason is None and from_memory.placement is None


# -- DynamoDB only: a write that meets a transaction on its item ---------------------------------


def test_a_move_that_meets_a_transaction_on_the_job_is_tried_again(account: Account) -> None:
    """F7: a node's report (a single UpdateItem) arriving while an admission, launch or release
    transaction holds the job's item is not lost to a retry the SDK does not make."""
    client = account.client("dynamodb")
    waits: list[float] = []
    table = account.table_names[JOBS_TABLE.construct_id]
    store = DynamoJobStore(client, table, Backoff(sleep=waits.append))  # waits asked, not taken
    job = new_job()
    store.put_new(job)
    with writes_in_a_transaction(client, "UpdateItem") as failed:
        moved = store.transition(job.job_id, JobStatus.QUEUED, 1.0)
        updated = store.update(job.job_id, 2.0, JobChanges(attempts=1))
    assert failed == ["UpdateItem"] and len(waits) == 1  # the first met the transaction
    assert moved.status is JobStatus.QUEUED and updated.attempts == 1
    assert store.get(job.job_id).version == 2


def test_statuses_of_many_jobs_are_read_in_batches_and_a_missing_one_is_left_out(
    store: JobStore,
) -> None:
    jobs = [new_job() for _ in range(250)]  # three BatchGetItem calls of at most 100 keys
    store.put_many(jobs)
    queued = jobs[7].job_id
    store.transition(queued, JobStatus.QUEUED, 200.0)
    found = store.statuses([*(j.job_id for j in jobs), "j-" + "f" * 20])  # no such job
    assert len(found) == 250 and found[queued] is JobStatus.QUEUED
    assert {status for job_id, status in found.items() if job_id != queued} == {JobStatus.SUBMITTED}
