"""Instance selection: feasibility, cost ranking, the rework model, diversification."""

from __future__ import annotations

import math
import random
from typing import Any

import pytest
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from gpufleet.domain.catalog import Catalog, InstanceType, Offering, load_bundled
from gpufleet.domain.selection import (
    HOURS_PER_MONTH,
    RESTART_OVERHEAD_HOURS,
    NoFeasibleOffering,
    Selection,
    diversify,
    expected_cost,
    hourly_hazard,
    is_feasible,
    observed_hazard,
    rework_fraction,
    select,
)
from gpufleet.domain.spec import Resources, SpotPolicy

CATALOG = load_bundled()
NO_MODELS: list[str] = []
MODELS = ["A100", "H100", "h200", "L4", "A10G", "T4", "V100", "L40S", "B200", "Trainium", "K80"]


def norm(name: str) -> str:
    return "".join(name.lower().replace("nvidia", "").split())


def naive_feasible(it: InstanceType, r: Resources, instance_store: bool = False) -> bool:
    """An independent, spelled-out statement of the feasibility rules."""
    if instance_store and not (it.instance_store_nvme and it.instance_store_disks >= 1):
        return False
    if r.gpus == 0:
        hardware = it.accelerator == "none"
    else:
        if it.accelerator == "none" or it.gpus < r.gpus or it.gpu_memory_gib < r.gpu_memory_gib:
            return False
        if r.gpu_models:
            hardware = norm(it.gpu_model or "") in {norm(m) for m in r.gpu_models}
        else:
            hardware = it.accelerator == "nvidia"
    return (
        hardware
        and it.vcpus >= r.vcpus
        and it.memory_gib >= r.memory_gib
        and it.arch == r.arch.value
        and (r.nodes == 1 or it.efa)
    )


def brute_force(
    r: Resources,
    policy: SpotPolicy,
    region: str,
    hours: float,
    checkpoint: float | None,
    unavailable: frozenset[str],
    instance_store: bool = False,
    catalog: Catalog = CATALOG,
) -> list[tuple[float, Offering]]:
    allowed = {"auto": {"spot", "on-demand"}, "required": {"spot"}, "never": {"on-demand"}}
    out = []
    for o in catalog.offerings(region):
        if o.capacity_type not in allowed[policy.value]:
            continue
        if o.key in unavailable or not naive_feasible(o.instance_type, r, instance_store):
            continue
        out.append((expected_cost(o, r.nodes, hours, checkpoint), o))
    return sorted(out, key=lambda x: x[0])


