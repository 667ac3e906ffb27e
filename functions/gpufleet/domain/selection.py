"""Instance selection: rank the feasible offerings of a region by expected cost to finish.

Pure: a `Catalog`, the job's `Resources` and spot policy in, ranked `Offering`s out.

Feasibility (per node; every node of a job gets the same instance type):

- GPU jobs (`gpus >= 1`): instance GPUs >= requested GPUs (an exact count wins ties), GPU memory
  per GPU >= `gpu_memory_gib`, model in `gpu_models` when given (case-insensitive, vendor words
  ignored: 'a100' == 'NVIDIA A100'). With an empty allow-list only NVIDIA types qualify: job
  images assume CUDA, so AMD, Inferentia, Trainium and Qualcomm types are chosen only when
  `gpu_models` names their model. Fractional-GPU types (g6f, gr6f) have 0 whole GPUs and are
  never chosen for GPU jobs.
- CPU jobs (`gpus == 0`): CPU-only types only (accelerator "none").
- vCPUs >= `vcpus`, RAM >= `memory_gib`, same `arch`; EFA when `nodes > 1`.
- NVMe instance-store disks when the job mounts the instance store (`needs_instance_store`,
  a spec's `volumes: [{instance_store: scratch, ...}]`).
- Spot policy: never -> on-demand offerings only; required -> spot only; auto -> both.
- Offerings whose key (`capacity-type:instance-type:zone`, zone = region when unknown) is in
  `unavailable` are skipped.

Rework model (expected cost to finish, what the ranking minimizes):

    cost = nodes * hourly * H * (1 + rework)               H = expected_hours
    rework = 0 for on-demand; for spot, with x = min(C, H) and L = nodes * lambda:
    rework = (exp(L * x) - 1) * (1 / L + R) / x - 1        C = checkpoint interval (H if none)
    lambda = max(-ln(1 - f) / 730, observed)               hourly hazard per instance
    f = monthly interruption fraction of the Spot Advisor bucket (midpoint):
        <5%: 2.5%, 5-10%: 7.5%, 10-15%: 12.5%, 15-20%: 17.5%, >20%: 30% (unknown: 30%)
    observed = k / (P + T)                                 the job's own spot experience
    R = 0.05 h restart overhead (boot + relaunch, ~3 min)

Spot Advisor's "frequency of interruption" is the share of instances of that type and region
interrupted over the trailing month; as a constant hazard that is lambda = -ln(1 - f) / 730 h.
A job holding `nodes` instances is interrupted when any of them is (gang scheduling), so its
hazard is L = nodes * lambda. Between two checkpoints the job must run x hours without an
interruption; each interruption loses the work since the last checkpoint and costs R to
relaunch. With interruptions a Poisson process of rate L, a segment of x hours takes
(exp(L x) - 1) / L hours of running on average and meets exp(L x) - 1 interruptions (the
renewal argument of checkpoint/restart models): the rework fraction above. For small L x it is
L (x / 2 + R), the first-order model (half a segment lost per interruption); it grows
exponentially once a gang's interruptions come more often than its checkpoints, which is what
the measured spot market does to multi-node jobs (`sim/README.md`).

The Advisor's buckets are a floor: measured GPU spot preemption runs far above them. A job that
was interrupted k times in T instance-hours on spot (`Job.interruptions`, `spot_held_seconds`
x nodes) has seen k / T; shrunk toward zero by P = 24 prior instance-hours (one interruption
in its first hour reads 1/25, not 1), rounded to a tenth of a decade (steps of 26%: the data
say no more, and alike experiences rank alike), it replaces a bucket's hazard when higher
(`observed_hazard`). So a `spot: auto` job ranks on-demand first once what it has lived through
makes spot dearer in expectation, and stays on spot while spot is still cheaper.
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass

from gpufleet.domain.boot import STOCK_TARGETS, BootTarget, boots, unbootable_reason
from gpufleet.domain.catalog import (
    INTERRUPTION_BUCKETS,
    CapacityType,
    Catalog,
    InstanceType,
    Offering,
    normalize_model,
)
from gpufleet.domain.spec import Resources, SpotPolicy
from gpufleet.errors import RefusedInput

HOURS_PER_MONTH = 730.0
RESTART_OVERHEAD_HOURS = 0.05
# Midpoint of each Spot Advisor bucket, as a monthly interruption fraction; >20% is open-ended.
BUCKET_MONTHLY_FRACTION: tuple[float, ...] = (0.025, 0.075, 0.125, 0.175, 0.30)
UNKNOWN_BUCKET_MONTHLY_FRACTION = 0.30

_HAZARD: tuple[float, ...] = tuple(
    -math.log1p(-f) / HOURS_PER_MONTH for f in BUCKET_MONTHLY_FRACTION
)
_UNKNOWN_HAZARD = -math.log1p(-UNKNOWN_BUCKET_MONTHLY_FRACTION) / HOURS_PER_MONTH
# What the bucket's hazard weighs against a job's own interruptions, in instance-hours on spot.
PRIOR_EXPOSURE_HOURS = 24.0
# An observed hazard is rounded to a grid of steps of 10^(1/10) (26%): the data say no more, and
# plans (cached by it in the simulator) are the same for jobs of about the same experience.
HAZARD_STEPS_PER_DECADE = 10
# Beyond exp(50) more interruptions per segment, spot is hopeless: the rework stays finite.
_MAX_EXPONENT = 50.0


class NoFeasibleOffering(RefusedInput):
    """No offering in the region satisfies the request. `constraint` names the one that ruled
    everything out (e.g. "gpu_memory_gib"); the message says so in words."""

    def __init__(self, message: str, constraint: str, region: str) -> None:
        super().__init__(message)
        self.message = message
        self.constraint = constraint
        self.region = region


@dataclass(frozen=True, slots=True)
class RankedOffering:
    offering: Offering
    nodes: int
    expected_cost_usd: float
    reason: str

    @property
    def instance_type(self) -> InstanceType:
        return self.offering.instance_type


@dataclass(frozen=True, slots=True)
class Selection:
    """Ranked offerings, best (cheapest expected cost) first; never empty."""

    region: str
    ranked: tuple[RankedOffering, ...]
    feasible_count: int  # feasible offerings before `limit`

    @property
    def best(self) -> RankedOffering:
        return self.ranked[0]

    def __iter__(self) -> Iterator[RankedOffering]:
        return iter(self.ranked)

    def __len__(self) -> int:
        return len(self.ranked)


def hourly_hazard(interruption_bucket: int | None) -> float:
    """Interruptions per instance-hour for a Spot Advisor bucket (None = unknown = worst)."""
    if interruption_bucket is None:
        return _UNKNOWN_HAZARD
    return _HAZARD[interruption_bucket]


def observed_hazard(interruptions: int, spot_held_seconds: float, nodes: int) -> float:
    """Interruptions per instance-hour a job's own spot runs suggest (see the module doc): its
    k interruptions over the prior's `PRIOR_EXPOSURE_HOURS` plus the T instance-hours its
    `nodes` held spot for `spot_held_seconds`, on a grid of `HAZARD_STEPS_PER_DECADE` steps a
    decade; 0 before any interruption."""
    if interruptions < 0 or spot_held_seconds < 0 or nodes < 1:
        raise ValueError("interruptions, spot_held_seconds must be >= 0 and nodes >= 1")
    if interruptions == 0:
        return 0.0
    exposure = PRIOR_EXPOSURE_HOURS + spot_held_seconds * nodes / 3600
    steps = round(math.log10(interruptions / exposure) * HAZARD_STEPS_PER_DECADE)
    return float(f"{10 ** (steps / HAZARD_STEPS_PER_DECADE):.3g}")


def rework_fraction(
    offering: Offering,
    nodes: int,
    expected_hours: float,
    checkpoint_interval_hours: float | None = None,
    observed: float = 0.0,
) -> float:
    """Expected extra work, as a fraction of `expected_hours`, from spot interruptions at the
    bucket's hazard or the `observed` one, whichever is higher."""
    if offering.capacity_type != "spot":
        return 0.0
    segment = min(checkpoint_interval_hours or expected_hours, expected_hours)
    return _rework(nodes * max(hourly_hazard(offering.interruption_bucket), observed), segment)


