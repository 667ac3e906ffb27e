"""The engine on a small made-up region: durations from history, the measured market in the
loop, skypilot-like's recovery, launch backoff and the independent cost lower bound.

No shared data needed: the measured processes and availability traces here are synthetic.
"""

from __future__ import annotations

import itertools
import random
import statistics
from pathlib import Path

import pytest

from gpufleet.domain.catalog import Catalog, Offering
from gpufleet.domain.duration import PastRun, estimate_duration
from gpufleet.domain.selection import hourly_hazard
from gpufleet.domain.settlement import DEFAULT_MAX_INTERRUPTIONS
from gpufleet.sim import engine as engine_module
from gpufleet.sim.engine import DurationModel, EngineConfig, SimResult, Workload, simulate
from gpufleet.sim.mapping import TraceMapping, to_spec
from gpufleet.sim.market import Lease, MarketConfig, MarketModel
from gpufleet.sim.measured import AvailabilityTrace, MeasuredSpot, PreemptionProcess
from gpufleet.sim.policies import (
    FIFO_SPOT,
    GPUFLEET,
    POLICY_NAMES,
    SKYPILOT_LIKE,
    build_policies,
)
from gpufleet.sim.report import cost_lower_bound_usd, policy_metrics
from gpufleet.sim.traces import TraceJob
from tests.unit.test_sim_measured import nvidia_type

REGION = "test-1"
HOUR = 3600.0
BOOT = 180.0


ONE = nvidia_type("g9.xlarge", 1)
FOUR = nvidia_type("g9.12xlarge", 4, efa=True)


def catalog() -> Catalog:
    """One-GPU g9.xlarge: spot in zone a ($0.30) and b ($0.40), on-demand $1.00. Four-GPU
    g9.12xlarge (EFA): spot $0.80 in zone a (cheaper per GPU), on-demand $4.00."""
    return Catalog(
        [ONE, FOUR],
        [
            Offering(ONE, REGION, "test-1a", "spot", 0.30, 4),
            Offering(ONE, REGION, "test-1b", "spot", 0.40, 4),
            Offering(ONE, REGION, "test-1a", "on-demand", 1.00, None),
            Offering(FOUR, REGION, "test-1a", "spot", 0.80, 4),
            Offering(FOUR, REGION, "test-1a", "on-demand", 4.00, None),
        ],
    )


def workload(jobs: list[TraceJob], mapping: TraceMapping | None = None) -> Workload:
    m = mapping or TraceMapping(region=REGION, high_share=0.0)
    return Workload(tuple(jobs), tuple(to_spec(j, m) for j in jobs), m, "made-up")


def job(i: int, submit: float, duration: float, gpus: int = 1, team: str = "lab") -> TraceJob:
    return TraceJob(f"j{i:03d}", submit, duration, gpus, team=team)


def advisor_market(**config: object) -> MarketModel:
    """No interruptions, no launch failures: a run holds its instances boot + duration."""
    base = {"hazard_scale": 0.0, "spot_launch_failure": 0.0}
    return MarketModel(catalog(), REGION, MarketConfig.model_validate({**base, **config}))


def run(
    w: Workload,
    name: str,
    market: MarketModel,
    durations: DurationModel = "history",
    seed: int = 0,
    cap_gpus: int | None = 64,
) -> SimResult:
    (policy,) = build_policies([name], w, catalog=market.catalog, region=REGION, cap_gpus=cap_gpus)
    return simulate(w, policy, seed=seed, market=market, config=EngineConfig(durations=durations))


# --- Durations ----------------------------------------------------------------------------------


def sequential(
    durations: list[float], team: str = "lab", gpus: int = 1, first: int = 0
) -> list[TraceJob]:
    """Jobs that each arrive after the one before has finished (boot included)."""
    out, t = [], 0.0
    for i, d in enumerate(durations):
        out.append(job(first + i, t, d, gpus, team))
        t += d + BOOT + 600
    return out


