"""The simulated EC2 market: prices, spot interruptions, spot capacity, boot and restore.

Built from the bundled catalog (`gpufleet.domain.catalog.load_bundled()`, itself built from
`../shared/data/prices` and `../shared/data/spot-advisor`) for one region. Two settings choose
how harsh it is (`MarketConfig.interruptions`, `MarketConfig.spot_capacity`):

- Spot interruptions, `advisor`: a Poisson process per instance with the hourly hazard of the
  offering's Spot Advisor bucket, `gpufleet.domain.selection.hourly_hazard` (the number
  selection ranks with), times `hazard_scale`; a gang of n instances at n times that rate.
  `measured`: every spot pool replays one of the preemption processes measured on EC2
  (`gpufleet.sim.measured`: Bamboo and SkyPilot), chosen by the pool's Spot Advisor bucket:
  all were measured on '>20%' pools, so a pool of that bucket (or of an unknown one) replays a
  process as measured, and a pool of a lower bucket b replays one with each instant's loss
  share thinned by `hourly_hazard(b) / hourly_hazard('>20%')`. The process and the offset
  into it are drawn from the seed and the pool key alone; the process loops. At each of its
  instants every instance in the pool is lost with that instant's share, independently, so
  the gangs of one pool are hit together in a burst, as measured. On-demand: never.
- Spot capacity, `unlimited`: a launch fails with a fixed probability (`spot_launch_failure`,
  5 %, an assumption, not a measurement) and optional outages. `finite`: each spot pool holds
  at most `spot_pool_instances` instances, scaled at each moment by the share of the request
  that one of SkyPilot's measured availability traces (of the same size class: one-GPU or
  multi-GPU instances) could launch then; the trace and the offset are drawn from the seed and
  the pool key; a launch fails when the pool has not room for the whole gang. Instances
  already held are not taken away when the availability drops (interruptions do that). A
  region-level offering (a price known per region, no zone) stands for its type in each of
  the region's zones: it is that many pools, and a launch lands in the first with room,
  starting from a random zone (EC2 picks the zone).
- Launch failure overrides by pool (`pool_launch_failure`) and on-demand failures apply in
  both capacity settings. Prices: each offering's hourly price, constant over the run.
- Boot: `boot_seconds` (default 180) from launch to the job starting; after an interruption
  the job also spends `restore_seconds` (default 60) loading its checkpoint. An interrupted
  job keeps the progress of its last checkpoint (`checkpointed_progress`).

Randomness: the caller passes a seeded `random.Random` to every draw, and the pools' processes,
traces and offsets depend only on `seed` and the pool key, so one seed reproduces a whole run.
"""

from __future__ import annotations

import bisect
import json
import math
import random
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from gpufleet.domain.catalog import (
    INTERRUPTION_BUCKETS,
    CapacityType,
    Catalog,
    Offering,
    load_bundled,
)
from gpufleet.domain.selection import hourly_hazard
from gpufleet.sim.measured import (
    BAMBOO_DIR,
    BAMBOO_EVENT_TRACES,
    BAMBOO_STEP_TRACES,
    AvailabilityTrace,
    MeasuredSpot,
    PreemptionProcess,
    SizeClass,
    event_series,
    step_series,
)

SECONDS_PER_HOUR = 3600.0

InterruptionModel = Literal["advisor", "measured"]
CapacityModel = Literal["unlimited", "finite"]


