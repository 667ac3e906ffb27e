"""Admission order, quotas, borrowing, reserve, windows, bookings and preemption."""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator
from dataclasses import replace

from hypothesis import example, given, settings
from hypothesis import strategies as st

from gpufleet.domain.queueing import (
    LOOKAHEAD,
    Booking,
    Preemption,
    QueuedJob,
    QueuePolicy,
    RunningJob,
    Stream,
    TeamQuota,
    TimeWindow,
    WaitingJobs,
    WaitReason,
    admission_order,
    decide,
    decide_streams,
    most_booked,
    never_admissible,
    nominees_of,
    streams_of,
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


def test_a_job_preempted_the_most_times_the_policy_allows_is_no_victim() -> None:
    strict = POLICY.model_copy(
        update={"teams": {"vision": TeamQuota(gpus=4, borrow=0)}, "max_preemptions_per_job": 2}
    )
    urgent = queued("v-high", priority=Priority.HIGH, gpus=2)
    twice = running("v-low-twice", priority=Priority.LOW, gpus=2, age=2 * HOUR, preemptions=2)
    once = running("v-low-once", priority=Priority.LOW, gpus=2, age=3 * HOUR, preemptions=1)
    # The newer victim would be taken first; stopped twice already, it runs on.
    decision = decide([urgent], [twice, once], [], NOW, strict)
    assert [p.victim_id for p in decision.preemptions] == ["v-low-once"]
    spared = decide([urgent], [twice, replace(once, preemptions=2)], [], NOW, strict)
    assert spared.preemptions == [] and spared.waiting["v-high"] is WaitReason.QUOTA


def test_a_job_waits_for_ends_expected_before_victims_would_drain_instead_of_preempting() -> None:
    """Running jobs expected to end within `preemption_grace_seconds` free the room before a
    victim preempted now would: the job waits for them, holding the reservation, and nobody
    is stopped. An end expected later, or a job past its expected end (when it ends is
    unknown), does not count, and the job preempts."""
    strict = POLICY.model_copy(update={"teams": {"vision": TeamQuota(gpus=4, borrow=0)}})
    urgent = queued("v-high", priority=Priority.HIGH, gpus=2)
    victim = running("v-low", priority=Priority.LOW, gpus=2, age=2 * HOUR)

    def other(ends_in: float) -> RunningJob:
        return running("v-normal", gpus=2, age=HOUR, expected_end=NOW + ends_in)

    grace = strict.preemption_grace_seconds
    soon = decide([urgent], [victim, other(grace / 2)], [], NOW, strict)
    assert soon.preemptions == [] and soon.waiting["v-high"] is WaitReason.QUOTA
    assert soon.reservation is not None and soon.reservation.job_id == "v-high"
    for ends_in in (grace + 60, -60):  # after the victim would have drained; overdue
        later = decide([urgent], [victim, other(ends_in)], [], NOW, strict)
        assert later.preemptions == [Preemption("v-low", "v-high")]


def test_a_job_that_would_not_hold_the_reservation_preempts_rather_than_wait() -> None:
    """Waiting for ends is safe only when the room they free is the job's own: when a job
    ahead of it already holds the reservation, it preempts as before."""
    strict = POLICY.model_copy(
        update={
            "teams": {"vision": TeamQuota(gpus=4, borrow=0), "nlp": TeamQuota(gpus=16)},
        }
    )
    ahead = queued("n-big", team="nlp", gpus=16, waited=3 * HOUR)  # aged ahead: reserves
    urgent = queued("v-high", priority=Priority.HIGH, gpus=2)
    held = [
        running("v-low", priority=Priority.LOW, gpus=2, age=2 * HOUR),
        running("v-normal", gpus=2, age=HOUR, expected_end=NOW + 60),
        running("n-run", team="nlp", gpus=14, age=HOUR, expected_end=NOW + HOUR),
    ]
    decision = decide([ahead, urgent], held, [], NOW, strict)
    assert decision.reservation is not None and decision.reservation.job_id == "n-big"
    assert decision.preemptions == [Preemption("v-low", "v-high")]


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


def test_higher_class_work_borrows_any_free_gpu_not_only_idle_quota() -> None:
    # Both teams hold their quotas: nlp's quota is not idle, so normal work of vision may not
    # borrow the 2 free GPUs; high work may (it is what starts within minutes).
    held = [running("n0", team="nlp", gpus=8), running("v0", priority=Priority.HIGH, gpus=8)]
    normal = decide([queued("v-normal", gpus=2)], held, [], NOW, POLICY)
    assert normal.admitted == [] and normal.waiting["v-normal"] is WaitReason.QUOTA
    urgent = decide([queued("v-high", priority=Priority.HIGH, gpus=2)], held, [], NOW, POLICY)
    assert ids(urgent.admitted) == ["v-high"] and urgent.admitted[0].borrowed
    # Still within its team's borrowing limit (4): 6 GPUs more would be 2 too many.
    roomy = POLICY.model_copy(update={"max_gpus": 40})
    big = decide([queued("v-high", priority=Priority.HIGH, gpus=6)], held, [], NOW, roomy)
    assert big.admitted == [] and big.waiting["v-high"] is WaitReason.QUOTA


def test_no_job_preempts_work_of_a_higher_class_even_a_borrower() -> None:
    # nlp's high job borrows 4 of vision's GPUs; vision's entitled normal job waits for it to
    # end rather than reclaim them: it never stops more urgent work.
    held = [
        running("n-own", team="nlp", gpus=8),
        running("n-high", team="nlp", priority=Priority.HIGH, gpus=4, borrowed=True),
        running("v0", gpus=6),
    ]
    decision = decide([queued("v1", gpus=2)], held, [], NOW, POLICY)
    assert decision.preemptions == [] and decision.waiting["v1"] is not WaitReason.PREEMPTING
    # A borrower of its own class, past reclaim_after_seconds, is reclaimed as before.
    same = [replace(r, priority=Priority.NORMAL) if r.job_id == "n-high" else r for r in held]
    again = decide([queued("v1", gpus=2)], same, [], NOW, POLICY)
    assert [p.victim_id for p in again.preemptions] == ["n-high"]


def test_same_class_reclaim_waits_reclaim_after_seconds_priority_only_min_runtime() -> None:
    # A borrower of nlp that has run 30 minutes: past min_runtime_seconds (10 minutes), short
    # of reclaim_after_seconds (an hour).
    held = [
        running("n-own", team="nlp", gpus=8),
        running("n-borrow", team="nlp", gpus=4, borrowed=True, age=HOUR / 2),
        running("v0", gpus=6),
    ]
    reclaim = decide([queued("v1", gpus=2)], held, [], NOW, POLICY)
    assert reclaim.preemptions == [] and reclaim.waiting["v1"] is not WaitReason.PREEMPTING
    # Work of a higher class preempts it at once: priority needs only the minimum runtime.
    urgent = decide([queued("v-high", priority=Priority.HIGH, gpus=2)], held, [], NOW, POLICY)
    assert [p.victim_id for p in urgent.preemptions] == ["n-borrow"]
    # Once it has run an hour, the entitled normal job reclaims its quota.
    later = decide([queued("v1", gpus=2)], held, [], NOW + HOUR / 2, POLICY)
    assert [p.victim_id for p in later.preemptions] == ["n-borrow"]


def test_a_team_over_its_quota_swaps_urgent_work_for_its_own_lower_class_work() -> None:
    # vision holds 12 GPUs (its quota 8 and 4 borrowed), all normal work; the fleet is full.
    # Its 2-GPU high job takes the place of one of its own normal jobs that frees 2 GPUs: the
    # team then holds what it held, so no other team's quota is touched. Before, it had to
    # bring its team back within its quota: 5 victims (10 GPUs) for 2 GPUs of work.
    held = [
        *[running(f"v{i}", gpus=2, age=2 * HOUR - i) for i in range(4)],
        *[running(f"vb{i}", gpus=2, age=HOUR - i, borrowed=True) for i in range(2)],
        running("n0", team="nlp", gpus=8),
    ]
    full = POLICY.model_copy(update={"reserve_share": 0.0})
    urgent = queued("v-high", priority=Priority.HIGH, gpus=2)
    decision = decide([urgent], held, [], NOW, full)
    assert decision.preemptions == [Preemption("vb1", "v-high")]  # borrowed, newest first
    # Its own victims free at least what it needs: 3 GPUs take both 2-GPU borrowers.
    three = decide([queued("v-high", priority=Priority.HIGH, gpus=3)], held, [], NOW, full)
    assert sorted(p.victim_id for p in three.preemptions) == ["vb0", "vb1"]
    # Work of its own class is no lower: a normal job of the team swaps nobody out.
    same = decide([queued("v-normal", gpus=2)], held, [], NOW, full)
    assert same.preemptions == []


def test_a_reclaim_of_quota_takes_only_what_the_borrowers_team_holds_beyond_its_own() -> None:
    # nlp's two jobs were admitted as borrowers, but its other work has ended: it holds 6 of
    # its 8 GPUs, marked borrowed. vision's entitled normal job (the fleet is full) may not
    # take them: nlp would then reclaim its own quota from someone else in turn.
    roomy = POLICY.model_copy(update={"max_gpus": 14, "reserve_share": 0.0})
    held = [
        running("n-b1", team="nlp", gpus=2, borrowed=True, age=2 * HOUR),
        running("n-b2", team="nlp", gpus=4, borrowed=True, age=2 * HOUR),
        running("v0", gpus=6),
        running("g0", team="guest", gpus=2, borrowed=True, age=2 * HOUR),
    ]
    decision = decide([queued("v1", gpus=2)], held, [], NOW, roomy)
    assert decision.preemptions == [Preemption("g0", "v1")]  # guest's quota is 0: all surplus
    # With its 4-GPU borrower's team over its quota by 2, a 2-GPU job takes 2 but not 4:
    over = [*held[:3], running("n-own", team="nlp", gpus=4, age=3 * HOUR)]
    tight = roomy.model_copy(update={"max_gpus": 16})
    two = decide([queued("v1", gpus=2)], over, [], NOW, tight)
    assert two.preemptions == [Preemption("n-b1", "v1")]
    three = decide([queued("v1", gpus=3)], over, [], NOW, tight)
    assert three.preemptions == [] and three.waiting["v1"] is not WaitReason.PREEMPTING
    # Urgent work is not a same-class reclaim: a high job takes a lower-class borrower as
    # before, even of a team within its quota.
    urgent = decide([queued("v-high", priority=Priority.HIGH, gpus=2)], held, [], NOW, roomy)
    assert urgent.preemptions == [Preemption("n-b1", "v-high")]


def test_urgent_work_larger_than_its_quota_takes_gpus_lower_classes_borrowed() -> None:
    # guest's quota is 0 and the fleet is full: its 4-GPU high job may borrow, never run
    # entitled. nlp's normal work holds 4 GPUs beyond nlp's quota, borrowed: the high job
    # takes them (they pass from a borrower to more urgent work; nlp keeps its own 8).
    full = POLICY.model_copy(
        update={"max_gpus": 20, "reserve_share": 0.0, "default_team": TeamQuota(gpus=0, borrow=8)}
    )
    held = [
        running("n-own", team="nlp", gpus=8, age=3 * HOUR),
        running("n-b", team="nlp", gpus=4, borrowed=True),
        running("v0", gpus=8),
    ]
    urgent = queued("g-high", team="guest", priority=Priority.HIGH, gpus=4)
    assert decide([urgent], held, [], NOW, full).preemptions == [Preemption("n-b", "g-high")]
    # The same GPUs, but nlp's other work has ended: n-b now holds nlp's own quota, and the
    # borrower's mark does not make it fair game.
    within = [held[1], held[2], running("v1", gpus=8)]
    spared = decide([urgent], within, [], NOW, full)
    assert spared.preemptions == [] and spared.waiting["g-high"] is not WaitReason.PREEMPTING
    # Normal work does not take borrowed GPUs from other teams to borrow them itself.
    normal = decide([replace(urgent, priority=Priority.NORMAL)], held, [], NOW, full)
    assert normal.preemptions == []


def test_nominees_go_highest_class_first_so_room_freed_for_urgent_work_stays_its_own() -> None:
    # Both were preempted for: the normal nominee has waited 9 hours (aging ranks it far
    # above fresh high work), and 1 GPU is free. It goes to the high nominee.
    strict = POLICY.model_copy(update={"teams": {"vision": TeamQuota(gpus=4, borrow=0)}})
    aged = queued("v-aged", gpus=1, waited=9 * HOUR)
    urgent = queued("v-high", priority=Priority.HIGH, gpus=1)
    victims = [
        replace(queued("v-x", gpus=1), preempted_for="v-aged"),
        replace(queued("v-y", gpus=1), preempted_for="v-high"),
    ]
    held = [running(f"v{i}", gpus=1) for i in range(3)]
    decision = decide([aged, urgent, *victims], held, [], NOW, strict)
    assert ids(decision.admitted) == ["v-high"]
    assert admission_order([aged, urgent], NOW, strict)[0] is aged  # aging alone: aged first


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


# -- a pass reads each stream only as far as it needs --------------------------------------------


def counted(jobs: list[QueuedJob], reads: Counter[str], key: str) -> Iterator[QueuedJob]:
    for job in jobs:
        reads[key] += 1
        yield job


def test_a_stream_whose_shapes_cannot_be_admitted_is_not_read_however_long() -> None:
    # vision holds its quota and all it may borrow; 10,000 of its jobs wait, older and of a
    # higher class than one job of nlp, and none of them may preempt (nothing of a lower class).
    held = [running("v-held", priority=Priority.HIGH, gpus=12, borrowed=True)]
    blocked = [
        queued(f"v{i}", priority=Priority.HIGH, gpus=2, waited=HOUR + i) for i in range(10_000)
    ]
    nlp = queued("n1", team="nlp", gpus=1)
    reads: Counter[str] = Counter()
    waiting = WaitingJobs(
        [
            Stream("vision", Priority.HIGH, frozenset({(2, 1)}), counted(blocked, reads, "vision")),
            Stream("nlp", Priority.NORMAL, frozenset({(1, 1)}), counted([nlp], reads, "nlp")),
        ]
    )
    decision = decide_streams(waiting, held, [], NOW, POLICY)
    assert ids(decision.admitted) == ["n1"]
    # Of vision's 10,000 jobs only the first, the pass's first job to wait for room: it is read
    # to hold the reservation.
    assert reads == {"nlp": 1, "vision": 1}
    assert decision.reservation is not None and decision.reservation.job_id == "v0"
    assert decision.blocked_streams == {("vision", Priority.HIGH): WaitReason.QUOTA}


def test_a_stream_of_jobs_that_wait_is_read_no_further_than_the_lookahead() -> None:
    # Each of vision's jobs costs more than is left of its budget: the pass cannot tell from the
    # shapes, reads a page past the first, and stops there. A cheap job within the page runs.
    budgeted = POLICY.model_copy(
        update={"teams": {**POLICY.teams, "vision": TeamQuota(gpus=8, monthly_budget_usd=100.0)}}
    )
    dear = [
        replace(queued(f"v{i:05d}", gpus=1, waited=HOUR + 10_000 - i), estimated_cost_usd=20.0)
        for i in range(10_000)
    ]
    dear[5] = replace(dear[5], estimated_cost_usd=1.0)  # within the lookahead: admitted
    dear[LOOKAHEAD + 50] = replace(dear[LOOKAHEAD + 50], estimated_cost_usd=1.0)  # behind it
    nlp = queued("n1", team="nlp", gpus=1)
    reads: Counter[str] = Counter()
    waiting = WaitingJobs(
        [
            Stream("vision", Priority.NORMAL, frozenset({(1, 1)}), counted(dear, reads, "vision")),
            Stream("nlp", Priority.NORMAL, frozenset({(1, 1)}), counted([nlp], reads, "nlp")),
        ]
    )
    decision = decide_streams(waiting, [], [], NOW, budgeted, team_spend_usd={"vision": 90.0})
    assert ids(decision.admitted) == [dear[5].job_id, "n1"]
    assert reads["vision"] == 6 + LOOKAHEAD  # the count starts again after an admission
    assert decision.blocked_streams == {("vision", Priority.NORMAL): WaitReason.BEHIND}


def test_a_job_preempted_before_may_preempt_where_one_of_its_shape_may_not() -> None:
    # The fleet's instances are full; guest borrows, and nlp leaves 2 GPUs of its quota idle.
    # Both vision jobs ask for what a guest borrower frees. The one never preempted would
    # borrow nlp's idle quota, and a job that would borrow takes from nobody. The one preempted
    # before may not borrow again: it would run in the reserve (open to low work at night), so
    # it preempts. Its stream's shape, and the first job of that shape finding no victims, must
    # not hide it: the shape is the same, but it may do what a job never preempted may not.
    night = POLICY.model_copy(
        update={
            "windows": [
                TimeWindow(name="night", start="22:00", end="06:00", reserve_open_to=[Priority.LOW])
            ]
        }
    )
    at_night = NOW + 11 * HOUR  # 23:00 UTC
    full = [
        RunningJob("v1", "vision", Priority.NORMAL, 8, 1, at_night - HOUR),
        RunningJob("n1", "nlp", Priority.NORMAL, 4, 4, at_night - HOUR),
        RunningJob("n2", "nlp", Priority.NORMAL, 2, 2, at_night - HOUR),
        # Of the preemptors' own class (no job preempts a higher one), run an hour: past
        # reclaim_after_seconds.
        RunningJob("g1", "guest", Priority.LOW, 2, 2, at_night - HOUR, borrowed=True),
    ]
    fresh = QueuedJob("fresh", "vision", Priority.LOW, 2, 2, at_night - 2 * HOUR)
    again = QueuedJob("again", "vision", Priority.LOW, 2, 2, at_night - HOUR, preemptions=1)
    alone = decide([fresh], full, [], at_night, night)
    assert alone.preemptions == [] and alone.waiting == {"fresh": WaitReason.CAPACITY}
    decision = decide([fresh, again], full, [], at_night, night)
    assert decision.preemptions == [Preemption("g1", "again")]
    assert decision.waiting == {"fresh": WaitReason.CAPACITY, "again": WaitReason.PREEMPTING}


streams_strategy = st.lists(
    st.tuples(
        st.sampled_from(["vision", "nlp", "guest"]),
        st.sampled_from(list(Priority)),
        st.integers(min_value=0, max_value=10),
        st.integers(min_value=1, max_value=3),
        st.floats(min_value=0, max_value=10 * HOUR),
        st.booleans(),
    ),
    max_size=30,
)


@settings(max_examples=200, deadline=None)
@given(streams_strategy, streams_strategy, st.sampled_from([NOW, NOW - 13 * HOUR]))
# Found by Hypothesis: q10, once preempted, may not borrow, so it preempts r3 to run in the
# reserve; a job of its shape never preempted would borrow and may not.
@example(
    waiting_specs=[
        *[("vision", Priority.CRITICAL, 0, 1, 0.0, False)] * 10,
        ("guest", Priority.LOW, 0, 3, 6 * HOUR, True),
    ],
    running_specs=[
        ("vision", Priority.CRITICAL, 0, 1, 0.0, False),
        ("vision", Priority.CRITICAL, 0, 1, 0.0, False),
        ("vision", Priority.CRITICAL, 0, 2, 0.0, False),
        ("vision", Priority.HIGH, 0, 3, 600.0, True),
        ("guest", Priority.CRITICAL, 1, 1, 0.0, False),
    ],
    now=NOW - 13 * HOUR,
)
def test_judging_streams_by_their_shapes_never_changes_what_a_pass_does(
    waiting_specs: list[tuple[str, Priority, int, int, float, bool]],
    running_specs: list[tuple[str, Priority, int, int, float, bool]],
    now: float,
) -> None:
    # Exactness: a stream the shapes close holds nothing the pass would have admitted or
    # preempted for. Streams with no shapes known are read to the end: the reference.
    night = POLICY.model_copy(
        update={
            "windows": [
                TimeWindow(name="night", start="22:00", end="06:00", reserve_open_to=[Priority.LOW])
            ]
        }
    )
    jobs = [
        QueuedJob(f"q{i}", team, prio, gpus, nodes, now - waited, preemptions=int(again))
        for i, (team, prio, gpus, nodes, waited, again) in enumerate(waiting_specs)
    ]
    held = [
        RunningJob(f"r{i}", team, prio, gpus, nodes, now - waited, borrowed=borrowed)
        for i, (team, prio, gpus, nodes, waited, borrowed) in enumerate(running_specs)
    ]
    judged = decide_streams(WaitingJobs.of(jobs), held, [], now, night, lookahead=None)
    unknown = [replace(s, shapes=frozenset()) for s in streams_of(jobs)]
    read_all = decide_streams(
        WaitingJobs(unknown, nominees_of(jobs)), held, [], now, night, lookahead=None
    )
    assert judged.admitted == read_all.admitted
    assert judged.preemptions == read_all.preemptions
    assert read_all.blocked_streams == {}


# -- what no state of the fleet could ever admit ---------------------------------------------------


def test_a_job_no_cap_can_hold_is_named_with_the_numbers() -> None:
    def why(job: QueuedJob, policy: QueuePolicy = POLICY, booked: int = 0) -> str | None:
        return never_admissible(job, policy, booked)

    too_many_nodes = QueuedJob("n", "vision", Priority.NORMAL, 8, 11, NOW)
    assert why(too_many_nodes) == "asks for 11 instances; the fleet's cap is 10"
    assert why(queued("big", gpus=24)) == "asks for 24 GPUs; the fleet's cap is 20"
    # vision may hold its quota 8 plus 4 borrowed from nlp's idle quota: 12, not 13.
    assert why(queued("v12", gpus=12)) is None
    assert why(queued("v13", gpus=13)) == (
        "asks for 13 GPUs; team vision may hold 12 (its quota 8 + 4 borrowed)"
    )
    # Borrowing needs another team's idle quota: alone in the fleet, vision cannot borrow.
    alone = POLICY.model_copy(update={"teams": {"vision": TeamQuota(gpus=8, borrow=4)}})
    assert why(queued("v9", gpus=9), alone) == (
        "asks for 9 GPUs; team vision may hold 8 (its quota 8 + 0 borrowed)"
    )
    # Critical work may run in the reserve (2 GPUs) outside its team's quota.
    assert why(queued("g2", team="guest", priority=Priority.CRITICAL, gpus=2)) is None
    assert why(queued("g3", team="guest", priority=Priority.CRITICAL, gpus=3)) == (
        "asks for 3 GPUs; team guest may hold 2 (its quota 0 + 2 borrowed), or 2 in the reserve"
    )
    # The top 2 GPUs are the reserve: the whole fleet is for critical work (and what a window
    # opens the reserve to) only.
    everything = POLICY.model_copy(update={"teams": {"vision": TeamQuota(gpus=20)}})
    assert why(queued("all", gpus=20), everything) == (
        "asks for 20 GPUs; normal work may use 18 of the fleet's 20 (the other 2 are the "
        "reserve, for critical work and the classes a time window opens it to)"
    )
    assert why(queued("all", priority=Priority.CRITICAL, gpus=20), everything) is None
    night = everything.model_copy(
        update={
            "windows": [
                TimeWindow(name="n", start="22:00", end="06:00", reserve_open_to=[Priority.NORMAL])
            ]
        }
    )
    assert why(queued("all", gpus=20), night) is None
    # A booking raises what the team may hold.
    assert why(queued("v16", gpus=16), POLICY, booked=4) is None
    # An estimate above the team's monthly budget can never be admitted either.
    budgeted = POLICY.model_copy(
        update={"teams": {"vision": TeamQuota(gpus=8, monthly_budget_usd=50.0)}}
    )
    assert why(replace(queued("dear"), estimated_cost_usd=60.0), budgeted) == (
        "its estimated cost $60.00 exceeds team vision's monthly budget $50.00"
    )


@settings(max_examples=200, deadline=None)
@given(
    st.sampled_from(["vision", "nlp", "guest"]),
    st.sampled_from(list(Priority)),
    st.integers(min_value=0, max_value=24),
    st.integers(min_value=1, max_value=12),
    st.sampled_from([[], [Priority.LOW], [Priority.NORMAL, Priority.HIGH]]),
)
def test_a_job_is_refused_exactly_when_no_pass_at_any_hour_admits_it_into_an_idle_fleet(
    team: str, priority: Priority, gpus: int, nodes: int, opened: list[Priority]
) -> None:
    policy = POLICY.model_copy(
        update={
            "windows": [TimeWindow(name="w", start="22:00", end="06:00", reserve_open_to=opened)]
        }
    )
    job = QueuedJob("j", team, priority, gpus, nodes, NOW)
    hours = [NOW + h * HOUR for h in range(24)]
    admitted = any(decide([job], [], [], at, policy).admitted for at in hours)
    assert (never_admissible(job, policy) is None) == admitted


def test_most_booked_is_the_most_a_teams_bookings_hold_at_once() -> None:
    bookings = [
        Booking("a", "nlp", 4, NOW, NOW + 2 * HOUR),
        Booking("b", "nlp", 6, NOW + HOUR, NOW + 3 * HOUR),  # overlaps a: 10
        Booking("c", "nlp", 8, NOW + 2 * HOUR, NOW + 4 * HOUR),  # starts as a ends: 14 with b
        Booking("d", "vision", 50, NOW, NOW + HOUR),
        Booking("e", "nlp", 40, NOW - 2 * HOUR, NOW - HOUR),  # over already
    ]
    assert most_booked("nlp", bookings, NOW) == 14
    assert most_booked("nlp", bookings, NOW + 3 * HOUR) == 8
    assert most_booked("audio", bookings, NOW) == 0


# -- reservations: the first job that waits for room holds it ------------------------------------


def run_passes(
    arrivals: list[tuple[float, QueuedJob, float]],
    policy: QueuePolicy,
    *,
    every: float,
    passes: int,
) -> dict[str, float]:
    """Pass after pass, `every` seconds apart from NOW: jobs arrive (at, job, true duration),
    run for their true duration, and end before the next pass after it. When each job was
    admitted."""
    pending = sorted(arrivals, key=lambda a: a[0])
    duration = {job.job_id: seconds for _, job, seconds in arrivals}
    waiting: dict[str, QueuedJob] = {}
    run: dict[str, RunningJob] = {}
    admitted_at: dict[str, float] = {}
    now = NOW
    for _ in range(passes):
        while pending and pending[0][0] <= now:
            _, job, _ = pending.pop(0)
            waiting[job.job_id] = job
        for job_id in [j for j, r in run.items() if r.admitted_at + duration[j] <= now]:
            del run[job_id]
        decision = decide(waiting.values(), run.values(), [], now, policy)
        for admission in decision.admitted:
            job = waiting.pop(admission.job_id)
            admitted_at[job.job_id] = now
            run[job.job_id] = RunningJob(
                job.job_id,
                job.team,
                job.priority,
                job.gpus,
                job.instances,
                now,
                borrowed=admission.borrowed,
                in_reserve=admission.in_reserve,
                expected_end=now + job.expected_seconds,
            )
        now += every
    return admitted_at


def test_a_large_job_behind_a_stream_of_small_ones_of_its_team_starts_in_bounded_time() -> None:
    # The probe of issue 18: vision may hold 8 GPUs and borrows none; 8 one-GPU jobs run,
    # ending 450 s apart, and two more of an hour arrive every pass. The 8-GPU job, older than all
    # that arrive, used to wait forever: a freed GPU always went to the next small job.
    strict = POLICY.model_copy(update={"teams": {"vision": TeamQuota(gpus=8, borrow=0)}})
    every = 300.0

    def small(job_id: str, at: float, seconds: float) -> tuple[float, QueuedJob, float]:
        job = QueuedJob(job_id, "vision", Priority.NORMAL, 1, 1, at, expected_seconds=seconds)
        return (at, job, seconds)

    # The first 8 were queued before it and end 450 s apart; the stream then keeps coming.
    first = [small(f"s{i}", NOW - HOUR + i, 450.0 * (i + 1)) for i in range(8)]
    stream = [small(f"t{p:03d}{k}", NOW + every * p, HOUR) for p in range(200) for k in range(2)]
    large = replace(queued("large", gpus=8, waited=60), expected_seconds=HOUR)
    admitted = run_passes([*first, *stream, (NOW, large, HOUR)], strict, every=every, passes=200)
    # It starts once the small jobs running when it arrived have ended (within an hour, the
    # longest expected run) and the pass after: no small job admitted meanwhile delays it.
    assert "large" in admitted
    assert admitted["large"] - NOW <= HOUR + every
    # And the stream goes on after it.
    assert sum(1 for job_id in admitted if admitted[job_id] > admitted["large"]) > 100


def test_a_job_that_fits_now_waits_reserved_only_if_it_would_delay_the_reservation() -> None:
    strict = POLICY.model_copy(update={"teams": {"vision": TeamQuota(gpus=8, borrow=0)}})
    held = [replace(running(f"r{i}", age=HOUR), expected_end=NOW + 600 * (i + 1)) for i in range(6)]
    large = replace(queued("large", gpus=4, waited=HOUR), expected_seconds=HOUR)
    short = replace(queued("short", waited=60), expected_seconds=1200)  # ends before its start
    long = replace(queued("long", waited=30), expected_seconds=2 * HOUR)
    decision = decide([large, short, long], held, [], NOW, strict)
    # 2 GPUs free; large needs 4: it is expected to start when r1 ends, 1,200 s from now.
    assert decision.reservation is not None
    assert (decision.reservation.job_id, decision.reservation.start) == ("large", NOW + 1200)
    assert ids(decision.admitted) == ["short"]
    assert decision.waiting["long"] is WaitReason.RESERVED
    # A long job of another team takes nothing the reserved job needs (its own quota, and
    # the fleet's cap has room for both): it is admitted.
    both = strict.model_copy(
        update={"teams": {"vision": TeamQuota(gpus=8), "nlp": TeamQuota(gpus=8)}}
    )
    elsewhere = replace(long, team="nlp")
    assert ids(decide([large, elsewhere], held, [], NOW, both).admitted) == ["long"]


def test_a_higher_class_is_not_held_back_by_a_lower_class_reservation() -> None:
    strict = POLICY.model_copy(update={"teams": {"vision": TeamQuota(gpus=8, borrow=0)}})
    held = [replace(running(f"r{i}"), expected_end=NOW + 600 * (i + 1)) for i in range(6)]
    # Aged 10 hours, the normal job ranks ahead of the fresh high one, and holds the
    # reservation; the high job, which fits, still starts now.
    aged = replace(queued("aged", gpus=4, waited=10 * HOUR), expected_seconds=HOUR)
    urgent = replace(queued("urgent", priority=Priority.HIGH), expected_seconds=2 * HOUR)
    decision = decide([aged, urgent], held, [], NOW, strict)
    assert decision.reservation is not None and decision.reservation.job_id == "aged"
    assert ids(decision.admitted) == ["urgent"]
    # Of its own class, the same job would have waited.
    same = replace(urgent, priority=Priority.NORMAL)
    assert decide([aged, same], held, [], NOW, strict).waiting["urgent"] is WaitReason.RESERVED


@settings(max_examples=60, deadline=None)
@given(
    st.lists(
        st.tuples(
            st.sampled_from(["vision", "nlp"]),
            st.integers(1, 12),  # GPUs: up to a team's quota and borrowing
            st.integers(1, 12),  # true and expected run time, in 10-minute steps
            st.integers(0, 36),  # arrival, in 10-minute steps
        ),
        min_size=1,
        max_size=30,
    )
)
def test_no_job_waits_longer_than_the_bound_the_docs_state(
    specs: list[tuple[str, int, int, int]],
) -> None:
    # docs/queues.md, "Reservations": with exact estimates, one class and no preemption, a
    # job waits at most every + (k + 1) x (longest run + every), k the jobs ahead of it when it
    # arrived (queued before it and still waiting).
    policy = POLICY.model_copy(update={"preemption": False})
    every, step = 300.0, 600.0
    arrivals = [
        (
            NOW + step * at,
            replace(
                QueuedJob(f"j{i:02d}", team, Priority.NORMAL, gpus, 1, NOW + step * at),
                expected_seconds=step * runs,
            ),
            step * runs,
        )
        for i, (team, gpus, runs, at) in enumerate(specs)
    ]
    longest = max(seconds for *_, seconds in arrivals)
    # Passes until the bound of the last job to arrive, with every job ahead of it.
    last = max(at for at, *_ in arrivals) - NOW
    horizon = last + every + (len(specs) + 1) * (longest + every)
    admitted = run_passes(arrivals, policy, every=every, passes=int(horizon // every) + 2)
    order = sorted(arrivals, key=lambda a: (a[1].enqueued_at, a[1].job_id))
    for at, job, _ in arrivals:
        ahead = sum(
            1
            for other_at, other, _ in order
            if (other.enqueued_at, other.job_id) < (job.enqueued_at, job.job_id)
            and other_at <= at
            and admitted.get(other.job_id, float("inf")) > at
        )
        assert job.job_id in admitted
        assert admitted[job.job_id] - at <= every + (ahead + 1) * (longest + every)
