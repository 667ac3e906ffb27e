"""Time windows do more than open the reserve: caps, team quotas, paused and drained classes,
all through the one effective policy (`policy_at`)."""

from __future__ import annotations

from dataclasses import replace

import pytest

from gpufleet.domain.catalog import load_bundled
from gpufleet.domain.config import ConfigFileError, FleetConfig, config_from_yaml
from gpufleet.domain.queueing import (
    Admission,
    Booking,
    BookingRefused,
    QueuedJob,
    QueuePolicy,
    QuotaOverride,
    RunningJob,
    TeamQuota,
    TimeWindow,
    WaitReason,
    admission_limits,
    check_booking,
    decide,
    never_admissible,
    next_window_change,
    policy_at,
)
from gpufleet.domain.settlement import WINDOW
from gpufleet.domain.spec import Priority
from gpufleet.services.lifecycle_base import control_key
from gpufleet.services.workflow_state import WorkflowState
from gpufleet.sim.engine import Workload, simulate
from gpufleet.sim.mapping import TraceMapping, to_spec
from gpufleet.sim.policies import cap_and_pool, gpufleet_policy
from gpufleet.sim.traces import TraceJob
from tests.helpers import make_settings
from tests.unit import test_dispatcher

HOUR = 3600.0
DAY = 1_767_225_600.0  # 2026-01-01 00:00 UTC
NIGHT = DAY + 23 * HOUR
MORNING = DAY + 24 * HOUR + 7 * HOUR  # 07:00 the next day

# The issue's example, as configuration: "22:00-06:00: low priority and preprocessing get the
# idle GPUs; 06:00: give them back".
CONFIG = """
queue:
  max_gpus: 32
  reserve_share: 0.1
  teams:
    training: {gpus: 24, borrow: 0}
    preprocessing: {gpus: 4, borrow: 0}
  default_team: {gpus: 0, borrow: 0}
  windows:
    - name: night
      start: "22:00"
      end: "06:00"
      max_gpus: 48
      teams: {preprocessing: {gpus: 40}}
      reserve_open_to: [low]
    - name: day
      start: "06:00"
      end: "22:00"
      drain: [low]
"""
POLICY = config_from_yaml(CONFIG).queue


def queued(
    job_id: str, team: str = "preprocessing", priority: Priority = Priority.LOW, gpus: int = 8
) -> QueuedJob:
    return QueuedJob(job_id, team, priority, gpus, 1, NIGHT - HOUR)


def running(
    job_id: str,
    team: str = "preprocessing",
    priority: Priority = Priority.LOW,
    gpus: int = 8,
    at: float = NIGHT,
) -> RunningJob:
    return RunningJob(job_id, team, priority, gpus, 1, at - 2 * HOUR)


def test_the_effective_policy_is_the_windows_cap_and_quotas_while_it_is_active() -> None:
    night = policy_at(POLICY, NIGHT)
    assert night.max_gpus == 48
    assert night.quota("preprocessing") == TeamQuota(gpus=40, borrow=0)
    assert night.quota("training") == POLICY.quota("training")  # not named: its own
    assert policy_at(POLICY, MORNING) == POLICY  # the day window changes neither
    assert policy_at(QueuePolicy(), NIGHT) == QueuePolicy()  # no window: the policy itself


def test_at_night_preprocessing_gets_the_idle_gpus_and_in_the_morning_gives_them_back() -> None:
    jobs = [queued(f"p{i}") for i in range(5)]
    night = decide(jobs, [], [], NIGHT, POLICY)
    # 40 GPUs of its night quota, within the night's cap of 48 outside the reserve (5).
    assert [a.job_id for a in night.admitted] == ["p0", "p1", "p2", "p3", "p4"]
    by_day = decide([queued("p5")], [running(j.job_id) for j in jobs], [], MORNING, POLICY)
    # 06:00: the day window drains low work (checkpoint, requeue) and admits none.
    assert by_day.window_drains == ["p0", "p1", "p2", "p3", "p4"]
    assert by_day.reclaims == [] and by_day.admitted == []
    assert by_day.waiting == {"p5": WaitReason.PAUSED}
    # Work of other classes runs as usual meanwhile.
    normal = decide([queued("n", priority=Priority.NORMAL, gpus=4)], [], [], MORNING, POLICY)
    assert [a.job_id for a in normal.admitted] == ["n"]