def _rework(gang_hazard: float, segment_hours: float) -> float:
    """(exp(L x) - 1) (1 / L + R) / x - 1: a segment of x hours between checkpoints, with
    interruptions at L per hour, each losing the segment's progress and R to relaunch."""
    exponent = min(gang_hazard * segment_hours, _MAX_EXPONENT)
    return math.expm1(exponent) * (1.0 / gang_hazard + RESTART_OVERHEAD_HOURS) / segment_hours - 1.0


def expected_cost(
    offering: Offering,
    nodes: int,
    expected_hours: float,
    checkpoint_interval_hours: float | None = None,
    observed: float = 0.0,
) -> float:
    """Expected USD to finish: nodes x hourly x hours x (1 + rework fraction)."""
    rework = rework_fraction(offering, nodes, expected_hours, checkpoint_interval_hours, observed)
    return (nodes * expected_hours) * offering.hourly_usd * (1.0 + rework)


def allowed_capacity_types(spot_policy: SpotPolicy | str) -> frozenset[CapacityType]:
    policy = SpotPolicy(spot_policy)
    if policy is SpotPolicy.NEVER:
        return frozenset({"on-demand"})
    if policy is SpotPolicy.REQUIRED:
        return frozenset({"spot"})
    return frozenset({"spot", "on-demand"})