@st.composite
def requests(draw: st.DrawFn) -> dict[str, Any]:
    gpus = draw(st.sampled_from([0, 1, 1, 2, 4, 8, 8, 16]))
    nodes = 1 if gpus == 0 else draw(st.sampled_from([1, 1, 2, 4]))
    resources = Resources(
        gpus=gpus,
        gpu_memory_gib=draw(st.sampled_from([0, 0, 0, 16, 24, 24, 40, 48, 80, 141, 200])),
        gpu_models=draw(
            st.one_of(
                st.just(NO_MODELS), st.lists(st.sampled_from(MODELS), max_size=4, unique=True)
            )
        ),
        vcpus=draw(st.sampled_from([1, 1, 4, 16, 48, 200])),
        memory_gib=draw(st.sampled_from([1, 1, 8, 64, 256, 1024])),
        nodes=nodes,
        arch=draw(st.sampled_from(["x86_64", "x86_64", "x86_64", "arm64"])),
    )
    region = draw(st.sampled_from(["us-east-1", "us-east-1", "us-west-2", *CATALOG.regions()]))
    instance_store = draw(st.sampled_from([False, False, False, True]))
    offerings = CATALOG.offerings(region)
    keys = [o.key for o in offerings]
    # Mark some offerings of the feasible set unavailable, sometimes all of them.
    feasible = sorted(
        {o.key for o in offerings if naive_feasible(o.instance_type, resources, instance_store)}
    )
    hit_feasible: bool = draw(st.booleans())
    if feasible and hit_feasible:
        unavailable = frozenset(draw(st.lists(st.sampled_from(feasible), max_size=6)))
        if draw(st.integers(0, 9)) == 0:
            unavailable = frozenset(feasible)
    else:
        unavailable = frozenset(draw(st.lists(st.sampled_from(keys), max_size=3)))
    return {
        "resources": resources,
        "policy": draw(st.sampled_from(list(SpotPolicy))),
        "region": region,
        "hours": draw(st.sampled_from([0.25, 1.0, 8.0, 72.0, 500.0])),
        "checkpoint": draw(st.sampled_from([None, 0.5, 2.0])),
        "unavailable": unavailable,
        "instance_store": instance_store,
    }


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(requests())
def test_choice_is_feasible_available_and_cheapest(req: dict[str, Any]) -> None:
    r: Resources = req["resources"]
    store = req["instance_store"]
    expected = brute_force(
        r, req["policy"], req["region"], req["hours"], req["checkpoint"], req["unavailable"], store
    )

    def run() -> Selection:
        return select(
            r,
            req["policy"],
            CATALOG,
            req["region"],
            expected_hours=req["hours"],
            checkpoint_interval_hours=req["checkpoint"],
            unavailable=req["unavailable"],
            limit=5,
            needs_instance_store=store,
        )

    if not expected:
        with pytest.raises(NoFeasibleOffering) as info:
            run()
        assert info.value.region == req["region"]
        assert info.value.constraint
        event(f"infeasible: {info.value.constraint}")
        return
    sel = run()
    event(f"feasible, best {sel.best.offering.capacity_type}")
    assert 1 <= len(sel.ranked) <= 5
    assert sel.feasible_count == len(expected)
    best = sel.best
    assert naive_feasible(best.offering.instance_type, r, store)
    assert best.offering.key not in req["unavailable"]
    assert best.offering.region == req["region"]
    assert math.isclose(best.expected_cost_usd, expected[0][0], rel_tol=1e-12)
    costs = [x.expected_cost_usd for x in sel.ranked]
    assert costs == sorted(costs)
    for x, (cost, _) in zip(sel.ranked, expected, strict=False):
        assert math.isclose(x.expected_cost_usd, cost, rel_tol=1e-12)
        assert naive_feasible(x.offering.instance_type, r, store)
        assert x.offering.key not in req["unavailable"]
        assert x.nodes == r.nodes
        if req["policy"] is SpotPolicy.NEVER:
            assert x.offering.capacity_type == "on-demand"
        if req["policy"] is SpotPolicy.REQUIRED:
            assert x.offering.capacity_type == "spot"


# --- concrete cases ---------------------------------------------------------------------------


def test_eight_h100_is_p5() -> None:
    sel = select(
        Resources(gpus=8, gpu_memory_gib=80, gpu_models=["H100"]), "auto", CATALOG, "us-east-1"
    )
    assert all(x.offering.instance_type.name == "p5.48xlarge" for x in sel.ranked)
    assert sel.best.offering.capacity_type == "spot"


def test_eight_80gib_gpus_any_model_picks_a_big_nvidia_box() -> None:
    sel = select(Resources(gpus=8, gpu_memory_gib=80), "auto", CATALOG, "us-east-1")
    for x in sel.ranked:
        it = x.offering.instance_type
        assert it.accelerator == "nvidia"
        assert it.gpus == 8
        assert it.gpu_memory_gib >= 80
        assert it.family in {"p4de", "p5", "p5e", "p5en", "p6-b200", "p6-b300"}


def test_one_24gib_gpu_is_a_cheap_g_type() -> None:
    sel = select(Resources(gpus=1, gpu_memory_gib=24), "auto", CATALOG, "us-east-1")
    best = sel.best.offering
    assert best.instance_type.family in {"g5", "g6", "gr6", "g6e"}
    assert best.instance_type.gpus == 1
    assert best.hourly_usd < 1.0
    od = select(Resources(gpus=1, gpu_memory_gib=24), "never", CATALOG, "us-east-1").best
    assert od.offering.instance_type.name in {"g6.xlarge", "g5.xlarge"}
    assert od.offering.hourly_usd < 1.1


@pytest.mark.parametrize("models", [[], ["A100"], ["H100", "A10G"], ["nvidia l4"]])
@pytest.mark.parametrize("region", ["us-east-1", "us-west-2", "us-east-2"])
def test_trainium_and_other_non_nvidia_never_chosen_for_nvidia(
    models: list[str], region: str
) -> None:
    sel = select(Resources(gpus=1, gpu_models=models), "auto", CATALOG, region, limit=100)
    assert {x.offering.instance_type.accelerator for x in sel.ranked} == {"nvidia"}


def test_trainium_when_asked_for() -> None:
    sel = select(Resources(gpus=16, gpu_models=["trainium"]), "auto", CATALOG, "us-east-1")
    assert {x.offering.instance_type.family for x in sel.ranked} <= {"trn1", "trn1n"}


