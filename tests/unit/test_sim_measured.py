"""The measured spot market: replayed preemption processes and finite, time-varying capacity.

Synthetic processes and traces (always run, deterministic with a seed); the real Bamboo and
SkyPilot files only where ../shared/data is checked out.
"""

from __future__ import annotations

import random
from pathlib import Path

import pytest

from gpufleet.domain.catalog import Catalog, InstanceType, Offering
from gpufleet.domain.selection import hourly_hazard
from gpufleet.sim.market import Lease, MarketConfig, MarketModel
from gpufleet.sim.measured import (
    AvailabilityTrace,
    HeldSeries,
    MeasuredDataMissing,
    MeasuredSpot,
    PreemptionProcess,
    load_availability,
    load_measured,
    load_preemption,
)

DATA = Path(__file__).resolve().parents[2].parent / "shared" / "data"
HOUR = 3600.0


def nvidia_type(name: str, gpus: int, *, efa: bool = False) -> InstanceType:
    """A made-up NVIDIA type with `gpus` 16 GiB GPUs (also used by tests/simulation)."""
    return InstanceType(
        name=name,
        accelerator="nvidia",
        gpu_model="T4",
        gpus=gpus,
        gpu_memory_gib=16,
        vcpus=8 * gpus,
        memory_gib=32 * gpus,
        arch="x86_64",
        efa=efa,
    )


ONE, EIGHT = nvidia_type("g9.xlarge", 1), nvidia_type("g9.16xlarge", 8)


def _catalog() -> Catalog:
    """g9.xlarge spot in zones a (bucket 4) and b (bucket 0) and per region (bucket 4, no
    zone); g9.16xlarge spot in zone a; on-demand of both in zone a."""
    offerings = [
        Offering(ONE, "test-1", "test-1a", "on-demand", 1.0, None),
        Offering(EIGHT, "test-1", "test-1a", "on-demand", 8.0, None),
        Offering(ONE, "test-1", "test-1a", "spot", 0.3, 4),
        Offering(ONE, "test-1", "test-1b", "spot", 0.3, 0),
        Offering(ONE, "test-1", None, "spot", 0.35, 4),
        Offering(EIGHT, "test-1", "test-1a", "spot", 2.4, 4),
    ]
    return Catalog([ONE, EIGHT], offerings)


# Every hour, half of the held instances are lost: 0.5 preemptions per instance-hour.
HOURLY_HALF = PreemptionProcess(
    source="test/hourly-half",
    period_seconds=10 * HOUR,
    instants=tuple(h * HOUR for h in range(10)),
    fractions=(0.5,) * 10,
)
# Every instance is lost at once, every three hours.
ALL_AT_ONCE = PreemptionProcess(
    source="test/all",
    period_seconds=9 * HOUR,
    instants=(0.0, 3 * HOUR, 6 * HOUR),
    fractions=(1.0,) * 3,
)
# One-GPU pools: all of the request available for an hour, then none for an hour.
ON_OFF = AvailabilityTrace("test/on-off", "one-gpu", HOUR, 1, (1, 0))
# Multi-GPU pools: a quarter of a 16-instance request, always.
QUARTER = AvailabilityTrace("test/quarter", "multi-gpu", HOUR, 16, (4,))


def _market(
    process: PreemptionProcess = HOURLY_HALF,
    *,
    seed: int = 0,
    interruptions: str = "measured",
    capacity: str = "unlimited",
    pool_instances: int = 16,
) -> MarketModel:
    config = MarketConfig.model_validate(
        {
            "interruptions": interruptions,
            "spot_capacity": capacity,
            "spot_pool_instances": pool_instances,
            "spot_launch_failure": 0.0,
        }
    )
    measured = MeasuredSpot(Path("."), preemption=(process,), availability=(ON_OFF, QUARTER))
    return MarketModel(_catalog(), "test-1", config, seed=seed, measured=measured)


