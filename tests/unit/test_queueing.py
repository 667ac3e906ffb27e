"""Admission order, quotas, borrowing, reserve, windows, bookings and preemption."""

from __future__ import annotations

from dataclasses import replace

from hypothesis import given, settings
from hypothesis import strategies as st

from gpufleet.domain.queueing import (
    Booking,
    QueuedJob,
    QueuePolicy,
    RunningJob,
    TeamQuota,
    TimeWindow,
    WaitReason,
    admission_order,
    decide,
)
from gpufleet.domain.spec import Priority

HOUR = 3600.0
NOW = 1_767_225_600.0 + 12 * HOUR  # 2026-01-01 12:00 UTC
POLICY = QueuePolicy(
    max_gpus=20,
    max_instances=10,
    reserve_share=0.1,  # 2 GPUs
    aging_per_hour=0.5,
    min_runtime_seconds=600,
    teams={"vision": TeamQuota(gpus=8, borrow=4), "nlp": TeamQuota(gpus=8, borrow=4)},
    default_team=TeamQuota(gpus=0, borrow=2),
)


def queued(
    job_id: str,
    team: str = "vision",
    priority: Priority = Priority.NORMAL,
    gpus: int = 1,
    waited: float = 0.0,
) -> QueuedJob:
    return QueuedJob(job_id, team, priority, gpus, max(1, gpus // 8), NOW - waited)


def running(
    job_id: str,
    team: str = "vision",
    priority: Priority = Priority.NORMAL,
    gpus: int = 1,
    age: float = HOUR,
    **flags: object,
) -> RunningJob:
    return RunningJob(job_id, team, priority, gpus, max(1, gpus // 8), NOW - age, **flags)  # type: ignore[arg-type]


def ids(admitted: list[object]) -> list[str]:
    return [a.job_id for a in admitted]  # type: ignore[attr-defined]


def test_order_is_by_class_then_fifo_and_waiting_raises_rank() -> None:
    jobs = [
        queued("low-old", priority=Priority.LOW, waited=1 * HOUR),
        queued("high-new", priority=Priority.HIGH),
        queued("normal-b", waited=10.0),
        queued("normal-a", waited=20.0),
    ]
    order = [j.job_id for j in admission_order(jobs, NOW, POLICY)]
    assert order == ["high-new", "normal-a", "normal-b", "low-old"]
    # After 5 hours a low job outranks a fresh high one: nothing starves.
    aged = [queued("low", priority=Priority.LOW, waited=5 * HOUR), queued("high", Priority.HIGH)]
    assert admission_order(aged, NOW, POLICY)[0].job_id == "low"


def test_a_team_runs_its_quota_then_borrows_idle_quota_up_to_its_limit() -> None:
    jobs = [queued(f"v{i}", gpus=4, waited=10 - i) for i in range(5)]
    decision = decide(jobs, [], [], NOW, POLICY)
    assert ids(decision.admitted) == ["v0", "v1", "v2"]
    assert [a.borrowed for a in decision.admitted] == [False, False, True]
    assert decision.waiting == {"v3": WaitReason.QUOTA, "v4": WaitReason.QUOTA}


def test_borrowing_needs_idle_quota_elsewhere() -> None:
    busy_nlp = [running("n0", team="nlp", gpus=8)]
    decision = decide([queued("v0", gpus=8), queued("v1", gpus=2)], busy_nlp, [], NOW, POLICY)
    assert ids(decision.admitted) == ["v0"]
    assert decision.waiting["v1"] is WaitReason.QUOTA


def test_the_reserve_is_for_critical_work_unless_a_window_opens_it() -> None:
    full = [running("n0", team="nlp", gpus=8), running("v0", gpus=10)]
    waiting = decide(
        [queued("low", team="x", priority=Priority.LOW, gpus=1)], full, [], NOW, POLICY
    )
    assert waiting.waiting["low"] is WaitReason.WINDOW
    urgent = decide(
        [queued("c", team="x", priority=Priority.CRITICAL, gpus=2)], full, [], NOW, POLICY
    )
    assert urgent.admitted[0].in_reserve
    night = POLICY.model_copy(
        update={
            "windows": [
                TimeWindow(name="night", start="22:00", end="06:00", reserve_open_to=[Priority.LOW])
            ]
        }
    )
    at_night = NOW + 11 * HOUR  # 23:00 UTC
    opened = decide([queued("low", team="x", priority=Priority.LOW)], full, [], at_night, night)
    assert opened.admitted[0].in_reserve
    # At 06:00 the window closes and what it let into the reserve is reclaimed.
    in_reserve = [*full, running("low", team="x", priority=Priority.LOW, in_reserve=True)]
    morning = decide([], in_reserve, [], NOW - 5 * HOUR, night)  # 07:00
    assert morning.reclaims == ["low"]


def test_windows_wrap_midnight() -> None:
    window = TimeWindow(name="night", start="22:00", end="06:00")
    day = 1_767_225_600.0
    assert window.active_at(day + 23 * HOUR) and window.active_at(day + 5 * HOUR)
    assert not window.active_at(day + 6 * HOUR) and not window.active_at(day + 12 * HOUR)


def test_booked_gpus_are_held_for_their_team() -> None:
    booking = Booking("b1", "nlp", gpus=10, start=NOW - HOUR, end=NOW + HOUR)
    others = [running("v0", gpus=8)]
    decision = decide([queued("v1", gpus=4)], others, [booking], NOW, POLICY)
    assert decision.waiting["v1"] is WaitReason.BOOKING
    # The booking team may go past its quota into its booking.
    mine = decide([queued("n1", team="nlp", gpus=10)], others, [booking], NOW, POLICY)
    assert mine.admitted[0].borrowed is False
    # Outside its window the booking holds nothing.
    later = decide([queued("v1", gpus=4)], others, [booking], NOW + 2 * HOUR, POLICY)
    assert ids(later.admitted) == ["v1"]


def test_an_entitled_job_reclaims_borrowed_gpus_newest_first() -> None:
    held = [
        running("n-own", team="nlp", gpus=8),
        running("n-b1", team="nlp", gpus=2, borrowed=True, age=2 * HOUR),
        running("n-b2", team="nlp", gpus=2, borrowed=True, age=1 * HOUR),
        running("v0", gpus=6),
    ]
    decision = decide([queued("v1", gpus=2)], held, [], NOW, POLICY)
    assert [(p.victim_id, p.for_job_id) for p in decision.preemptions] == [("n-b2", "v1")]
    assert decision.waiting["v1"] is WaitReason.PREEMPTING
    # The next pass does not preempt again while the victim drains.
    draining = [replace(r, draining_for="v1") if r.job_id == "n-b2" else r for r in held]
    again = decide([queued("v1", gpus=2)], draining, [], NOW, POLICY)
    assert again.preemptions == [] and again.waiting["v1"] is WaitReason.PREEMPTING


def test_preemption_takes_the_smallest_set_lowest_class_newest_first_past_min_runtime() -> None:
    strict = POLICY.model_copy(update={"teams": {"vision": TeamQuota(gpus=10, borrow=0)}})
    held = [
        running("v-low-old", priority=Priority.LOW, gpus=4, age=3 * HOUR),
        running("v-low-new", priority=Priority.LOW, gpus=2, age=2 * HOUR),
        running("v-normal", gpus=2, age=4 * HOUR),
        running("v-low-young", priority=Priority.LOW, gpus=2, age=60),  # under min runtime
    ]
    two = decide([queued("v-high", priority=Priority.HIGH, gpus=2)], held, [], NOW, strict)
    assert [p.victim_id for p in two.preemptions] == ["v-low-new"]
    # Three GPUs: newest-first takes v-low-new then v-low-old; v-low-old alone suffices.
    three = decide([queued("v-high", priority=Priority.HIGH, gpus=3)], held, [], NOW, strict)
    assert [p.victim_id for p in three.preemptions] == ["v-low-old"]
    # Nine would need the young job's GPUs too: no preemption at all, not even a partial one.
    nine = decide([queued("v-high", priority=Priority.HIGH, gpus=9)], held, [], NOW, strict)
    assert nine.preemptions == [] and nine.waiting["v-high"] is not WaitReason.PREEMPTING


def test_the_preemptor_gets_the_freed_gpus_and_its_victim_yields() -> None:
    strict = POLICY.model_copy(update={"teams": {"vision": TeamQuota(gpus=4, borrow=0)}})
    victim = QueuedJob(
        "v-low", "vision", Priority.LOW, 4, 1, NOW - 9 * HOUR, preempted_for="v-high"
    )
    preemptor = queued("v-high", priority=Priority.HIGH, gpus=4)
    decision = decide([victim, preemptor], [], [], NOW, strict)
    assert ids(decision.admitted) == ["v-high"]
    assert decision.waiting["v-low"] is WaitReason.YIELDING


def test_borrowers_and_lower_classes_never_preempt_entitled_work() -> None:
    held = [running("v0", gpus=8), running("n0", team="nlp", priority=Priority.HIGH, gpus=8)]
    # nlp is at quota with high work; another high job would have to borrow, and borrowed
    # GPUs are never taken from anyone, so it preempts nobody.
    decision = decide(
        [queued("n-high", team="nlp", priority=Priority.HIGH, gpus=14)], held, [], NOW, POLICY
    )
    assert decision.preemptions == []
    # A lower class never preempts a higher one, even within its quota.
    mixed = [running("v-high", priority=Priority.HIGH, gpus=8)]
    low = decide(
        [queued("v-low", priority=Priority.LOW, gpus=8)],
        mixed,
        [],
        NOW,
        POLICY.model_copy(update={"teams": {"vision": TeamQuota(gpus=8, borrow=0)}}),
    )
    assert low.preemptions == []


jobs_strategy = st.lists(
    st.tuples(
        st.sampled_from(["vision", "nlp", "guest"]),
        st.sampled_from(list(Priority)),
        st.integers(min_value=1, max_value=8),
        st.floats(min_value=0, max_value=10 * HOUR),
    ),
    max_size=25,
)


@settings(max_examples=150, deadline=None)
@given(jobs_strategy)
def test_repeated_passes_never_exceed_caps_or_quotas_and_preemption_settles(
    specs: list[tuple[str, Priority, int, float]],
) -> None:
    waiting = {
        f"j{i}": QueuedJob(f"j{i}", team, prio, gpus, 1, NOW - waited)
        for i, (team, prio, gpus, waited) in enumerate(specs)
    }
    run: dict[str, RunningJob] = {}
    preempted: dict[str, int] = {}
    now = NOW
    for _ in range(30):
        decision = decide(waiting.values(), run.values(), [], now, POLICY)
        for admission in decision.admitted:
            job = waiting.pop(admission.job_id)
            run[job.job_id] = RunningJob(
                job.job_id,
                job.team,
                job.priority,
                job.gpus,
                job.instances,
                now,
                borrowed=admission.borrowed,
                in_reserve=admission.in_reserve,
            )
        # Caps hold after every pass.
        assert sum(r.gpus for r in run.values()) <= POLICY.max_gpus
        assert sum(r.instances for r in run.values()) <= POLICY.max_instances
        for team, quota in POLICY.teams.items():
            # Reserve GPUs are outside the quotas (urgent work only).
            in_quota = sum(r.gpus for r in run.values() if r.team == team and not r.in_reserve)
            assert in_quota <= quota.gpus + quota.borrow
        # Victims checkpoint and go back to the queue, keeping their submission time.
        for preemption in decision.preemptions:
            victim = run.pop(preemption.victim_id)
            preempted[victim.job_id] = preempted.get(victim.job_id, 0) + 1
            waiting[victim.job_id] = next(
                QueuedJob(
                    f"j{i}",
                    t,
                    p,
                    g,
                    1,
                    NOW - w,
                    preempted_for=preemption.for_job_id,
                    preemptions=preempted[victim.job_id],
                )
                for i, (t, p, g, w) in enumerate(specs)
                if f"j{i}" == victim.job_id
            )
        now += 900  # 15 minutes between passes, past the min-runtime guard
    # No loops: preemptions are few and stop; the last passes change nothing.
    assert sum(preempted.values()) <= 2 * len(specs)
    for _ in range(3):
        calm = decide(waiting.values(), run.values(), [], now, POLICY)
        assert calm.preemptions == [] and calm.admitted == []
        now += 900


def test_yielding_never_chains_so_it_cannot_deadlock() -> None:
    # a was preempted for b, b for c, c for a: a cycle of stale links. Nobody may wait forever.
    strict = POLICY.model_copy(update={"teams": {"vision": TeamQuota(gpus=8, borrow=0)}})
    a = QueuedJob("a", "vision", Priority.NORMAL, 2, 1, NOW - 3 * HOUR, preempted_for="b")
    b = QueuedJob("b", "vision", Priority.NORMAL, 2, 1, NOW - 2 * HOUR, preempted_for="c")
    c = QueuedJob("c", "vision", Priority.NORMAL, 2, 1, NOW - 1 * HOUR, preempted_for="a")
    decision = decide([a, b, c], [], [], NOW, strict)
    assert sorted(ids(decision.admitted)) == ["a", "b", "c"]


def test_a_team_over_its_monthly_budget_waits_with_reason_budget() -> None:
    budgeted = POLICY.model_copy(
        update={"teams": {"vision": TeamQuota(gpus=8, monthly_budget_usd=100.0)}}
    )
    cheap = replace(queued("cheap", gpus=1), estimated_cost_usd=5.0)
    dear = replace(queued("dear", gpus=1, waited=60), estimated_cost_usd=50.0)
    decision = decide([cheap, dear], [], [], NOW, budgeted, team_spend_usd={"vision": 60.0})
    # dear is first in line but 60 + 50 > 100; cheap fits the budget (60 + 5).
    assert ids(decision.admitted) == ["cheap"]
    assert decision.waiting == {"dear": WaitReason.BUDGET}
    # Teams without a budget are not limited by spend.
    unbudgeted = decide([dear], [], [], NOW, POLICY, team_spend_usd={"vision": 1e9})
    assert ids(unbudgeted.admitted) == ["dear"]