def _model_keys(resources: Resources) -> frozenset[str]:
    return frozenset(normalize_model(m) for m in resources.gpu_models)


def _accelerator_ok(it: InstanceType, models: frozenset[str], want_gpus: bool) -> bool:
    if not want_gpus:
        return it.is_cpu_only
    if it.is_cpu_only:
        return False
    if models:
        return it.model_key in models
    return it.accelerator == "nvidia"


def is_feasible(
    it: InstanceType, resources: Resources, *, needs_instance_store: bool = False
) -> bool:
    """Whether one node of `resources` fits on `it` (hardware only, not price or capacity);
    with `needs_instance_store`, only a type with NVMe instance-store disks does."""
    return _feasible(it, resources, _model_keys(resources), needs_instance_store)


def _feasible(
    it: InstanceType, r: Resources, models: frozenset[str], needs_instance_store: bool
) -> bool:
    return (
        _accelerator_ok(it, models, r.gpus > 0)
        and it.gpus >= r.gpus
        and (r.gpus == 0 or it.gpu_memory_gib >= r.gpu_memory_gib)
        and it.vcpus >= r.vcpus
        and it.memory_gib >= r.memory_gib
        and it.arch == r.arch.value
        and (r.nodes == 1 or it.efa)
        and (not needs_instance_store or it.has_nvme_instance_store)
    )


def _reason(o: Offering, r: Resources, rework: float) -> str:
    it = o.instance_type
    if it.gpus:
        fit = f"{it.gpus}x {it.gpu_model} {it.gpu_memory_gib:g} GiB"
        if it.gpus != r.gpus:
            fit += f" ({it.gpus - r.gpus} more GPU{'s' if it.gpus - r.gpus > 1 else ''} than asked)"
    else:
        fit = f"{it.vcpus} vCPU {it.memory_gib:g} GiB"
    if o.capacity_type == "spot":
        bucket = (
            "unknown"
            if o.interruption_bucket is None
            else INTERRUPTION_BUCKETS[o.interruption_bucket]
        )
        risk = f"spot, interruptions {bucket}/month, +{rework * 100:.2f}% expected rework"
    else:
        risk = "on-demand, no interruption risk"
    efa = ", EFA" if r.nodes > 1 else ""
    return f"{fit}{efa}; {risk}"