def test_fractional_gpus_never_chosen() -> None:
    sel = select(Resources(gpus=1), "auto", CATALOG, "us-east-1", limit=1000)
    assert not any(x.offering.instance_type.family in {"g6f", "gr6f"} for x in sel.ranked)


def test_cpu_job_gets_a_cpu_type() -> None:
    sel = select(Resources(gpus=0, vcpus=8, memory_gib=32), "auto", CATALOG, "us-west-2", limit=50)
    for x in sel.ranked:
        it = x.offering.instance_type
        assert it.accelerator == "none"
        assert it.gpus == 0
        assert it.vcpus >= 8
        assert it.memory_gib >= 32
    arm = select(Resources(gpus=0, arch="arm64"), "never", CATALOG, "us-east-1")
    assert arm.best.offering.instance_type.arch == "arm64"


def test_spot_never_is_on_demand_only_and_required_is_spot_only() -> None:
    r = Resources(gpus=4, gpu_memory_gib=24)
    never = select(r, SpotPolicy.NEVER, CATALOG, "us-east-1", limit=100)
    assert {x.offering.capacity_type for x in never.ranked} == {"on-demand"}
    required = select(r, "required", CATALOG, "us-east-1", limit=100)
    assert {x.offering.capacity_type for x in required.ranked} == {"spot"}


def test_multi_node_needs_efa_and_multiplies_cost() -> None:
    one = select(Resources(gpus=8, gpu_memory_gib=40), "never", CATALOG, "us-east-1").best
    four = select(Resources(gpus=8, gpu_memory_gib=40, nodes=4), "never", CATALOG, "us-east-1")
    assert all(x.offering.instance_type.efa for x in four.ranked)
    assert four.best.nodes == 4
    if four.best.offering.key == one.offering.key:
        assert math.isclose(four.best.expected_cost_usd, 4 * one.expected_cost_usd)


def test_an_instance_store_job_only_gets_types_with_nvme_instance_store_disks() -> None:
    # One V100: p3.2xlarge (EBS only) is the cheapest fit; with scratch only p3dn (2 NVMe disks).
    v100 = Resources(gpus=1, gpu_models=["V100"])
    plain = select(v100, "never", CATALOG, "us-east-1", limit=100)
    assert plain.best.instance_type.name == "p3.2xlarge"
    scratch = select(v100, "never", CATALOG, "us-east-1", limit=100, needs_instance_store=True)
    assert {x.instance_type.name for x in scratch} == {"p3dn.24xlarge"}
    p3dn = scratch.best.instance_type
    assert (p3dn.instance_store_disks, p3dn.instance_store_gb, p3dn.instance_store_nvme) == (
        2,
        1800,
        True,
    )
    assert is_feasible(p3dn, v100, needs_instance_store=True)
    assert not is_feasible(plain.best.instance_type, v100, needs_instance_store=True)
    assert is_feasible(plain.best.instance_type, v100)


@pytest.mark.parametrize(
    ("resources", "named"),
    [
        (Resources(gpus=0, vcpus=4), "c5."),  # the catalog's CPU families are all EBS-only
        (Resources(gpus=1, gpu_models=["K80"]), "p2."),
    ],
)
def test_no_type_with_instance_store_is_refused_naming_why(
    resources: Resources, named: str
) -> None:
    select(resources, "auto", CATALOG, "us-east-1")  # fits without the instance store
    with pytest.raises(NoFeasibleOffering) as info:
        select(resources, "auto", CATALOG, "us-east-1", needs_instance_store=True)
    assert info.value.constraint == "instance_store"
    assert "NVMe instance-store disks" in str(info.value)
    assert named in str(info.value)


def test_unavailable_offerings_are_skipped() -> None:
    r = Resources(gpus=8, gpu_memory_gib=80, gpu_models=["H100"])
    first = select(r, "auto", CATALOG, "us-east-1").best.offering
    second = select(r, "auto", CATALOG, "us-east-1", unavailable=frozenset({first.key})).best
    assert second.offering.key != first.key
    assert (
        second.expected_cost_usd >= select(r, "auto", CATALOG, "us-east-1").best.expected_cost_usd
    )


def test_expected_hours_and_limit() -> None:
    r = Resources(gpus=1)
    a = select(r, "never", CATALOG, "us-east-1", expected_hours=1.0, limit=3)
    b = select(r, "never", CATALOG, "us-east-1", expected_hours=10.0, limit=3)
    assert len(a.ranked) == 3
    assert math.isclose(b.best.expected_cost_usd, 10 * a.best.expected_cost_usd)


