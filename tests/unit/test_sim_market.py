"""The simulated spot market: interruptions, shortages, outages, and the Bamboo check."""

from __future__ import annotations

import itertools
import random
from pathlib import Path

import pytest

from gpufleet.domain.catalog import Catalog, InstanceType, Offering, load_bundled
from gpufleet.domain.selection import hourly_hazard
from gpufleet.sim.market import (
    Lease,
    MarketConfig,
    MarketModel,
    bamboo_check,
    checkpointed_progress,
)

DATA = Path(__file__).resolve().parents[2].parent / "shared" / "data"

_GPU = InstanceType(
    name="g9.xlarge",
    accelerator="nvidia",
    gpu_model="T4",
    gpus=1,
    gpu_memory_gib=16,
    vcpus=4,
    memory_gib=16,
    arch="x86_64",
    efa=False,
)


def _catalog() -> Catalog:
    """One type, on-demand in one zone and spot in five zones, one per Spot Advisor bucket."""
    offerings = [Offering(_GPU, "test-1", "test-1a", "on-demand", 1.0, None)]
    offerings += [
        Offering(_GPU, "test-1", f"test-1{chr(ord('a') + b)}", "spot", 0.3, b) for b in range(5)
    ]
    return Catalog([_GPU], offerings)


def _market(config: MarketConfig | None = None, seed: int = 0) -> MarketModel:
    return MarketModel(_catalog(), "test-1", config, seed=seed)


def _spot(market: MarketModel, bucket: int) -> Offering:
    return market.offering(f"spot:g9.xlarge:test-1{chr(ord('a') + bucket)}")


def _lease(offering: Offering, instances: int = 1) -> Lease:
    """Room on the advisor, unlimited market (no pool to track)."""
    return Lease(offering, instances, None)


def test_builds_from_the_bundled_catalog() -> None:
    market = MarketModel(region="us-east-1")
    assert market.catalog is load_bundled()
    assert {o.capacity_type for o in market.offerings} == {"spot", "on-demand"}
    assert market.boot_seconds == 180
    with pytest.raises(ValueError, match="no offerings"):
        MarketModel(region="mars-north-1")


def test_interruptions_are_seeded_and_deterministic() -> None:
    market = _market(MarketConfig(hazard_scale=100))
    spot = _spot(market, 4)

    def draws(seed: int) -> list[float | None]:
        rng = random.Random(seed)
        return [market.next_interruption(_lease(spot), 1000.0, rng) for _ in range(50)]

    assert draws(7) == draws(7)
    assert draws(7) != draws(8)
    assert all(t is not None and t > 1000.0 for t in draws(7))


def test_on_demand_is_never_interrupted() -> None:
    market = _market()
    od = market.offering("on-demand:g9.xlarge:test-1a")
    assert market.hazard_per_hour(od) == 0
    assert market.next_interruption(_lease(od), 0.0, random.Random(1)) is None
    zero = _market(MarketConfig(hazard_scale=0))
    assert zero.next_interruption(_lease(_spot(zero, 4)), 0.0, random.Random(1)) is None


def test_hazard_follows_the_spot_advisor_bucket() -> None:
    market = _market()
    hazards = [market.hazard_per_hour(_spot(market, b)) for b in range(5)]
    assert hazards == sorted(hazards)
    assert len(set(hazards)) == 5
    assert hazards == [hourly_hazard(b) for b in range(5)]  # the selection's own numbers
    # Empirical mean time to interruption ~ 1 / hazard (scaled up so draws stay small).
    scaled = _market(MarketConfig(hazard_scale=1000))
    rng = random.Random(3)
    means = []
    for b in (0, 4):
        spot = _spot(scaled, b)
        gaps = [
            (scaled.next_interruption(_lease(spot), 0.0, rng) or 0.0) / 3600 for _ in range(4000)
        ]
        mean = sum(gaps) / len(gaps)
        assert mean == pytest.approx(1 / scaled.hazard_per_hour(spot), rel=0.06)
        means.append(mean)
    assert means[0] > means[1]


def test_a_gang_is_interrupted_n_times_as_often() -> None:
    market = _market(MarketConfig(hazard_scale=1000))
    spot = _spot(market, 2)
    rng = random.Random(11)
    one = [market.next_interruption(_lease(spot), 0.0, rng) or 0.0 for _ in range(4000)]
    eight = [market.next_interruption(_lease(spot, 8), 0.0, rng) or 0.0 for _ in range(4000)]
    assert sum(one) / sum(eight) == pytest.approx(8, rel=0.08)
    with pytest.raises(ValueError, match="instances"):
        market.launch(spot, 0, 0.0, rng)


def test_an_interruption_after_until_is_none() -> None:
    market = _market(MarketConfig(hazard_scale=1000))
    spot = _spot(market, 4)
    draws = [market.next_interruption(_lease(spot), 0.0, random.Random(i)) for i in range(200)]
    horizon = sorted(d or 0.0 for d in draws)[100]  # the median draw
    capped = [
        market.next_interruption(_lease(spot), 0.0, random.Random(i), until=horizon)
        for i in range(200)
    ]
    assert capped == [d if d is not None and d < horizon else None for d in draws]