def _launch(market: MarketModel, key: str, at: float, instances: int = 1) -> Lease:
    lease = market.launch(market.offering(key), instances, at, random.Random(0))
    assert lease is not None
    return lease


def _interruptions(market: MarketModel, key: str, n: int, seed: int) -> list[float]:
    """When n single instances launched at random times are first interrupted, minus start."""
    rng = random.Random(seed)
    gaps = []
    for _ in range(n):
        start = rng.uniform(0, 1000 * HOUR)
        lease = _launch(market, key, start)
        at = market.next_interruption(lease, start, rng)
        assert at is not None and at > start
        gaps.append(at - start)
        market.release(lease)
    return gaps


# --- Traces -> processes ----------------------------------------------------------------------


def test_a_process_keeps_exposure_time_and_loss_shares() -> None:
    # Held: none for 10 s, 4 for 10 s, 2 for 10 s, none for 10 s, 3 for 10 s.
    series = HeldSeries((0, 10, 20, 30, 40, 50), (0, 4, 2, 0, 3, 3))
    process = PreemptionProcess.from_series("hand", series)
    assert process.period_seconds == 30  # only while something was held
    assert process.instants == (10.0, 20.0)
    assert process.fractions == (0.5, 1.0)
    assert process.per_instance_hour == pytest.approx(1.5 * 3600 / 30)
    # Several removals at one instant are one burst: 4 -> 3 -> 1 is 3/4 lost at once.
    burst = PreemptionProcess.from_series("burst", HeldSeries((0, 5, 5, 9), (4, 3, 1, 1)))
    assert burst.instants == (5.0,)
    assert burst.fractions == pytest.approx((0.75,))
    with pytest.raises(ValueError, match="no preemption"):
        PreemptionProcess.from_series("calm", HeldSeries((0, 10), (2, 2)))


# --- Measured interruptions -------------------------------------------------------------------


def test_measured_interruptions_replay_the_process_not_the_advisor_hazard() -> None:
    market = _market()
    gaps = _interruptions(market, "spot:g9.xlarge:test-1a", 3000, seed=1)
    # Half of the instances go at each hourly instant: the wait is 1 h x Geometric(0.5) minus
    # the offset into the hour, so its mean is 2 h - 0.5 h.
    mean_hours = sum(gaps) / len(gaps) / HOUR
    assert mean_hours == pytest.approx(1.5, rel=0.06)
    # The Spot Advisor's '>20%' hazard would have meant ~2,000 h.
    assert mean_hours * hourly_hazard(4) < 0.01
    advisor = _market(interruptions="advisor")
    assert sum(_interruptions(advisor, "spot:g9.xlarge:test-1a", 50, seed=1)) / 50 > 100 * HOUR


def test_interruptions_fall_on_the_process_instants_of_the_pool() -> None:
    market = _market()
    key = "spot:g9.xlarge:test-1a"
    rng = random.Random(2)
    times = []
    for _ in range(200):
        start = rng.uniform(0, 50 * HOUR)
        at = market.next_interruption(_launch(market, key, start), start, rng)
        assert at is not None
        times.append(at)
    (pool,) = market.pools(market.offering(key))
    phases = {round((t + pool.process_offset) % HOUR, 6) % HOUR for t in times}
    assert len(phases) == 1  # every loss at the same phase of the hour: the pool's instants


def test_measured_draws_are_seeded_and_pools_differ() -> None:
    key = "spot:g9.xlarge:test-1a"
    first = _interruptions(_market(seed=5), key, 100, seed=3)
    assert first == _interruptions(_market(seed=5), key, 100, seed=3)
    assert first != _interruptions(_market(seed=6), key, 100, seed=3)  # other pool offsets