class MarketConfig(BaseModel):
    """The market's knobs. Probabilities are per launch attempt."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    interruptions: InterruptionModel = Field(
        default="advisor", description="Spot interruptions: Spot Advisor hazard or measured"
    )
    spot_capacity: CapacityModel = Field(
        default="unlimited", description="Spot pools: unlimited, or measured finite capacity"
    )
    spot_pool_instances: int = Field(
        default=16,
        ge=1,
        description="Most instances a spot pool holds when fully available (finite capacity): "
        "the largest request SkyPilot measured",
    )
    boot_seconds: float = Field(default=180, ge=0, description="Launch to job running")
    restore_seconds: float = Field(
        default=60, ge=0, description="Loading a checkpoint after a restart"
    )
    notice_seconds: float = Field(
        default=120, ge=0, description="Spot interruption warning before the instance stops"
    )
    hazard_scale: float = Field(
        default=1.0, ge=0, description="Multiplier on the Spot Advisor hourly hazard (advisor)"
    )
    on_demand_launch_failure: float = Field(default=0.0, ge=0, le=1)
    spot_launch_failure: float = Field(
        default=0.05, ge=0, le=1, description="Per attempt, with unlimited spot capacity only"
    )
    pool_launch_failure: dict[str, float] = Field(
        default_factory=dict,
        description=(
            "Overrides by pool: 'capacity-type:instance-type:zone' (zone = region for "
            "region-level offerings) or 'capacity-type:instance-type' for every zone"
        ),
    )
    spot_outages_per_pool_day: float = Field(
        default=0.0, ge=0, description="Mean outages per spot pool per day (0 = none)"
    )
    outage_mean_hours: float = Field(default=1.0, gt=0, description="Mean outage length")


def checkpointed_progress(done_seconds: float, interval_seconds: float | None) -> float:
    """Progress kept when a job that has done `done_seconds` of work is interrupted.

    With a checkpoint every `interval_seconds` of progress, the work since the last one is
    lost; with no checkpoints (None) everything is.
    """
    if done_seconds <= 0 or interval_seconds is None:
        return 0.0
    if interval_seconds <= 0:
        raise ValueError("interval_seconds must be positive or None")
    return math.floor(done_seconds / interval_seconds) * interval_seconds


class _Outages:
    """One pool's outage intervals, drawn lazily and deterministically."""

    __slots__ = ("_ends", "_mean_s", "_rate_s", "_rng", "_starts")

    def __init__(self, seed: int, key: str, per_day: float, mean_hours: float) -> None:
        self._rng = random.Random(f"{seed}:{key}")
        self._rate_s = per_day / 86400.0
        self._mean_s = mean_hours * SECONDS_PER_HOUR
        self._starts: list[float] = []
        self._ends: list[float] = []

    def active(self, at: float) -> bool:
        while not self._starts or self._starts[-1] <= at:
            last_end = self._ends[-1] if self._ends else 0.0
            start = last_end + self._rng.expovariate(self._rate_s)
            self._starts.append(start)
            self._ends.append(start + self._rng.expovariate(1.0 / self._mean_s))
        i = bisect.bisect_right(self._starts, at) - 1
        return i >= 0 and at < self._ends[i]


@dataclass(slots=True)
class SpotPool:
    """One spot pool of the region (a type in a zone) as the measured market sees it."""

    key: str  # the offering's key; region-level offerings add '#<zone index>'
    process: PreemptionProcess | None  # measured interruptions; None with advisor
    thinning: float  # multiplier on the process's loss shares (the bucket's hazard ratio)
    process_offset: float  # seconds into the process at simulated time 0
    availability: AvailabilityTrace | None  # finite capacity; None when unlimited
    availability_offset: float
    held: int = 0  # instances launched here and not yet released


@dataclass(slots=True)
class Lease:
    """Instances launched by one successful attempt: what `release` and interruptions use."""

    offering: Offering
    instances: int
    pool: SpotPool | None  # None: on-demand, or a spot pool the settings need not track
    released: bool = False


def size_class(offering: Offering) -> SizeClass:
    """Which measured availability traces a pool follows: one-GPU or multi-GPU instances (a
    CPU-only type counts as one-GPU: the measured traces are all of GPU instances)."""
    return "multi-gpu" if offering.instance_type.gpus > 1 else "one-gpu"