def test_a_paused_class_waits_while_its_window_is_active_and_runs_after() -> None:
    policy = POLICY.model_copy(
        update={
            "windows": [TimeWindow(name="batch", start="09:00", end="17:00", pause=[Priority.HIGH])]
        }
    )
    job = queued("h", team="training", priority=Priority.HIGH)
    paused = decide([job], [], [], DAY + 10 * HOUR, policy)
    assert paused.waiting == {"h": WaitReason.PAUSED} and paused.window_drains == []
    # Paused, not drained: what runs keeps running.
    assert (
        decide(
            [], [running("r", "training", Priority.HIGH)], [], DAY + 10 * HOUR, policy
        ).window_drains
        == []
    )
    assert [a.job_id for a in decide([job], [], [], DAY + 18 * HOUR, policy).admitted] == ["h"]


def test_the_limits_an_admission_is_written_under_are_the_windows() -> None:
    job = queued("p")
    admission = Admission("p", borrowed=False, in_reserve=False)
    night = admission_limits(job, admission, [], NIGHT, POLICY)
    assert (night.max_gpus, night.team_gpus) == (48 - 5, 40)
    day = admission_limits(job, admission, [], MORNING, POLICY)
    assert (day.max_gpus, day.team_gpus) == (32 - 4, 4)


def test_a_job_only_a_windows_cap_or_quota_holds_is_admissible() -> None:
    assert never_admissible(queued("p", gpus=40), POLICY) is None
    too_big = never_admissible(queued("p", gpus=41), POLICY)
    assert too_big is not None and "asks for 41 GPUs" in too_big


def test_a_booking_is_checked_against_the_smallest_cap_a_window_sets() -> None:
    policy = POLICY.model_copy(
        update={
            "windows": [TimeWindow(name="maintenance", start="02:00", end="03:00", max_gpus=16)]
        }
    )
    # 16 GPUs, 2 of them the reserve: 14 can be booked at every moment.
    booking = Booking("b1", "training", gpus=20, start=DAY + 10 * HOUR, end=DAY + 12 * HOUR)
    with pytest.raises(BookingRefused, match="the fleet holds 14 GPUs"):
        check_booking(booking, [], DAY, policy)
    check_booking(Booking("b2", "training", 14, DAY + 10 * HOUR, DAY + 12 * HOUR), [], DAY, policy)


def test_the_next_window_change_is_the_next_start_or_end() -> None:
    assert next_window_change(POLICY, NIGHT) == DAY + 30 * HOUR  # 06:00 tomorrow
    assert next_window_change(POLICY, DAY + 6 * HOUR) == DAY + 22 * HOUR
    assert next_window_change(QueuePolicy(), NIGHT) is None


@pytest.mark.parametrize(
    ("window", "problem"),
    [
        ("{name: w, start: '22:00', end: '06:00', pause: [critical]}", "never paused or drained"),
        ("{name: w, start: '22:00', end: '06:00', drain: [critical]}", "never paused or drained"),
        ("{name: w, start: '22:00', end: '06:00', teams: {nobody: {gpus: 1}}}", "nobody"),
        ("{name: w, start: '22:00', end: '06:00', max_gpus: 1}", "leaves none of its max_gpus"),
        ("{name: w, start: '22:00', end: '06:00', teams: {a: {gpus: -1}}}", "gpus"),
    ],
)
def test_a_window_the_fleet_could_not_honour_is_refused_with_the_config(
    window: str, problem: str
) -> None:
    text = f"queue: {{max_gpus: 32, teams: {{a: {{gpus: 4}}}}, windows: [{window}]}}"
    with pytest.raises(ConfigFileError, match=problem):
        config_from_yaml(text)


def test_a_quota_override_replaces_only_the_fields_it_gives() -> None:
    policy = QueuePolicy(
        teams={"a": TeamQuota(gpus=4, borrow=2, monthly_budget_usd=100.0)},
        windows=[
            TimeWindow(name="w", start="00:00", end="23:59", teams={"a": QuotaOverride(borrow=8)})
        ],
    )
    assert policy_at(policy, DAY + HOUR).quota("a") == TeamQuota(
        gpus=4, borrow=8, monthly_budget_usd=100.0
    )


