"""Fair share: the decay of a team's GPU-hours, its ledger, and the order of teams in a class."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gpufleet.domain.config import ConfigFileError, config_from_yaml
from gpufleet.domain.fair_share import (
    EPOCH_HALF_LIVES,
    add_charge,
    charge,
    decayed,
    usage_at,
    usage_by_team,
)
from gpufleet.domain.queueing import (
    QueuePolicy,
    TeamQuota,
    admission_order,
    decide,
    effective_priority,
)
from gpufleet.domain.spec import Priority
from tests.unit.test_queueing import HOUR, NOW, POLICY, ids, queued, running

DAY = 24 * HOUR


def test_a_gpu_hour_counts_half_after_one_half_life() -> None:
    assert decayed(8.0, NOW, NOW, DAY) == 8.0
    assert decayed(8.0, NOW, NOW + DAY, DAY) == pytest.approx(4.0)
    assert decayed(8.0, NOW, NOW + 3 * DAY, DAY) == pytest.approx(1.0)


charges = st.lists(
    st.tuples(
        st.floats(min_value=0.0, max_value=1000.0),  # GPU-hours
        st.floats(min_value=0.0, max_value=200 * DAY),  # when, after NOW
    ),
    max_size=20,
)


@given(charges, st.floats(min_value=0.0, max_value=10 * DAY))
@settings(max_examples=200, deadline=None)
def test_the_ledger_is_the_sum_of_each_charge_decayed(
    runs: list[tuple[float, float]], later: float
) -> None:
    """Charges only add to entries, in any order; what they add up to is each run's GPU-hours
    decayed from its own end, across any number of epochs."""
    ledgers: dict[str, dict[str, float]] = {}
    for gpu_hours, after in reversed(runs):  # the order they are added in does not matter
        add_charge(ledgers, "vision", charge(gpu_hours, NOW + after, DAY))
    now = NOW + max((after for _, after in runs), default=0.0) + later
    expected = sum(decayed(g, NOW + after, now, DAY) for g, after in runs)
    assert usage_at(ledgers.get("vision", {}), now, DAY) == pytest.approx(expected, abs=1e-9)
    for ledger in ledgers.values():  # bounded: no entry grows past 2**32 times what it holds
        assert all(amount <= 2.0**EPOCH_HALF_LIVES * 1000 * 20 for amount in ledger.values())


def test_a_new_half_life_starts_usage_afresh() -> None:
    ledgers: dict[str, dict[str, float]] = {}
    add_charge(ledgers, "vision", charge(10.0, NOW, DAY))
    assert usage_at(ledgers["vision"], NOW, DAY) == pytest.approx(10.0)
    assert usage_at(ledgers["vision"], NOW, 7 * DAY) == 0.0  # another half-life: not misread
    assert usage_by_team(ledgers, NOW + DAY, DAY) == {"vision": pytest.approx(5.0)}


# A fleet with room for one more 1-GPU job outside the reserve (18 of 20 GPUs, 17 held).
FULL_BUT_ONE = [running("held", team="other", gpus=17)]


def one_admitted(policy: QueuePolicy, usage: dict[str, float] | None) -> list[str]:
    jobs = [queued("vision-old", team="vision", waited=HOUR), queued("nlp-new", team="nlp")]
    return ids(decide(jobs, FULL_BUT_ONE, [], NOW, policy, team_usage=usage).admitted)


def test_within_a_class_the_team_that_used_less_goes_first() -> None:
    assert one_admitted(POLICY, None) == ["vision-old"]  # no usage: FIFO across teams
    assert one_admitted(POLICY, {"vision": 0.0, "nlp": 0.0}) == ["vision-old"]
    assert one_admitted(POLICY, {"vision": 10.0}) == ["nlp-new"]  # nlp has none
    assert one_admitted(POLICY, {"vision": 10.0, "nlp": 12.0}) == ["vision-old"]


def test_usage_counts_per_share() -> None:
    teams = {"vision": TeamQuota(gpus=8, borrow=4, share=3), "nlp": TeamQuota(gpus=8, borrow=4)}
    weighted = POLICY.model_copy(update={"teams": teams})
    # vision used more GPU-hours, but less per share: 9 / 3 against 4 / 1.
    assert one_admitted(weighted, {"vision": 9.0, "nlp": 4.0}) == ["vision-old"]
    assert one_admitted(POLICY, {"vision": 9.0, "nlp": 4.0}) == ["nlp-new"]


def test_fair_share_off_keeps_fifo_across_teams() -> None:
    off = POLICY.model_copy(update={"fair_share": False})
    assert one_admitted(off, {"vision": 10.0}) == ["vision-old"]


def test_fair_share_never_overrides_the_class_order() -> None:
    """A high job of the team that used the most goes before the normal work of one that used
    nothing; and aging still lifts a class: fair share only says which team of it goes."""
    jobs = [queued("nlp-normal", team="nlp"), queued("vision-high", priority=Priority.HIGH)]
    decision = decide(jobs, FULL_BUT_ONE, [], NOW, POLICY, team_usage={"vision": 100.0})
    assert ids(decision.admitted) == ["vision-high"]
    # Aged 4 h at 0.5 ranks an hour, vision's normal job lifts its class over a new high job;
    # with no higher class waiting, nlp, which used nothing, goes first within that class.
    two_free = [running("held", team="other", gpus=16)]
    usage = {"vision": 100.0}
    normal_only = [queued("vision-aged", waited=4 * HOUR), queued("nlp-normal", team="nlp")]
    assert ids(decide(normal_only, two_free, [], NOW, POLICY, team_usage=usage).admitted) == [
        "nlp-normal",
        "vision-aged",
    ]


def test_aging_lifts_past_a_higher_class_only_the_job_that_waited() -> None:
    """Ahead of a waiting high job only by its longest-waiting job's aging, the normal class
    gives that job, not its fair-share pick: a fresh normal job of a team that used nothing
    does not ride on another team's wait past more urgent work."""
    two_free = [running("held", team="other", gpus=16)]
    jobs = [
        queued("vision-aged", waited=4 * HOUR),
        queued("nlp-normal", team="nlp"),
        queued("vision-high", priority=Priority.HIGH),
    ]
    for usage in ({"vision": 100.0}, None):
        decision = decide(jobs, two_free, [], NOW, POLICY, team_usage=usage)
        assert ids(decision.admitted) == ["vision-aged", "vision-high"]
        assert "nlp-normal" in decision.waiting