class MarketModel:
    """Offerings, prices and random events of one region."""

    def __init__(
        self,
        catalog: Catalog | None = None,
        region: str = "us-east-1",
        config: MarketConfig | None = None,
        *,
        seed: int = 0,
        measured: MeasuredSpot | None = None,
    ) -> None:
        self.catalog = catalog or load_bundled()
        self.region = region
        self.config = config or MarketConfig()
        self.seed = seed
        offerings = self.catalog.offerings(region)
        if not offerings:
            raise ValueError(
                f"region {region!r} has no offerings in the catalog; "
                f"known regions: {', '.join(self.catalog.regions())}"
            )
        self.offerings: tuple[Offering, ...] = tuple(offerings)
        self._by_key = {o.key: o for o in offerings}
        self._outages: dict[str, _Outages] = {}
        self._pools: dict[str, tuple[SpotPool, ...]] = {}
        self.measured_interruptions = self.config.interruptions == "measured"
        self.finite_capacity = self.config.spot_capacity == "finite"
        self._processes: tuple[PreemptionProcess, ...] = ()
        self._availability: dict[SizeClass, tuple[AvailabilityTrace, ...]] = {}
        if self.measured_interruptions:
            if measured is None or not measured.preemption:
                raise ValueError("interruptions='measured' needs the measured preemption traces")
            self._processes = measured.preemption
        if self.finite_capacity:
            if measured is None or not measured.availability:
                raise ValueError("spot_capacity='finite' needs the measured availability traces")
            self._availability = {
                size: measured.availability_of(size) for size in ("one-gpu", "multi-gpu")
            }
        # A region-level offering stands for its type in each zone the catalog knows here.
        self.zones = max(1, len({o.zone for o in offerings if o.zone}))
        # Without overrides or outages a launch's chance of failing is its capacity type's.
        self._plain_failures = (
            not self.config.pool_launch_failure and self.config.spot_outages_per_pool_day <= 0
        )
        self._pools_by_id: dict[int, tuple[SpotPool, ...]] = {}

    def offering(self, key: str) -> Offering:
        """The offering with pool key `capacity-type:instance-type:zone`; KeyError if none."""
        try:
            return self._by_key[key]
        except KeyError:
            raise KeyError(f"no offering {key!r} in {self.region}") from None

    def hourly_usd(self, offering: Offering) -> float:
        return offering.hourly_usd

    def cost_usd(self, offering: Offering, seconds: float, instances: int = 1) -> float:
        """What holding `instances` of `offering` for `seconds` costs."""
        return offering.hourly_usd * instances * seconds / SECONDS_PER_HOUR

    # --- Pools --------------------------------------------------------------------------------

    def pools(self, offering: Offering) -> tuple[SpotPool, ...]:
        """The spot pools an offering launches into (empty for on-demand, and when neither
        setting needs pools); drawn once, from the seed and the pool key alone."""
        pools = self._pools_by_id.get(id(offering))  # the catalog keeps its offerings alive
        if pools is not None:
            return pools
        if offering.capacity_type != "spot" or not (
            self.measured_interruptions or self.finite_capacity
        ):
            pools = ()
        else:
            pools = self._pools.get(offering.key)
        if pools is None:
            count = 1 if offering.zone else self.zones
            keys = [offering.key] if count == 1 else [f"{offering.key}#{z}" for z in range(count)]
            pools = tuple(self._draw_pool(offering, key) for key in keys)
            self._pools[offering.key] = pools
        self._pools_by_id[id(offering)] = pools
        return pools

    def _draw_pool(self, offering: Offering, key: str) -> SpotPool:
        rng = random.Random(f"{self.seed}:pool:{key}")
        process: PreemptionProcess | None = None
        thinning, process_offset = 1.0, 0.0
        if self._processes:
            process = rng.choice(self._processes)
            thinning = min(
                1.0,
                hourly_hazard(offering.interruption_bucket) / hourly_hazard(process.bucket),
            )
            process_offset = rng.uniform(0.0, process.period_seconds)
        availability: AvailabilityTrace | None = None
        availability_offset = 0.0
        if self._availability:
            availability = rng.choice(self._availability[size_class(offering)])
            availability_offset = rng.uniform(0.0, availability.period_seconds)
        return SpotPool(key, process, thinning, process_offset, availability, availability_offset)

    def capacity(self, pool: SpotPool, at: float) -> int | None:
        """Instances the pool can hold at `at` (None: unlimited)."""
        trace = pool.availability
        if trace is None:
            return None
        share = trace.share(at + pool.availability_offset)
        return math.floor(self.config.spot_pool_instances * share)

    # --- Launch and release -------------------------------------------------------------------

    def launch(
        self, offering: Offering, instances: int, at: float, rng: random.Random
    ) -> Lease | None:
        """Try to launch `instances` of `offering` at `at`: the lease, or None when the attempt
        fails for lack of capacity (a gang launches whole or not at all)."""
        if instances < 1:
            raise ValueError("instances must be >= 1")
        if self._plain_failures:  # the same draw as launch_fails, without the lookups
            p = self._default_failure(offering.capacity_type)
            if p > 0 and rng.random() < p:
                return None
        elif self.launch_fails(offering, at, rng):
            return None
        pools = self.pools(offering)
        if not pools:
            return Lease(offering, instances, None)
        first = rng.randrange(len(pools)) if len(pools) > 1 else 0
        for i in range(len(pools)):
            pool = pools[(first + i) % len(pools)]
            room = self.capacity(pool, at)
            if room is None or pool.held + instances <= room:
                pool.held += instances
                return Lease(offering, instances, pool)
        return None

    def release(self, lease: Lease) -> None:
        """The lease's instances are gone (ended, interrupted, terminated): free their room."""
        if lease.released:
            raise ValueError(f"{lease.offering.key}: lease released twice")
        lease.released = True
        if lease.pool is not None:
            lease.pool.held -= lease.instances

    # --- Interruptions ------------------------------------------------------------------------

    def hazard_per_hour(self, offering: Offering) -> float:
        """Advisor interruptions per instance-hour: 0 on-demand; the bucket's hazard for spot."""
        if offering.capacity_type != "spot":
            return 0.0
        return hourly_hazard(offering.interruption_bucket) * self.config.hazard_scale

    def next_interruption(
        self, lease: Lease, start: float, rng: random.Random, until: float = math.inf
    ) -> float | None:
        """When (same clock as `start`) the first of the lease's instances, running from
        `start`, is interrupted, if before `until`; None if not (always None on-demand)."""
        offering = lease.offering
        if offering.capacity_type != "spot":
            return None
        if not self.measured_interruptions:
            rate = self.hazard_per_hour(offering) * lease.instances / SECONDS_PER_HOUR
            if rate <= 0:
                return None
            at = start + rng.expovariate(rate)
            return at if at < until else None
        pool = lease.pool
        assert pool is not None, "a measured spot lease has its pool"
        return _replay(pool, lease.instances, start, until, rng)

    # --- Capacity -----------------------------------------------------------------------------

    def launch_failure_probability(self, offering: Offering) -> float:
        """Chance that one launch attempt in the offering's pool fails for a reason other than
        the finite capacity of `spot_capacity='finite'`."""
        overrides = self.config.pool_launch_failure
        if overrides:
            key = offering.key
            if key in overrides:
                return overrides[key]
            broad = f"{offering.capacity_type}:{offering.instance_type.name}"
            if broad in overrides:
                return overrides[broad]
        return self._default_failure(offering.capacity_type)

    def _default_failure(self, capacity_type: CapacityType) -> float:
        if capacity_type == "spot":
            return 0.0 if self.finite_capacity else self.config.spot_launch_failure
        return self.config.on_demand_launch_failure

    def in_outage(self, offering: Offering, at: float) -> bool:
        """Whether the offering's spot pool is in an outage at `at` (never for on-demand)."""
        if offering.capacity_type != "spot" or self.config.spot_outages_per_pool_day <= 0:
            return False
        schedule = self._outages.get(offering.key)
        if schedule is None:
            schedule = _Outages(
                self.seed,
                offering.key,
                self.config.spot_outages_per_pool_day,
                self.config.outage_mean_hours,
            )
            self._outages[offering.key] = schedule
        return schedule.active(at)

    def launch_fails(self, offering: Offering, at: float, rng: random.Random) -> bool:
        """Draw whether a launch attempt at `at` fails for an outage or the fixed probability
        (finite pool capacity is checked by `launch`)."""
        if self.in_outage(offering, at):
            return True
        p = self.launch_failure_probability(offering)
        return p > 0 and rng.random() < p

    # --- Time ---------------------------------------------------------------------------------

    @property
    def boot_seconds(self) -> float:
        return self.config.boot_seconds

    @property
    def restore_seconds(self) -> float:
        return self.config.restore_seconds