@pytest.mark.parametrize(
    "kwargs", [{"expected_hours": 0}, {"checkpoint_interval_hours": -1.0}, {"limit": 0}]
)
def test_bad_arguments(kwargs: dict[str, Any]) -> None:
    with pytest.raises(ValueError, match="must be"):
        select(Resources(), "auto", CATALOG, "us-east-1", **kwargs)


# --- why nothing fits -------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("resources", "region", "constraint", "words"),
    [
        (
            Resources(gpus=8, gpu_memory_gib=300),
            "us-east-1",
            "gpu_memory_gib",
            ["8 GPUs with >= 300 GiB", "us-east-1", "the largest is p6-b200.48xlarge"],
        ),
        (
            Resources(gpus=16, gpu_models=["H100"]),
            "us-east-1",
            "gpus",
            ["16 GPUs", "the most is p5"],
        ),
        (Resources(gpus=1, gpu_models=["MI300X"]), "us-east-1", "gpu_models", ["MI300X", "H100"]),
        (Resources(gpus=1, gpu_models=["H100"], arch="arm64"), "us-east-1", "arch", ["arm64"]),
        (Resources(gpus=1, vcpus=1024), "us-east-1", "vcpus", ["1024 vCPUs", "the most is"]),
        (Resources(gpus=1, gpu_models=["K80"], nodes=2), "us-east-1", "efa", ["EFA", "p2."]),
        (Resources(gpus=0), "eu-west-1", "gpus", ["CPU-only", "us-east-1, us-west-2"]),
        (Resources(gpus=1), "mars-north-1", "region", ["mars-north-1", "us-east-1"]),
    ],
)
def test_no_feasible_offering_names_the_constraint(
    resources: Resources, region: str, constraint: str, words: list[str]
) -> None:
    with pytest.raises(NoFeasibleOffering) as info:
        select(resources, "auto", CATALOG, region)
    assert info.value.constraint == constraint
    for word in words:
        assert word in str(info.value)


def tiny_catalog() -> Catalog:
    def it(name: str, gpus: int) -> dict[str, Any]:
        return {
            "name": name,
            "accelerator": "nvidia",
            "gpu_model": "L4",
            "gpus": gpus,
            "gpu_memory_gib": 24,
            "vcpus": 8,
            "memory_gib": 32,
            "arch": "x86_64",
            "efa": False,
        }

    def off(name: str, od: float | None, spot: float | None, zone: str) -> dict[str, Any]:
        return {
            "instance_type": name,
            "region": "r-1",
            "zone": zone,
            "on_demand_usd_per_hour": od,
            "spot_usd_per_hour": spot,
            "interruption_bucket": 4 if spot else None,
        }

    return Catalog.from_document(
        {
            "instance_types": [it("g.one", 1), it("g.two", 2), it("g.od", 4)],
            "offerings": [
                off("g.two", 1.0, None, "a"),
                off("g.one", 1.0, 0.5, "a"),
                off("g.one", 1.0, 0.5, "b"),
                off("g.od", 2.0, None, "a"),
            ],
        }
    )


def test_exact_gpu_count_wins_ties_and_on_demand_beats_equal_spot() -> None:
    sel = select(Resources(gpus=1), "never", tiny_catalog(), "r-1", limit=10)
    assert [x.offering.key for x in sel.ranked[:3]] == [
        "on-demand:g.one:a",
        "on-demand:g.one:b",
        "on-demand:g.two:a",
    ]


def test_spot_policy_explained() -> None:
    with pytest.raises(NoFeasibleOffering) as info:
        select(Resources(gpus=4), "required", tiny_catalog(), "r-1")
    assert info.value.constraint == "spot_policy"
    assert "g.od" in str(info.value)
    assert "auto" in str(info.value)


def test_all_unavailable_explained() -> None:
    keys = frozenset({"spot:g.one:a", "spot:g.one:b"})
    with pytest.raises(NoFeasibleOffering) as info:
        select(
            Resources(gpus=1, gpu_models=["L4"]),
            "required",
            tiny_catalog(),
            "r-1",
            unavailable=keys,
        )
    assert info.value.constraint == "unavailable"
    assert "spot:g.one:a" in str(info.value)


# --- the rework model -------------------------------------------------------------------------


def spot_offering(bucket: int | None, price: float = 2.0) -> Offering:
    return Offering(CATALOG.instance_type("g5.xlarge"), "r-1", "z", "spot", price, bucket)