def test_launch_failure_probability_is_honoured() -> None:
    market = _market(MarketConfig(spot_launch_failure=0.3))
    spot, od = _spot(market, 1), market.offering("on-demand:g9.xlarge:test-1a")
    rng = random.Random(5)
    n = 20000
    fails = sum(market.launch_fails(spot, float(i), rng) for i in range(n))
    assert fails / n == pytest.approx(0.3, abs=0.015)
    assert not any(market.launch_fails(od, float(i), rng) for i in range(1000))


def test_pool_overrides_win_over_the_defaults() -> None:
    config = MarketConfig(
        spot_launch_failure=0.0,
        on_demand_launch_failure=0.5,
        pool_launch_failure={"spot:g9.xlarge:test-1c": 1.0, "spot:g9.xlarge": 0.2},
    )
    market = _market(config)
    assert market.launch_failure_probability(_spot(market, 2)) == 1.0  # exact pool
    assert market.launch_failure_probability(_spot(market, 0)) == 0.2  # every zone of the type
    od = market.offering("on-demand:g9.xlarge:test-1a")
    assert market.launch_failure_probability(od) == 0.5
    rng = random.Random(2)
    assert all(market.launch_fails(_spot(market, 2), 0.0, rng) for _ in range(100))
    assert 0 < sum(market.launch_fails(od, 0.0, rng) for _ in range(1000)) < 1000


def test_outages_are_time_correlated_and_order_independent() -> None:
    config = MarketConfig(spot_launch_failure=0, spot_outages_per_pool_day=2, outage_mean_hours=3)
    times = [h * 3600.0 for h in range(24 * 300)]
    forward = _market(config, seed=9)
    spot = _spot(forward, 3)
    down = [forward.in_outage(spot, t) for t in times]
    backward = _market(config, seed=9)
    assert [backward.in_outage(spot, t) for t in reversed(times)] == down[::-1]
    # Alternating renewal: down share = (2/day x 3 h) / (24 h + 2/day x 3 h) = 0.2.
    assert sum(down) / len(down) == pytest.approx(0.2, abs=0.05)
    # Correlated: an hour in an outage is mostly followed by another.
    after = [b for a, b in itertools.pairwise(down) if a]
    assert sum(after) / len(after) > 0.5
    rng = random.Random(0)
    assert all(forward.launch_fails(spot, t, rng) for t, d in zip(times, down, strict=True) if d)
    assert not any(
        forward.in_outage(forward.offering("on-demand:g9.xlarge:test-1a"), t) for t in times
    )
    other_seed = _market(config, seed=10)
    assert [other_seed.in_outage(spot, t) for t in times] != down


def test_checkpointed_progress() -> None:
    assert checkpointed_progress(5400, 1800) == 5400
    assert checkpointed_progress(5399, 1800) == 3600
    assert checkpointed_progress(1000, 1800) == 0
    assert checkpointed_progress(5000, None) == 0
    with pytest.raises(ValueError, match="positive"):
        checkpointed_progress(10, 0)


def test_costs_and_times() -> None:
    market = _market(MarketConfig(boot_seconds=90, restore_seconds=30))
    od = market.offering("on-demand:g9.xlarge:test-1a")
    assert market.cost_usd(od, 1800, instances=2) == pytest.approx(1.0)
    assert market.hourly_usd(_spot(market, 0)) == 0.3
    assert (market.boot_seconds, market.restore_seconds) == (90, 30)
    with pytest.raises(KeyError, match="no offering"):
        market.offering("spot:nope:test-1a")


@pytest.mark.skipif(
    not (DATA / "traces" / "aws-spot-preemption-bamboo").is_dir(),
    reason=f"the Bamboo traces are not checked out under {DATA}",
)
def test_bamboo_check_reports_positive_rates() -> None:
    checks = bamboo_check(DATA)
    by_trace = {c.trace: c for c in checks}
    assert {"ec2-2021-12/p3-trace.csv", "ec2-2021-12/g4dn-trace.csv"} <= set(by_trace)
    for c in checks:
        assert c.instance_hours > 0
        assert c.preemptions > 0
        assert c.observed_per_instance_hour > 0
        assert c.snapshot_per_instance_hour is not None and c.snapshot_per_instance_hour > 0
    p3 = by_trace["ec2-2021-12/p3-trace.csv"]
    assert p3.preemptions == 167  # SOURCE.md: 167 removes
    assert p3.instance_hours == pytest.approx(24.0 * 11.4, rel=0.02)  # time-avg 24 nodes, 11.4 h
    assert "p3.2xlarge" in p3.instance_types
    for c in (p3, by_trace["ec2-2021-12/g4dn-trace.csv"]):
        assert c.catalog_per_instance_hour is not None and c.catalog_per_instance_hour > 0
        assert c.ratio_to_catalog is not None and c.ratio_to_catalog > 0