teams = st.sampled_from(["vision", "nlp", "audio"])
waiting = st.lists(
    st.tuples(
        teams,
        st.sampled_from(list(Priority)),
        st.integers(min_value=1, max_value=8),
        st.floats(min_value=0, max_value=10 * HOUR),
    ),
    max_size=25,
)


@given(waiting, st.floats(min_value=0, max_value=1000))
@settings(max_examples=150, deadline=None)
def test_equal_standings_give_the_order_without_fair_share(
    jobs: list[tuple[str, Priority, int, float]], used: float
) -> None:
    queue = [
        queued(f"j{i}", team=team, priority=priority, gpus=gpus, waited=waited)
        for i, (team, priority, gpus, waited) in enumerate(jobs)
    ]
    held = [running("held", team="other", gpus=6)]
    without = decide(queue, held, [], NOW, POLICY)
    equal = decide(
        queue, held, [], NOW, POLICY, team_usage=dict.fromkeys(("vision", "nlp", "audio"), used)
    )
    assert ids(equal.admitted) == ids(without.admitted)
    assert equal.waiting == without.waiting and equal.preemptions == without.preemptions


@given(waiting, st.floats(min_value=0, max_value=1000))
@settings(max_examples=150, deadline=None)
def test_admission_order_is_priority_then_fifo_with_equal_standings(
    jobs: list[tuple[str, Priority, int, float]], used: float
) -> None:
    queue = [
        queued(f"j{i}", team=team, priority=priority, gpus=gpus, waited=waited)
        for i, (team, priority, gpus, waited) in enumerate(jobs)
    ]
    by_rank = sorted(
        queue, key=lambda j: (-effective_priority(j, NOW, POLICY), j.enqueued_at, j.job_id)
    )
    equal = dict.fromkeys(("vision", "nlp", "audio"), used)
    assert admission_order(queue, NOW, POLICY) == by_rank
    assert admission_order(queue, NOW, POLICY, equal) == by_rank
    # With usage, each class keeps its jobs, and each team its own FIFO order.
    fair = admission_order(queue, NOW, POLICY, {"vision": used})
    assert sorted(fair, key=lambda j: j.job_id) == sorted(queue, key=lambda j: j.job_id)
    for team in ("vision", "nlp", "audio"):
        for priority in Priority:
            mine = [j for j in fair if (j.team, j.priority) == (team, priority)]
            assert mine == sorted(mine, key=lambda j: (j.enqueued_at, j.job_id))


@pytest.mark.parametrize(
    "queue",
    [
        "{teams: {vision: {gpus: 8, share: 0}}}",
        "{fair_share_half_life_hours: 0}",
        "{default_team: {gpus: 4, share: -1}}",
    ],
)
def test_a_share_or_half_life_that_is_not_positive_is_refused(queue: str) -> None:
    with pytest.raises(ConfigFileError, match="greater than 0"):
        config_from_yaml(f"queue: {queue}\n")