def test_hazard_from_bucket_midpoints() -> None:
    assert math.isclose(hourly_hazard(1), -math.log(1 - 0.075) / HOURS_PER_MONTH)
    assert math.isclose(hourly_hazard(4), -math.log(1 - 0.30) / HOURS_PER_MONTH)
    assert hourly_hazard(None) == hourly_hazard(4)
    hazards = [hourly_hazard(b) for b in range(5)]
    assert hazards == sorted(hazards)


def test_rework_of_a_rare_interruption_is_half_the_segment_plus_restart() -> None:
    """At the Advisor's hazards the model is the first-order one: an interruption loses half
    the work since the last checkpoint (the whole run without one) plus a restart."""
    o = spot_offering(1)
    lam = hourly_hazard(1)
    first_order = lam * (5.0 + RESTART_OVERHEAD_HOURS)
    assert math.isclose(rework_fraction(o, 1, 10.0), first_order, rel_tol=1e-3)
    assert math.isclose(rework_fraction(o, 3, 10.0), 3 * first_order, rel_tol=3e-3)
    # A checkpoint interval longer than the run is the same as none.
    assert rework_fraction(o, 1, 10.0, 50.0) == rework_fraction(o, 1, 10.0)
    o2, lam2 = spot_offering(2), hourly_hazard(2)
    per_checkpoint = 2 * lam2 * (0.5 + RESTART_OVERHEAD_HOURS)
    assert math.isclose(rework_fraction(o2, 2, 100.0, 1.0), per_checkpoint, rel_tol=1e-3)
    cost = expected_cost(o2, 2, 100.0, 1.0)
    assert math.isclose(cost, 2 * 2.0 * 100.0 * (1 + rework_fraction(o2, 2, 100.0, 1.0)))


@pytest.mark.parametrize(("gang_hazard", "segment"), [(0.5, 0.5), (2.0, 1.0), (0.05, 4.0)])
def test_rework_matches_a_replay_of_checkpoint_and_restart(
    gang_hazard: float, segment: float
) -> None:
    """Against an independent replay (seeded): Poisson interruptions, each losing the segment's
    progress and a restart; the model is exact for it, also where first order is not."""
    rng = random.Random(7)
    segments, spent = 20_000, 0.0
    for _ in range(segments):
        while (gap := rng.expovariate(gang_hazard)) < segment:
            spent += gap + RESTART_OVERHEAD_HOURS
        spent += segment
    replayed = spent / (segments * segment) - 1
    o = spot_offering(4)
    observed = gang_hazard / 2  # two nodes
    modelled = rework_fraction(o, 2, 100.0, segment, observed)
    assert math.isclose(modelled, replayed, rel_tol=0.05)
    if gang_hazard * segment >= 1:
        assert modelled > 1.2 * gang_hazard * (segment / 2 + RESTART_OVERHEAD_HOURS)


def test_observed_hazard_is_the_jobs_rate_shrunk_by_the_prior() -> None:
    assert observed_hazard(0, 0.0, 1) == 0.0
    assert observed_hazard(0, 3600.0 * 100, 4) == 0.0
    # One interruption in its first hour reads 1 / (24 + 1), not 1: 0.04 on the grid of
    # tenths of a decade.
    assert observed_hazard(1, 3600.0, 1) == 0.0398 == round(10**-1.4, 4)
    # Instance-hours: 4 nodes for 6 hours are 24: 10 / 48 = 0.208 -> 10^-0.7.
    assert observed_hazard(10, 6 * 3600.0, 4) == 0.2
    # Lived long enough, it is the job's own rate, within half a step (12%).
    assert math.isclose(observed_hazard(500, 1000 * 3600.0, 1), 500 / 1024, rel_tol=0.13)
    # Alike experiences share a value (and a cached plan in the simulator).
    assert observed_hazard(5, 10 * 3600.0, 1) == observed_hazard(5, 10.5 * 3600.0, 1)
    with pytest.raises(ValueError, match="interruptions"):
        observed_hazard(-1, 0.0, 1)
    with pytest.raises(ValueError, match="nodes"):
        observed_hazard(1, 0.0, 0)


def test_an_observed_hazard_only_raises_a_buckets() -> None:
    o = spot_offering(4)
    assert rework_fraction(o, 1, 10.0, 1.0, observed=1e-9) == rework_fraction(o, 1, 10.0, 1.0)
    assert rework_fraction(o, 1, 10.0, 1.0, observed=0.5) > 100 * rework_fraction(o, 1, 10.0, 1.0)
    with pytest.raises(ValueError, match="observed"):
        select(Resources(gpus=1), "auto", CATALOG, "us-east-1", observed=-1.0)