def _replay(
    pool: SpotPool, instances: int, start: float, until: float, rng: random.Random
) -> float | None:
    """The first instant of the pool's process after `start` (and before `until`) at which one
    of `instances` is lost: each is lost with the instant's (thinned) share, independently."""
    process = pool.process
    assert process is not None
    instants, fractions = process.instants, process.fractions
    period = process.period_seconds
    position = (start + pool.process_offset) % period
    cycle_start = start - position  # simulated time of the process's position 0
    k = bisect.bisect_right(instants, position)
    while True:
        if k == len(instants):
            k = 0
            cycle_start += period
        at = cycle_start + instants[k]
        if at >= until:
            return None
        share = pool.thinning * fractions[k]
        hit = share if instances == 1 else 1.0 - (1.0 - share) ** instances
        if rng.random() < hit:
            return at
        k += 1


# --- Checking the hazard against measured preemptions ----------------------------------------

SPOT_ADVISOR_2022_DIR = Path("spot-advisor") / "aws-spot-advisor-2022"


@dataclass(frozen=True, slots=True)
class PreemptionCheck:
    """Measured preemptions of one Bamboo trace against the Spot Advisor-derived hazard."""

    trace: str  # path under traces/aws-spot-preemption-bamboo
    instance_types: tuple[str, ...]  # the types compared (a family's sizes when size unknown)
    hours: float  # span of the trace
    instance_hours: float  # time integral of the fleet size
    preemptions: int  # instances lost
    preemption_instants: int  # distinct times at which at least one was lost
    observed_per_instance_hour: float
    # Mean hourly hazard over `instance_types` from the bundled catalog's spot offerings in
    # the region (buckets as of the catalog's sources); None if it has no spot offering.
    catalog_per_instance_hour: float | None
    catalog_buckets: tuple[str, ...]
    # The same from the Spot Advisor snapshot nearest the measurements (2022-01-09).
    snapshot: str
    snapshot_per_instance_hour: float | None
    snapshot_buckets: tuple[str, ...]

    @property
    def ratio_to_catalog(self) -> float | None:
        """Observed rate / catalog hazard: 1 means the model matches the measurement."""
        c = self.catalog_per_instance_hour
        return None if not c else self.observed_per_instance_hour / c

    @property
    def ratio_to_snapshot(self) -> float | None:
        s = self.snapshot_per_instance_hour
        return None if not s else self.observed_per_instance_hour / s