def test_history_plans_see_the_teams_past_runs_through_estimate_duration() -> None:
    durations = [1000.0, 2000.0, 3000.0, 5000.0, 7000.0, 400.0]
    w = workload(sequential(durations))
    result = run(w, FIFO_SPOT, advisor_market())
    held = [d + BOOT for d in durations]  # what the team's history records: the placement
    assert result.expected_seconds[:3] == [3600, 3600, 3600]  # too little history: default
    blind = w.specs[0].model_copy(update={"expected_duration_seconds": None})
    for k in range(3, len(durations)):
        past = [PastRun(blind.image, blind.resources, h) for h in held[:k]]
        assert result.expected_seconds[k] == estimate_duration(blind, past).seconds
        assert result.expected_seconds[k] == round(statistics.median(held[:k]))
    assert result.expected_sources == {"default": 3, "history": 3}
    oracle = run(w, FIFO_SPOT, advisor_market(), durations="oracle")
    assert oracle.expected_seconds == [int(d) for d in durations]  # the trace's, told
    assert oracle.expected_sources == {"spec": len(durations)}


def test_history_is_per_team_and_per_shape_and_recent() -> None:
    lab = sequential([1000.0] * 4)
    other_team = sequential([9000.0] * 4, team="vision", first=10)
    wide = sequential([9000.0] * 4, gpus=4, first=20)
    w = workload(lab + other_team + wide)
    result = run(w, FIFO_SPOT, advisor_market())
    by_id = dict(zip((j.job_id for j in w.jobs), result.expected_seconds, strict=True))
    assert by_id["j003"] == 1000 + BOOT  # the lab's three one-GPU runs only
    assert by_id["j013"] == 9000 + BOOT
    assert by_id["j023"] == 9000 + BOOT