def test_the_dispatcher_drains_a_class_at_its_windows_start_and_holds_it_back() -> None:
    policy = test_dispatcher.POLICY.model_copy(
        update={
            "windows": [TimeWindow(name="day", start="06:00", end="22:00", drain=[Priority.LOW])]
        }
    )
    # Its clock: 2026-01-01 00:00 UTC, no window active.
    world = test_dispatcher.World(make_settings(config=FleetConfig(queue=policy)))
    job_id = world.submit("etl", "low")
    world.enqueue(job_id)
    assert world.dispatcher.run_pass().admitted == [job_id]
    instance = world.start(job_id)
    world.clock.advance(6 * HOUR)  # 06:00: the day window begins
    result = world.dispatcher.run_pass()
    assert result.window_drained == [job_id] and result.reclaimed == []
    assert world.ports.jobs.get(job_id).drain_reason == WINDOW
    objects = world.ports.objects.objects  # type: ignore[attr-defined]
    assert '"checkpoint"' in objects[control_key(job_id)].decode()
    assert world.dispatcher.run_pass().window_drained == []  # asked once
    # It checkpoints and stops: back to the queue, no retry or preemption counted.
    assert world.finish(job_id, instance)["exit_code"] == 0
    released = world.lifecycle.release(
        job_id, WorkflowState.model_validate({"run": {"exit_code": 0}})
    )
    assert released["requeue"] is True
    job = world.ports.jobs.get(job_id)
    assert (job.retries, job.preemptions) == (0, 0)
    world.plans[job_id] = world.lifecycle.requeue(job_id)
    world.enqueue(job_id)
    held = world.dispatcher.run_pass()
    # Its stream is not read while the window holds its class back.
    assert held.admitted == [] and held.blocked == {"research/low": "paused"}
    world.clock.advance(16 * HOUR)  # 22:00: the window ends
    assert world.dispatcher.run_pass().admitted == [job_id]


def test_the_simulator_drains_and_holds_back_a_class_as_the_lambdas_do() -> None:
    mapping = TraceMapping(high_share=0.0)
    # Two 3-hour low-priority jobs submitted at 05:00 UTC (the trace's clock): they start,
    # the day window drains them at 06:00 and holds them back until 22:00.
    jobs = tuple(
        TraceJob(f"etl-{i}", submit_seconds=5 * HOUR, duration_seconds=3 * HOUR, gpus=1, team="lab")
        for i in range(2)
    )
    specs = tuple(to_spec(j, mapping).model_copy(update={"priority": Priority.LOW}) for j in jobs)
    workload = Workload(jobs, specs, mapping, "windowed")
    day = TimeWindow(name="day", start="06:00", end="22:00", drain=[Priority.LOW])
    cap, pool = cap_and_pool(workload, load_bundled(), mapping.region, 8)
    base = QueuePolicy(teams={"lab": TeamQuota(gpus=8)}, windows=[day])
    result = simulate(workload, gpufleet_policy(workload, cap, pool, base), seed=1)
    assert result.completed == 2
    assert result.window_drains == 2 and result.preemptions == 0
    # Each ran an hour, then its last two after 22:00: done no earlier than 00:00.
    assert all(jct is not None and jct >= 19 * HOUR for jct in result.jcts)
    without = simulate(
        workload,
        gpufleet_policy(workload, cap, pool, base.model_copy(update={"windows": []})),
        seed=1,
    )
    assert without.window_drains == 0
    assert all(jct is not None and jct < 5 * HOUR for jct in without.jcts)


def test_a_nominee_the_window_holds_back_does_not_keep_its_victims_waiting() -> None:
    policy = POLICY.model_copy(
        update={
            "windows": [TimeWindow(name="w", start="00:00", end="23:59", pause=[Priority.NORMAL])]
        }
    )
    nominee = queued("n", team="training", priority=Priority.NORMAL)
    victim = replace(queued("v", team="training"), preempted_for="n")  # low, stopped for n
    decision = decide([nominee, victim], [], [], NIGHT, policy)
    assert decision.waiting == {"n": WaitReason.PAUSED}
    assert [a.job_id for a in decision.admitted] == ["v"]