def _mean(values: Sequence[float]) -> float | None:
    return sum(values) / len(values) if values else None


def _labels(buckets: Iterable[int | None]) -> tuple[str, ...]:
    return tuple(
        sorted(
            {"unknown" if b is None else INTERRUPTION_BUCKETS[b] for b in buckets},
            key=(*INTERRUPTION_BUCKETS, "unknown").index,
        )
    )


def bamboo_check(
    data_dir: str | Path,
    region: str = "us-east-1",
    catalog: Catalog | None = None,
    snapshot: str = "2022-01-09",
) -> list[PreemptionCheck]:
    """Observed spot preemptions per instance-hour in Bamboo's EC2 traces vs the hazard the
    market model uses for the same instance types.

    `data_dir` is the shared data root (holding `traces/` and `spot-advisor/`). The Bamboo
    traces do not state their region; the 2020 files are us-east-1 and the comparison assumes
    `region` for all. The 2021 traces name the family only, so the hazard is averaged over the
    family's sizes with spot offerings. The 3-day p2 step file is left out (time unit unclear).
    """
    root = Path(data_dir)
    bamboo = root / BAMBOO_DIR
    if not bamboo.is_dir():
        raise FileNotFoundError(f"no Bamboo traces at {bamboo}")
    cat = catalog or load_bundled()
    spot_offers = [o for o in cat.offerings(region) if o.capacity_type == "spot"]
    advisor_file = root / SPOT_ADVISOR_2022_DIR / f"spot-advisor-data-{snapshot}.json"
    advisor: dict[str, int] = {}
    if advisor_file.is_file():
        doc = json.loads(advisor_file.read_text("utf-8"))
        rows = doc.get("spot_advisor", {}).get(region, {}).get("Linux", {})
        advisor = {name: int(v["r"]) for name, v in rows.items()}

    def compare(rel: str, types: tuple[str, ...], stats: tuple[float, float, int, int]) -> None:
        span, inst_hours, lost, instants = stats
        mine = [o for o in spot_offers if o.instance_type.name in types]
        snap = [advisor[t] for t in types if t in advisor]
        out.append(
            PreemptionCheck(
                trace=rel,
                instance_types=types,
                hours=span,
                instance_hours=inst_hours,
                preemptions=lost,
                preemption_instants=instants,
                observed_per_instance_hour=lost / inst_hours if inst_hours > 0 else 0.0,
                catalog_per_instance_hour=_mean(
                    [hourly_hazard(o.interruption_bucket) for o in mine]
                ),
                catalog_buckets=_labels(o.interruption_bucket for o in mine),
                snapshot=snapshot,
                snapshot_per_instance_hour=_mean([hourly_hazard(b) for b in snap]),
                snapshot_buckets=_labels(snap),
            )
        )

    out: list[PreemptionCheck] = []
    for rel, family in BAMBOO_EVENT_TRACES:
        path = bamboo / rel
        if not path.is_file():
            continue
        members = {t.name for t in cat.instance_types() if t.family == family}
        members |= {name for name in advisor if name.split(".", 1)[0] == family}
        compare(rel, tuple(sorted(members)), event_series(path).stats())
    for rel, type_name in BAMBOO_STEP_TRACES:
        path = bamboo / rel
        if path.is_file():
            compare(rel, (type_name,), step_series(path).stats())
    return out