def test_history_keeps_only_the_most_recent_submissions(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(engine_module, "HISTORY_DEPTH", 4)
    w = workload(sequential([100.0, 100.0, 100.0, 5000.0, 5000.0, 5000.0, 60.0]))
    result = run(w, FIFO_SPOT, advisor_market())
    # When job 6 is planned, its team's 4 most recent submissions are jobs 3-6 (it counts
    # itself, as recent_for_team does): the three 5,000 s runs; job 2's 100 s has dropped out.
    assert result.expected_seconds[6] == 5000 + BOOT


# --- The measured market in the loop ------------------------------------------------------------

# Every two hours half of the held instances are lost.
HALF_EVERY_2H = PreemptionProcess(
    "test/half-2h", 20 * HOUR, tuple(2 * h * HOUR for h in range(10)), (0.5,) * 10
)
ALWAYS = AvailabilityTrace("test/always", "one-gpu", HOUR, 16, (16,))
FOUR_WIDE = AvailabilityTrace("test/four", "multi-gpu", HOUR, 16, (16,))


def measured_market(
    process: PreemptionProcess = HALF_EVERY_2H,
    one_gpu: AvailabilityTrace = ALWAYS,
    multi_gpu: AvailabilityTrace = FOUR_WIDE,
    *,
    capacity: str = "finite",
    pool_instances: int = 16,
    seed: int = 0,
    pinned: bool = False,
) -> MarketModel:
    """The measured market on the made-up region; `pinned`: every pool starts its process and
    its availability trace at their beginning at time 0 (instead of at a seeded offset)."""
    config = MarketConfig.model_validate(
        {
            "interruptions": "measured",
            "spot_capacity": capacity,
            "spot_pool_instances": pool_instances,
        }
    )
    measured = MeasuredSpot(Path("."), (process,), (one_gpu, multi_gpu))
    market = MarketModel(catalog(), REGION, config, seed=seed, measured=measured)
    if pinned:
        for offering in market.offerings:
            for pool in market.pools(offering):
                pool.process_offset = pool.availability_offset = 0.0
    return market


def busy_jobs() -> list[TraceJob]:
    return [job(i, 300.0 * i, 3 * HOUR, 1 + 3 * (i % 5 == 0)) for i in range(30)]


def test_the_measured_market_bites_and_is_seeded() -> None:
    w = workload(busy_jobs())
    results = [run(w, name, measured_market(seed=1), seed=1) for name in POLICY_NAMES]
    bound = cost_lower_bound_usd(w, catalog(), REGION)
    for r in results:
        assert r.completed + r.failed == r.jobs, r.policy
        assert r.cost_usd >= bound, r.policy
    by_name = {r.policy: r for r in results}
    # Three-hour jobs in pools losing half their instances every two hours: about one
    # interruption per job (the Spot Advisor's '>20%' would give ~0.0015).
    assert by_name[GPUFLEET].interruptions / len(w) > 0.5
    assert len(w) * 3 * hourly_hazard(4) < 0.05
    again = run(w, GPUFLEET, measured_market(seed=1), seed=1)
    other = run(w, GPUFLEET, measured_market(seed=2), seed=2)
    first = policy_metrics(by_name[GPUFLEET], bound)
    assert policy_metrics(again, bound) == first
    assert policy_metrics(other, bound) != first


CALM = PreemptionProcess("test/calm", 1000 * HOUR, (999 * HOUR,), (0.01,))


def test_finite_capacity_sends_spot_auto_to_on_demand() -> None:
    w = workload([job(i, 10.0 * i, HOUR) for i in range(10)])
    small = run(w, GPUFLEET, measured_market(CALM, pool_instances=3))
    # Three spot pools of 3 instances (one-GPU in zones a and b, four-GPU in a) take 9 of
    # the 10 one-GPU jobs; the tenth finds them full and falls back to on-demand.
    assert small.launch_failures == 1
    assert small.ondemand_fallbacks == 1
    roomy = run(w, GPUFLEET, measured_market(CALM, pool_instances=16))
    assert roomy.launch_failures == 0
    assert roomy.ondemand_fallbacks == 0
    assert roomy.cost_usd < small.cost_usd


class RecordingMarket(MarketModel):
    """The measured market, noting every successful launch (time, pool key)."""

    def __init__(self, base: MarketModel) -> None:
        self.__dict__.update(base.__dict__)
        self.launched: list[tuple[float, str]] = []

    def launch(
        self, offering: Offering, instances: int, at: float, rng: random.Random
    ) -> Lease | None:
        lease = super().launch(offering, instances, at, rng)
        if lease is not None:
            self.launched.append((at, offering.key))
        return lease


def relaunch_pools(market: RecordingMarket) -> list[tuple[str, str]]:
    """(pool before, pool after) for every relaunch of the single job."""
    keys = [key for _, key in market.launched]
    return list(itertools.pairwise(keys))


def test_skypilot_like_fails_over_to_the_next_zone_after_a_preemption() -> None:
    w = workload([job(0, 0.0, 10 * HOUR)])
    every_hour = PreemptionProcess(  # every instance lost on the hour
        "test/hourly", 10 * HOUR, tuple(h * HOUR for h in range(10)), (1.0,) * 10
    )
    sky = RecordingMarket(measured_market(every_hour))
    result = run(w, SKYPILOT_LIKE, sky)
    assert result.completed == 1
    assert result.interruptions >= 3
    moves = relaunch_pools(sky)
    assert moves and all(before != after for before, after in moves)  # never the same pool
    assert {key for _, key in sky.launched} <= {"spot:g9.xlarge:test-1a", "spot:g9.xlarge:test-1b"}
    fleet = RecordingMarket(measured_market(every_hour))
    interrupted = run(w, GPUFLEET, fleet)
    on_spot = [(before, after) for before, after in relaunch_pools(fleet) if after[:5] == "spot:"]
    assert on_spot and all(before == after for before, after in on_spot)  # back to the cheapest
    # Past the old count (10) it stays on spot: checkpointing every 30 minutes (the mapping's
    # default), spot at $0.30 stays cheaper in expectation than on-demand at $1.00 even at the
    # hazard its interruptions suggest, and its plans judge by that, not by a count.
    assert interrupted.completed == 1 and interrupted.interruptions > 10
    assert all(key.startswith("spot:") for _, key in fleet.launched)
    # Without checkpoints every interruption loses the run, and at the one-hour estimate (no
    # history yet) its plans still judge spot cheaper: the count moves it to on-demand.
    blind = RecordingMarket(measured_market(every_hour))
    unsaved_mapping = TraceMapping(region=REGION, high_share=0.0, checkpoint_interval_seconds=None)
    unsaved = run(workload([job(0, 0.0, 10 * HOUR)], unsaved_mapping), GPUFLEET, blind)
    assert unsaved.completed == 1 and blind.launched[-1][1].startswith("on-demand:")
    assert unsaved.interruptions == DEFAULT_MAX_INTERRUPTIONS + 1


# No spot capacity at all for the first three hours, then plenty.
LATE = AvailabilityTrace("test/late", "one-gpu", HOUR, 16, (0, 0, 0) + (16,) * 97)
LATE_WIDE = AvailabilityTrace("test/late-wide", "multi-gpu", HOUR, 16, (0, 0, 0) + (16,) * 97)


def test_skypilot_like_waits_for_spot_where_spot_auto_falls_back() -> None:
    w = workload([job(0, 0.0, HOUR)])
    sky = run(w, SKYPILOT_LIKE, measured_market(CALM, LATE, LATE_WIDE, pinned=True))
    fleet = run(w, GPUFLEET, measured_market(CALM, LATE, LATE_WIDE, pinned=True))
    assert fleet.ondemand_fallbacks == 1
    assert fleet.waits[0] == pytest.approx(BOOT)  # on-demand at once
    assert sky.ondemand_fallbacks == 0
    assert sky.completed == 1
    assert sky.launch_failures > 1
    assert (sky.waits[0] or 0) >= 3 * HOUR + BOOT  # it waited for spot to come back
    assert sky.cost_usd < fleet.cost_usd


def test_a_launch_that_keeps_failing_backs_off() -> None:
    w = workload([job(0, 0.0, HOUR)])
    result = run(w, SKYPILOT_LIKE, measured_market(CALM, LATE, LATE_WIDE, pinned=True))
    # Waits of 60, 120, 240, 480, 900, 900 ... s (LaunchPlan.after_failure), not 60 s each:
    # three hours without capacity take 15 failed attempts (at 0, 60, 180, 420, 900, 1800,
    # ... 9900 s; the one at 10,800 s finds capacity), not 180.
    assert result.launch_failures == 15
    assert result.waits[0] == 3 * HOUR + BOOT


# --- The lower bound ----------------------------------------------------------------------------


def test_the_lower_bound_is_each_jobs_cheapest_instance_for_its_true_duration() -> None:
    jobs = [job(0, 0.0, 2 * HOUR, gpus=1), job(1, 0.0, HOUR, gpus=4), job(2, 0.0, HOUR, gpus=8)]
    w = workload(jobs, TraceMapping(region=REGION, high_share=0.0, max_gpus_per_node=4))
    bound = cost_lower_bound_usd(w, catalog(), REGION)
    # One GPU: the whole cheapest instance that holds it ($0.30 spot), not a share of the
    # four-GPU one ($0.20 per GPU); four GPUs: $0.80; eight: two EFA nodes of four, $1.60.
    assert bound == pytest.approx(0.30 * 2 + 0.80 * 1 + 2 * 0.80 * 1)
    # Computed from the catalog alone: no market, no policy, no boot, no interruptions.
    for name in POLICY_NAMES:
        result = run(w, name, measured_market(), cap_gpus=16)
        assert result.cost_usd >= bound, name