def test_a_pool_loses_its_instances_together() -> None:
    market = _market(ALL_AT_ONCE)
    rng = random.Random(0)
    a1 = _launch(market, "spot:g9.xlarge:test-1a", 100.0)
    a2 = _launch(market, "spot:g9.xlarge:test-1a", 200.0)
    big = _launch(market, "spot:g9.16xlarge:test-1a", 300.0)
    t1 = market.next_interruption(a1, 100.0, rng)
    t2 = market.next_interruption(a2, 200.0, rng)
    assert t1 == t2  # one burst takes both
    t3 = market.next_interruption(big, 300.0, rng)
    assert t3 is not None and t3 != t1  # another pool, another offset


def test_a_gang_is_lost_when_any_of_its_instances_is() -> None:
    tenth = PreemptionProcess("tenth", 10 * HOUR, tuple(h * HOUR for h in range(10)), (0.1,) * 10)
    market = _market(tenth)
    key = "spot:g9.16xlarge:test-1a"
    rng = random.Random(4)
    hits = 0
    n = 3000
    for _ in range(n):
        start = rng.uniform(0, 100 * HOUR)
        lease = _launch(market, key, start, instances=8)
        at = market.next_interruption(lease, start, rng, until=start + HOUR)
        hits += at is not None
        market.release(lease)
    assert hits / n == pytest.approx(1 - 0.9**8, abs=0.03)  # one instant per hour


def test_lower_buckets_replay_the_process_thinned_by_the_hazard_ratio() -> None:
    market = _market()
    n = 400
    top = _interruptions(market, "spot:g9.xlarge:test-1a", n, seed=7)  # '>20%'
    low = _interruptions(market, "spot:g9.xlarge:test-1b", n, seed=7)  # '<5%'
    (pool,) = market.pools(market.offering("spot:g9.xlarge:test-1b"))
    assert pool.thinning == pytest.approx(hourly_hazard(0) / hourly_hazard(4))
    # Geometric over hourly instants: mean ~ 1 / (0.5 x thinning) hours.
    assert sum(low) / n / HOUR == pytest.approx(1 / (0.5 * pool.thinning), rel=0.15)
    assert sum(low) > 5 * sum(top)


def test_on_demand_is_never_interrupted_on_the_measured_market() -> None:
    market = _market(ALL_AT_ONCE)
    od = _launch(market, "on-demand:g9.xlarge:test-1a", 0.0)
    assert od.pool is None
    assert market.next_interruption(od, 0.0, random.Random(0)) is None


# --- Finite capacity --------------------------------------------------------------------------


def test_a_pool_fills_up_and_recovers() -> None:
    market = _market(capacity="finite", pool_instances=4)
    offering = market.offering("spot:g9.xlarge:test-1a")
    (pool,) = market.pools(offering)
    up = next(h * HOUR + 1 for h in range(4) if market.capacity(pool, h * HOUR + 1) == 4)
    rng = random.Random(0)
    held = [market.launch(offering, 1, up, rng) for _ in range(4)]
    assert all(lease is not None for lease in held)
    assert market.launch(offering, 1, up, rng) is None  # full
    first = held[0]
    assert first is not None
    market.release(first)
    assert market.launch(offering, 1, up, rng) is not None  # room again
    # An hour later the measured pool has no capacity at all, then it comes back.
    assert market.capacity(pool, up + HOUR) == 0
    for lease in held[1:]:
        assert lease is not None
        market.release(lease)
    assert market.launch(offering, 1, up + HOUR, rng) is None
    assert market.launch(offering, 1, up + 2 * HOUR, rng) is not None


def test_finite_capacity_follows_the_trace_and_is_seeded() -> None:
    def outcomes(seed: int, capacity: str = "finite") -> list[bool]:
        market = _market(seed=seed, capacity=capacity, pool_instances=2)
        offering = market.offering("spot:g9.xlarge:test-1a")
        rng = random.Random(1)
        return [market.launch(offering, 1, t * 600.0, rng) is not None for t in range(200)]

    finite = outcomes(3)
    assert finite == outcomes(3)
    # Instances are never released here: the pool takes 2 per available hour, then refuses.
    assert 0 < sum(finite) < 200
    assert finite != outcomes(4)
    assert all(outcomes(3, capacity="unlimited"))


