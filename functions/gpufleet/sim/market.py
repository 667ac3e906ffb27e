"""The simulated EC2 market: prices, spot interruptions, capacity shortages, boot and restore.

Built from the bundled catalog (`gpufleet.domain.catalog.load_bundled()`, itself built from
`../shared/data/prices` and `../shared/data/spot-advisor`) for one region:

- Prices: each offering's hourly on-demand or spot price, constant over the run (the catalog
  has one spot price per pool, not a price history).
- Spot interruptions: a Poisson process per instance with the hourly hazard of the offering's
  Spot Advisor bucket, `gpufleet.domain.selection.hourly_hazard` (the same number selection
  ranks with), times `hazard_scale`. A gang of n instances is interrupted at n times that rate.
  On-demand instances are never interrupted. `bamboo_check()` compares the hazard with the
  preemptions measured on EC2 by the Bamboo authors.
- Capacity shortages: a launch in a pool (capacity type, instance type, zone) fails with a
  configured probability (default 0 on-demand, 5 % spot: an assumption, not a measurement),
  independently per attempt; optionally each spot pool also has outages, a Poisson number of
  them per day with exponential lengths, during which every launch in the pool fails. Outage
  schedules are drawn lazily from `seed` and the pool key alone, so they do not depend on the
  order of queries.
- Boot: `boot_seconds` (default 180) from launch to the job starting; after an interruption
  the job also spends `restore_seconds` (default 60) loading its checkpoint. An interrupted
  job keeps the progress of its last checkpoint (`checkpointed_progress`).

Randomness: the caller passes a seeded `random.Random` to every draw, so one seed reproduces a
whole simulation.
"""

from __future__ import annotations

import bisect
import itertools
import json
import math
import random
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field

from gpufleet.domain.catalog import (
    INTERRUPTION_BUCKETS,
    CapacityType,
    Catalog,
    Offering,
    load_bundled,
)
from gpufleet.domain.selection import hourly_hazard

SECONDS_PER_HOUR = 3600.0


class MarketConfig(BaseModel):
    """The market's knobs. Probabilities are per launch attempt."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    boot_seconds: float = Field(default=180, ge=0, description="Launch to job running")
    restore_seconds: float = Field(
        default=60, ge=0, description="Loading a checkpoint after a restart"
    )
    notice_seconds: float = Field(
        default=120, ge=0, description="Spot interruption warning before the instance stops"
    )
    hazard_scale: float = Field(
        default=1.0, ge=0, description="Multiplier on the Spot Advisor hourly hazard"
    )
    on_demand_launch_failure: float = Field(default=0.0, ge=0, le=1)
    spot_launch_failure: float = Field(default=0.05, ge=0, le=1)
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


class MarketModel:
    """Offerings, prices and random events of one region."""

    def __init__(
        self,
        catalog: Catalog | None = None,
        region: str = "us-east-1",
        config: MarketConfig | None = None,
        *,
        seed: int = 0,
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

    # --- Interruptions ------------------------------------------------------------------------

    def hazard_per_hour(self, offering: Offering) -> float:
        """Interruptions per instance-hour: 0 on-demand; the Spot Advisor hazard for spot."""
        if offering.capacity_type != "spot":
            return 0.0
        return hourly_hazard(offering.interruption_bucket) * self.config.hazard_scale

    def next_interruption(
        self, offering: Offering, start: float, rng: random.Random, instances: int = 1
    ) -> float | None:
        """When (seconds, same clock as `start`) the first of `instances` instances launched
        at `start` is interrupted; None if never (on-demand, or zero hazard)."""
        if instances < 1:
            raise ValueError("instances must be >= 1")
        rate = self.hazard_per_hour(offering) * instances / SECONDS_PER_HOUR
        if rate <= 0:
            return None
        return start + rng.expovariate(rate)

    # --- Capacity -----------------------------------------------------------------------------

    def launch_failure_probability(self, offering: Offering) -> float:
        """Chance that one launch attempt in the offering's pool fails for capacity."""
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
            return self.config.spot_launch_failure
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
        """Draw whether a launch attempt at `at` fails for lack of capacity."""
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


# --- Checking the hazard against measured preemptions ----------------------------------------

BAMBOO_DIR = Path("traces") / "aws-spot-preemption-bamboo"
SPOT_ADVISOR_2022_DIR = Path("spot-advisor") / "aws-spot-advisor-2022"
# Bamboo's 2021-12 event traces name the family only; the 2020-11 step traces the type.
_EVENT_TRACES: tuple[tuple[str, str], ...] = (
    ("ec2-2021-12/p3-trace.csv", "p3"),
    ("ec2-2021-12/g4dn-trace.csv", "g4dn"),
)
_STEP_TRACES: tuple[tuple[str, str], ...] = (
    (
        "ec2-2020-11/aws-spot-instances-g4dn-xlarge-us-east-1c-2020-11-20-1930-to-2020-11-21-2200.csv",
        "g4dn.xlarge",
    ),
    (
        "ec2-2020-11/aws-spot-instances-g4dn-xlarge-us-east-1d-2020-11-23-1730-to-2020-11-24-1530.csv",
        "g4dn.xlarge",
    ),
    (
        "ec2-2020-11/aws-spot-instances-p2-xlarge-us-east-1e-2020-11-23-1700-to-2020-11-24-0700.csv",
        "p2.xlarge",
    ),
)


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


def _event_trace(path: Path) -> tuple[float, float, int, int]:
    """(span h, instance-hours, removals, removal instants) of a `time_ms,add|remove,node` file."""
    events: list[tuple[float, str]] = []
    for line in path.read_text("utf-8").splitlines():
        if not line.strip():
            continue
        millis, action, _node = line.split(",")
        events.append((float(millis) / 1000.0, action.strip()))
    events.sort(key=lambda e: e[0])
    nodes, area, removals = 0, 0.0, 0
    instants: set[float] = set()
    prev = events[0][0]
    for t, action in events:
        area += nodes * (t - prev)
        prev = t
        if action == "add":
            nodes += 1
        elif action == "remove":
            nodes -= 1
            removals += 1
            instants.add(t)
        else:
            raise ValueError(f"{path}: unknown event {action!r}")
    return (events[-1][0] - events[0][0]) / 3600, area / 3600, removals, len(instants)


def _step_trace(path: Path) -> tuple[float, float, int, int]:
    """The same from a `seconds,running_instances` step file; every drop counts as preemption
    (the upstream repo does not say what caused them: inferred)."""
    points = [
        (float(t), int(c))
        for t, c in (ln.split(",") for ln in path.read_text("utf-8").splitlines() if ln.strip())
    ]
    area, drops, instants = 0.0, 0, 0
    for (t0, c0), (t1, c1) in itertools.pairwise(points):
        area += c0 * (t1 - t0)
        if c1 < c0:
            drops += c0 - c1
            instants += 1
    return (points[-1][0] - points[0][0]) / 3600, area / 3600, drops, instants


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
    for rel, family in _EVENT_TRACES:
        path = bamboo / rel
        if not path.is_file():
            continue
        members = {t.name for t in cat.instance_types() if t.family == family}
        members |= {name for name in advisor if name.split(".", 1)[0] == family}
        compare(rel, tuple(sorted(members)), _event_trace(path))
    for rel, type_name in _STEP_TRACES:
        path = bamboo / rel
        if path.is_file():
            compare(rel, (type_name,), _step_trace(path))
    return out