def select(
    resources: Resources,
    spot_policy: SpotPolicy | str,
    catalog: Catalog,
    region: str,
    *,
    expected_hours: float = 1.0,
    checkpoint_interval_hours: float | None = None,
    observed: float = 0.0,
    unavailable: frozenset[str] = frozenset(),
    limit: int = 10,
    bootable: frozenset[BootTarget] = STOCK_TARGETS,
    needs_instance_store: bool = False,
) -> Selection:
    """Rank the feasible offerings in `region`, cheapest expected cost to finish first.
    `observed` is the job's `observed_hazard`: spot offerings are ranked at it where it is
    above their bucket's. `needs_instance_store`: the job mounts the instance store
    (`JobSpec.needs_instance_store`); a type without NVMe instance-store disks is never ranked.

    `bootable`: what the deployment's launch templates boot (Settings.bootable); a type none
    of them boots is never ranked.

    Raises NoFeasibleOffering naming the constraint that ruled everything out.
    """
    if not expected_hours > 0:
        raise ValueError("expected_hours must be positive")
    if checkpoint_interval_hours is not None and not checkpoint_interval_hours > 0:
        raise ValueError("checkpoint_interval_hours must be positive or None")
    if limit < 1:
        raise ValueError("limit must be >= 1")
    if observed < 0:
        raise ValueError("observed must be >= 0")
    caps = allowed_capacity_types(spot_policy)
    index = catalog.region_index(region)
    if index is None:
        raise NoFeasibleOffering(
            f"region {region!r} has no offerings in the catalog; "
            f"known regions: {', '.join(catalog.regions())}",
            "region",
            region,
        )
    models = _model_keys(resources)
    nodes = resources.nodes
    segment = min(checkpoint_interval_hours or expected_hours, expected_hours)
    # One rework per bucket (index 5: unknown), computed once for every offering of it.
    reworks = [_rework(nodes * max(h, observed), segment) for h in (*_HAZARD, _UNKNOWN_HAZARD)]
    base = nodes * expected_hours
    want = resources.gpus
    groups = index.accelerated if want > 0 else index.cpu_only
    use_spot = "spot" in caps
    use_od = "on-demand" in caps

    # Candidates as sortable tuples: (cost, extra GPUs, spot?, bucket, name, location, i).
    candidates: list[tuple[float, int, int, int, str, str, int]] = []
    pool: list[tuple[Offering, float]] = []
    for it, offerings in groups:
        if not _feasible(it, resources, models, needs_instance_store) or not boots(it, bootable):
            continue
        extra = it.gpus - want
        for o in offerings:
            if o.capacity_type == "spot":
                if not use_spot:
                    continue
                b = o.interruption_bucket
                rank_bucket = 5 if b is None else b
                rework = reworks[rank_bucket]
                is_spot = 1
            else:
                if not use_od:
                    continue
                rework = 0.0
                rank_bucket = -1
                is_spot = 0
            if unavailable and o.key in unavailable:
                continue
            cost = base * o.hourly_usd * (1.0 + rework)
            candidates.append((cost, extra, is_spot, rank_bucket, it.name, o.location, len(pool)))
            pool.append((o, rework))
    if not candidates:
        raise _explain(
            resources,
            caps,
            index.accelerated + index.cpu_only,
            region,
            unavailable,
            catalog,
            bootable,
            needs_instance_store,
        )
    best = heapq.nsmallest(limit, candidates)
    ranked = tuple(
        RankedOffering(
            offering=pool[c[-1]][0],
            nodes=nodes,
            expected_cost_usd=c[0],
            reason=_reason(pool[c[-1]][0], resources, pool[c[-1]][1]),
        )
        for c in best
    )
    return Selection(region=region, ranked=ranked, feasible_count=len(candidates))


def diversify(
    selection: Selection | Sequence[RankedOffering],
    max_types: int = 3,
    *,
    capacity_type: CapacityType | None = None,
    max_overrides: int = 20,
) -> list[RankedOffering]:
    """The launch overrides for one CreateFleet request: several types and zones.

    Keeps one capacity type (that of the best offering unless given), the `max_types`
    cheapest instance types in rank order, and every zone the selection holds for each of
    them, best first, at most `max_overrides` entries. With price-capacity-optimized, EC2
    picks among them by price and spare capacity, so a capacity shortage in one pool does
    not fail the launch. Pass a selection built with a generous `limit` to see more zones.
    """
    ranked = list(selection.ranked if isinstance(selection, Selection) else selection)
    if not ranked:
        return []
    if max_types < 1 or max_overrides < 1:
        raise ValueError("max_types and max_overrides must be >= 1")
    cap = capacity_type or ranked[0].offering.capacity_type
    types: list[str] = []
    out: list[RankedOffering] = []
    seen: set[str] = set()
    for r in ranked:
        o = r.offering
        if o.capacity_type != cap or o.key in seen:
            continue
        name = o.instance_type.name
        if name not in types:
            if len(types) >= max_types:
                continue
            types.append(name)
        seen.add(o.key)
        out.append(r)
        if len(out) >= max_overrides:
            break
    return out


# --- Why nothing fits -------------------------------------------------------------------------


def _describe_gpu(it: InstanceType) -> str:
    return f"{it.name} ({it.gpus}x {it.gpu_model}, {it.gpu_memory_gib:g} GiB each)"