def test_a_gang_needs_room_for_all_its_instances() -> None:
    market = _market(capacity="finite")
    offering = market.offering("spot:g9.16xlarge:test-1a")  # multi-GPU: 16 x a quarter = 4
    (pool,) = market.pools(offering)
    assert pool.availability is QUARTER
    assert market.capacity(pool, 0.0) == 4
    rng = random.Random(0)
    assert market.launch(offering, 5, 0.0, rng) is None
    assert market.launch(offering, 4, 0.0, rng) is not None


def test_a_region_level_offering_spans_the_zones() -> None:
    market = _market(capacity="finite", pool_instances=1)
    regional = market.offering("spot:g9.xlarge:test-1")
    pools = market.pools(regional)
    assert len(pools) == market.zones == 2  # the catalog knows zones a and b here
    t = next(m * 60.0 for m in range(240) if all(market.capacity(p, m * 60.0) for p in pools))
    rng = random.Random(0)
    leases = [market.launch(regional, 1, t, rng) for _ in range(3)]
    assert leases[0] is not None and leases[1] is not None and leases[2] is None
    assert {lease.pool.key for lease in leases[:2] if lease and lease.pool} == {
        p.key for p in pools
    }


def test_release_twice_is_a_bug() -> None:
    market = _market(capacity="finite")
    lease = _launch(market, "spot:g9.16xlarge:test-1a", 0.0)
    market.release(lease)
    with pytest.raises(ValueError, match="twice"):
        market.release(lease)


def test_measured_settings_need_the_traces() -> None:
    config = MarketConfig(interruptions="measured")
    with pytest.raises(ValueError, match="preemption traces"):
        MarketModel(_catalog(), "test-1", config)
    with pytest.raises(ValueError, match="availability traces"):
        MarketModel(_catalog(), "test-1", MarketConfig(spot_capacity="finite"))


def test_absent_data_says_what_is_needed_and_where(tmp_path: Path) -> None:
    with pytest.raises(MeasuredDataMissing, match="--interruptions measured") as info:
        load_preemption(tmp_path)
    assert str(tmp_path / "traces" / "aws-spot-preemption-bamboo") in str(info.value)
    assert "--interruptions advisor --spot-capacity unlimited" in str(info.value)
    with pytest.raises(MeasuredDataMissing, match="--spot-capacity finite"):
        load_availability(tmp_path)
    assert load_measured(tmp_path, preemption=False, availability=False).preemption == ()


# --- The real traces ----------------------------------------------------------------------------

needs_data = pytest.mark.skipif(
    not (DATA / "traces" / "skypilot-spot-traces-nsdi24").is_dir(),
    reason=f"the measured spot traces are not checked out under {DATA}",
)


@needs_data
def test_the_measured_traces_load() -> None:
    measured = load_measured(DATA, preemption=True, availability=True)
    by_source = {p.source: p for p in measured.preemption}
    assert len(measured.preemption) == 15  # Bamboo 5, SkyPilot EC2 10 (GCP left out)
    assert not any("gcp" in source for source in by_source)
    p3 = by_source["traces/aws-spot-preemption-bamboo/ec2-2021-12/p3-trace.csv"]
    assert p3.per_instance_hour == pytest.approx(0.61, abs=0.02)  # sim/README's table
    assert len(p3.instants) == 79
    rates = sorted(p.per_instance_hour for p in measured.preemption)
    assert rates[len(rates) // 2] > 100 * hourly_hazard(4)  # hundreds of times the Advisor's
    assert len(measured.availability) == 20
    assert len(measured.availability_of("multi-gpu")) == 4
    east_1a = next(a for a in measured.availability if a.source.endswith("us-east-1a_v100_1.json"))
    assert east_1a.mean_share == pytest.approx(0.17, abs=0.01)  # 83 % of the time unavailable