def cheapest(selection: Selection, capacity_type: str) -> float:
    return min(r.expected_cost_usd for r in selection if r.offering.capacity_type == capacity_type)


def test_auto_ranks_on_demand_first_when_the_expected_rework_makes_spot_dearer() -> None:
    """The same request, the same prices: spot first at the Advisor's hazard, on-demand first
    once the job's interruptions say spot is dearer in expectation; checkpoints keep it on spot."""
    r = Resources(gpus=8, gpu_memory_gib=40, nodes=2)
    at = {"expected_hours": 10.0, "limit": 500}
    advisor = select(r, "auto", CATALOG, "us-east-1", **at)
    assert advisor.best.offering.capacity_type == "spot"
    assert cheapest(advisor, "spot") < cheapest(advisor, "on-demand")
    lived = select(r, "auto", CATALOG, "us-east-1", observed=0.2, **at)
    assert lived.best.offering.capacity_type == "on-demand"
    assert cheapest(lived, "on-demand") < cheapest(lived, "spot")
    # Checkpointing every 10 minutes, the same experience leaves spot cheaper.
    often = select(
        r, "auto", CATALOG, "us-east-1", observed=0.2, checkpoint_interval_hours=1 / 6, **at
    )
    assert often.best.offering.capacity_type == "spot"
    # On-demand prices do not move with the hazard.
    assert cheapest(lived, "on-demand") == cheapest(advisor, "on-demand")


def test_on_demand_has_no_rework() -> None:
    o = Offering(CATALOG.instance_type("g5.xlarge"), "r-1", "z", "on-demand", 1.0, None)
    assert rework_fraction(o, 8, 1000.0) == 0.0
    assert expected_cost(o, 8, 1000.0) == 8000.0


def test_long_uncheckpointed_gang_prefers_on_demand() -> None:
    """Rework can flip the choice: 64 nodes x 2000 h without checkpoints on a >20% bucket."""
    spot, od = spot_offering(4, price=0.9), spot_offering(None, price=1.0)
    od = Offering(od.instance_type, "r-1", "z", "on-demand", 1.0, None)
    assert expected_cost(spot, 1, 2.0) < expected_cost(od, 1, 2.0)
    assert expected_cost(spot, 64, 2000.0) > expected_cost(od, 64, 2000.0)
    assert expected_cost(spot, 64, 2000.0, 1.0) < expected_cost(od, 64, 2000.0, 1.0)


def test_is_feasible_matches_models_case_insensitively() -> None:
    p4d = CATALOG.instance_type("p4d.24xlarge")
    for models in (["A100"], ["a100"], ["NVIDIA A100"], ["V100", "a100"]):
        assert is_feasible(p4d, Resources(gpus=8, gpu_models=models))
    assert not is_feasible(p4d, Resources(gpus=8, gpu_models=["A10"]))
    assert not is_feasible(p4d, Resources(gpus=8, gpu_memory_gib=80))


# --- diversification --------------------------------------------------------------------------


def test_diversify_spreads_over_types_and_zones() -> None:
    sel = select(Resources(gpus=8, gpu_memory_gib=80), "auto", CATALOG, "us-east-1", limit=40)
    overrides = diversify(sel, max_types=3)
    cap = sel.best.offering.capacity_type
    assert overrides[0] == sel.best
    assert {x.offering.capacity_type for x in overrides} == {cap}
    types = [x.offering.instance_type.name for x in overrides]
    assert 2 <= len(set(types)) <= 3
    assert len({x.offering.location for x in overrides}) >= 2
    keys = [x.offering.key for x in overrides]
    assert len(keys) == len(set(keys))
    costs = [x.expected_cost_usd for x in overrides]
    assert costs == sorted(costs)


def test_diversify_limits_and_capacity_type() -> None:
    sel = select(Resources(gpus=1), "auto", CATALOG, "us-east-1", limit=60)
    assert len(diversify(sel, max_types=1, max_overrides=2)) <= 2
    assert len({x.offering.instance_type.name for x in diversify(sel, 1)}) == 1
    od = diversify(sel, 4, capacity_type="on-demand")
    assert od
    assert {x.offering.capacity_type for x in od} == {"on-demand"}
    assert diversify(Selection("r", (), 0)) == []
    assert diversify([]) == []