def _explain(
    r: Resources,
    caps: frozenset[CapacityType],
    groups: Iterable[tuple[InstanceType, tuple[Offering, ...]]],
    region: str,
    unavailable: frozenset[str],
    catalog: Catalog,
    bootable: frozenset[BootTarget],
    needs_instance_store: bool,
) -> NoFeasibleOffering:
    """Apply the constraints one at a time and report the first that empties the set."""
    pool = list(groups)
    models = _model_keys(r)
    where = f"in {region}"

    def fail(message: str, constraint: str) -> NoFeasibleOffering:
        return NoFeasibleOffering(message, constraint, region)

    types = [it for it, _ in pool]
    if r.gpus == 0:
        kept = [g for g in pool if g[0].is_cpu_only]
        if not kept:
            cpu_regions = [
                name
                for name in catalog.regions()
                if (idx := catalog.region_index(name)) is not None and idx.cpu_only
            ]
            return fail(
                f"no CPU-only instance type is priced {where}; the catalog prices CPU-only "
                f"types in {', '.join(cpu_regions) or 'no region'}",
                "gpus",
            )
    else:
        kept = [g for g in pool if _accelerator_ok(g[0], models, True)]
        if not kept:
            have = sorted({t.gpu_model for t in types if t.gpu_model and t.gpus})
            wanted = ", ".join(r.gpu_models) if r.gpu_models else "NVIDIA (any model)"
            return fail(
                f"no instance type {where} has GPU model {wanted}; models {where}: "
                f"{', '.join(have) or 'none'}",
                "gpu_models",
            )
        pool = kept
        kept = [g for g in pool if g[0].gpus >= r.gpus]
        if not kept:
            top = max(pool, key=lambda g: (g[0].gpus, g[0].gpu_memory_gib))[0]
            return fail(
                f"no instance type {where} has {r.gpus} GPUs or more of the allowed models; "
                f"the most is {_describe_gpu(top)}",
                "gpus",
            )
        pool = kept
        kept = [g for g in pool if g[0].gpu_memory_gib >= r.gpu_memory_gib]
        if not kept:
            top = max(pool, key=lambda g: (g[0].gpu_memory_gib, -g[0].gpus))[0]
            return fail(
                f"no instance type {where} has {r.gpus} GPUs with >= {r.gpu_memory_gib:g} GiB "
                f"each; the largest is {_describe_gpu(top)}",
                "gpu_memory_gib",
            )
    pool = kept
    kept = [g for g in pool if g[0].arch == r.arch.value]
    if not kept:
        names = ", ".join(sorted(g[0].name for g in pool)[:5])
        return fail(
            f"no matching instance type {where} is {r.arch.value}; candidates ({names}, ...) are "
            f"{', '.join(sorted({g[0].arch for g in pool}))}",
            "arch",
        )
    pool = kept
    kept = [g for g in pool if g[0].vcpus >= r.vcpus]
    if not kept:
        top = max(pool, key=lambda g: g[0].vcpus)[0]
        return fail(
            f"no matching instance type {where} has >= {r.vcpus} vCPUs; "
            f"the most is {top.name} ({top.vcpus})",
            "vcpus",
        )
    pool = kept
    kept = [g for g in pool if g[0].memory_gib >= r.memory_gib]
    if not kept:
        top = max(pool, key=lambda g: g[0].memory_gib)[0]
        return fail(
            f"no matching instance type {where} has >= {r.memory_gib:g} GiB RAM; "
            f"the most is {top.name} ({top.memory_gib:g} GiB)",
            "memory_gib",
        )
    pool = kept
    if r.nodes > 1:
        kept = [g for g in pool if g[0].efa]
        if not kept:
            names = ", ".join(sorted(g[0].name for g in pool)[:6])
            return fail(
                f"a {r.nodes}-node job needs EFA, and no matching instance type {where} has it "
                f"(matching without EFA: {names})",
                "efa",
            )
        pool = kept
    if needs_instance_store:
        kept = [g for g in pool if g[0].has_nvme_instance_store]
        if not kept:
            names = ", ".join(sorted(g[0].name for g in pool)[:6])
            return fail(
                f"the job mounts the instance store (an instance_store volume), and no matching "
                f"instance type {where} has NVMe instance-store disks (matching without them: "
                f"{names})",
                "instance_store",
            )
        pool = kept
    kept = [g for g in pool if boots(g[0], bootable)]
    if not kept:
        reasons = sorted({unbootable_reason(g[0], bootable) for g in pool})
        return fail(
            f"no matching instance type {where} can boot: {'; '.join(reasons)}",
            "boot",
        )
    pool = kept
    offerings = [o for _, offs in pool for o in offs if o.capacity_type in caps]
    if not offerings:
        policy = "spot" if caps == {"spot"} else "on-demand"
        names = ", ".join(sorted(g[0].name for g in pool)[:6])
        return fail(
            f"no {policy} offering {where} for the matching instance types ({names}); "
            f"spot policy 'auto' would allow "
            f"{'on-demand' if policy == 'spot' else 'spot'}",
            "spot_policy",
        )
    skipped = [o for o in offerings if o.key in unavailable]
    if len(skipped) == len(offerings):
        keys = ", ".join(sorted(o.key for o in skipped)[:6])
        return fail(
            f"all {len(skipped)} matching offerings {where} are marked unavailable after "
            f"recent capacity errors ({keys}{', ...' if len(skipped) > 6 else ''})",
            "unavailable",
        )
    return fail(f"no feasible offering {where}", "unknown")  # pragma: no cover
