"""The spot market as measured on EC2: preemption processes and pool availability over time.

Read at run time from the shared data folder (`../shared/data` next to the repository, or any
folder with the same layout); nothing here is bundled, because the SkyPilot traces carry no
licence (they may be read, not copied). Each folder's `SOURCE.md` gives origin, commit, licence.

- `traces/aws-spot-preemption-bamboo` (`uclasystem/bamboo` @ 8080929, MIT): EC2 spot fleets
  kept at a target size, 2021-12 p3 and g4dn (add/remove events), 2020-11 g4dn.xlarge and
  p2.xlarge (running-instance step files). Every removal counts as a preemption (the repo does
  not say why instances left; inferred). The 3-day p2 file is left out (its time unit is
  unclear) and so is GCP (not EC2).
- `traces/skypilot-spot-traces-nsdi24` (`skypilot-org/spot-traces` @ 221da1a, NSDI'24 "Can't
  Be Late"): `preemption/` holds instances kept by a 1- or 4-node spot request, sampled every
  32-300 s (a drop is a preemption; EC2 only: p3.2xlarge and r5.16xlarge); `availability/`
  holds how many of a 1- or 16-node request could be launched at each tick (p3.2xlarge,
  p3.16xlarge, p2.xlarge, p2.8xlarge in 9 zones, 13 to 45 days).

A preemption process is kept on its trace's *exposure clock*: the time during which the
measured fleet held at least one instance (when it held none, nothing could be preempted and
the trace says nothing about the hazard). At each preemption instant it records the share of
the held instances that were lost, so bursts (several instances at one instant) survive.
"""

from __future__ import annotations

import itertools
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from gpufleet.errors import NotFound

BAMBOO_DIR = Path("traces") / "aws-spot-preemption-bamboo"
SKYPILOT_DIR = Path("traces") / "skypilot-spot-traces-nsdi24"

# Every pool these processes were measured on was in the '>20%' Spot Advisor bucket in the
# snapshot nearest its measurement (2022-01-09 for Bamboo's p3, g4dn, p2; 2022-07-23 and
# 2024-02-28 for SkyPilot's p3.2xlarge and r5.16xlarge in us-east-1 and us-west-2).
MEASURED_BUCKET = 4

# Bamboo's 2021-12 event traces name the family only; the 2020-11 step traces the type.
BAMBOO_EVENT_TRACES: tuple[tuple[str, str], ...] = (
    ("ec2-2021-12/p3-trace.csv", "p3"),
    ("ec2-2021-12/g4dn-trace.csv", "g4dn"),
)
BAMBOO_STEP_TRACES: tuple[tuple[str, str], ...] = (
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

SizeClass = Literal["one-gpu", "multi-gpu"]
# SkyPilot's file names end in <gpu>_<gpus per instance>: v100_1 = p3.2xlarge, v100_8 =
# p3.16xlarge, k80_1 = p2.xlarge, k80_8 = p2.8xlarge.
_SIZE_OF_SUFFIX: dict[str, SizeClass] = {"1": "one-gpu", "8": "multi-gpu"}


class MeasuredDataMissing(NotFound, FileNotFoundError):
    """The measured traces a setting needs are not where they were looked for."""


@dataclass(frozen=True, slots=True)
class HeldSeries:
    """How many instances a measured fleet held: `counts[i]` from `times[i]` to `times[i+1]`
    (seconds). A decrease between two points is a preemption."""

    times: tuple[float, ...]
    counts: tuple[int, ...]

    def stats(self) -> tuple[float, float, int, int]:
        """(span h, instance-hours, instances lost, instants at which some were lost)."""
        area, lost, instants = 0.0, 0, set()
        for (t0, c0), (t1, c1) in itertools.pairwise(zip(self.times, self.counts, strict=True)):
            area += c0 * (t1 - t0)
            if c1 < c0:
                lost += c0 - c1
                instants.add(t1)
        span = (self.times[-1] - self.times[0]) / 3600 if self.times else 0.0
        return span, area / 3600, lost, len(instants)


def event_series(path: Path) -> HeldSeries:
    """A `time_ms,add|remove,node` file (Bamboo 2021-12) as a held series."""
    events: list[tuple[float, int]] = []
    for line in path.read_text("utf-8").splitlines():
        if not line.strip():
            continue
        millis, action, _node = line.split(",")
        kind = action.strip()
        if kind not in ("add", "remove"):
            raise ValueError(f"{path}: unknown event {kind!r}")
        events.append((float(millis) / 1000.0, 1 if kind == "add" else -1))
    events.sort(key=lambda e: e[0])  # stable: events at one instant keep the file's order
    times, counts, held = [], [], 0
    for t, delta in events:
        held += delta
        times.append(t)
        counts.append(held)
    return HeldSeries(tuple(times), tuple(counts))


def step_series(path: Path) -> HeldSeries:
    """A `seconds,running_instances` file (Bamboo 2020-11; pairs of rows draw the steps)."""
    points = [
        (float(t), int(c))
        for t, c in (ln.split(",") for ln in path.read_text("utf-8").splitlines() if ln.strip())
    ]
    return HeldSeries(tuple(t for t, _ in points), tuple(c for _, c in points))


def tick_series(path: Path) -> tuple[HeldSeries, float]:
    """A SkyPilot `{"metadata": {"gap_seconds": g}, "data": [...]}` file: (series, g)."""
    doc = json.loads(path.read_text("utf-8"))
    gap = float(doc["metadata"]["gap_seconds"])
    values = [int(v) for v in doc["data"]]
    if gap <= 0 or not values:
        raise ValueError(f"{path}: no samples")
    return HeldSeries(tuple(i * gap for i in range(len(values))), tuple(values)), gap


@dataclass(frozen=True, slots=True)
class PreemptionProcess:
    """One measured preemption process on its exposure clock (see the module doc)."""

    source: str  # path under the shared data folder
    period_seconds: float  # exposure time: the measured fleet held at least one instance
    instants: tuple[float, ...]  # sorted positions on the exposure clock, in [0, period)
    fractions: tuple[float, ...]  # share of the held instances lost at each instant, (0, 1]
    bucket: int = MEASURED_BUCKET

    @classmethod
    def from_series(cls, source: str, series: HeldSeries) -> PreemptionProcess:
        exposure = 0.0
        lost: dict[float, float] = {}  # exposure position -> share surviving
        points = list(zip(series.times, series.counts, strict=True))
        for (t0, c0), (t1, c1) in itertools.pairwise(points):
            if c0 > 0:
                exposure += t1 - t0
                if c1 < c0:
                    lost[exposure] = lost.get(exposure, 1.0) * max(c1, 0) / c0
        if exposure <= 0 or not lost:
            raise ValueError(f"{source}: no preemption while instances were held")
        ordered = sorted((pos % exposure, 1.0 - kept) for pos, kept in lost.items())
        return cls(
            source=source,
            period_seconds=exposure,
            instants=tuple(pos for pos, _ in ordered),
            fractions=tuple(share for _, share in ordered),
        )

    @property
    def per_instance_hour(self) -> float:
        """Expected preemptions of one instance per hour held (sum of shares / exposure)."""
        return sum(self.fractions) * 3600 / self.period_seconds


@dataclass(frozen=True, slots=True)
class AvailabilityTrace:
    """How much of a spot request could be launched at each tick of one measured pool."""

    source: str
    size_class: SizeClass  # the measured instance: one GPU, or eight
    gap_seconds: float
    requested: int  # instances asked for at each tick (1 or 16)
    available: tuple[int, ...]  # instances launchable at each tick, 0..requested

    @property
    def period_seconds(self) -> float:
        return self.gap_seconds * len(self.available)

    def share(self, seconds: float) -> float:
        """The launchable share of the request at `seconds` into the trace (cyclic)."""
        tick = int(seconds // self.gap_seconds) % len(self.available)
        return self.available[tick] / self.requested

    @property
    def mean_share(self) -> float:
        return sum(self.available) / (self.requested * len(self.available))


@dataclass(frozen=True, slots=True)
class MeasuredSpot:
    """What the measured market replays: preemption processes and availability traces (either
    may be empty when the setting that needs it is off)."""

    root: Path
    preemption: tuple[PreemptionProcess, ...] = ()
    availability: tuple[AvailabilityTrace, ...] = ()

    def availability_of(self, size_class: SizeClass) -> tuple[AvailabilityTrace, ...]:
        return tuple(a for a in self.availability if a.size_class == size_class)


def _require(path: Path, what: str) -> Path:
    if not path.exists():
        raise MeasuredDataMissing(
            f"{what} needs the measured spot traces at {path}, which does not exist. Check out "
            "the shared data folder next to the repository (../shared/data, with "
            f"{BAMBOO_DIR} and {SKYPILOT_DIR}) or pass --data DIR; or run with "
            "--interruptions advisor --spot-capacity unlimited, which need no data."
        )
    return path


def _files(root: Path, pattern: str) -> list[Path]:
    return sorted(p for p in root.glob(pattern) if p.is_file())


def load_preemption(data_dir: str | Path) -> tuple[PreemptionProcess, ...]:
    """Every EC2 preemption process of Bamboo and SkyPilot (see the module doc)."""
    root = Path(data_dir)
    what = "--interruptions measured"
    bamboo = _require(root / BAMBOO_DIR, what)
    skypilot = _require(root / SKYPILOT_DIR / "preemption", what)
    out: list[PreemptionProcess] = []
    for rel, _family in BAMBOO_EVENT_TRACES:
        path = _require(bamboo / rel, what)
        out.append(PreemptionProcess.from_series(str(BAMBOO_DIR / rel), event_series(path)))
    for rel, _type in BAMBOO_STEP_TRACES:
        path = _require(bamboo / rel, what)
        out.append(PreemptionProcess.from_series(str(BAMBOO_DIR / rel), step_series(path)))
    sky = _files(skypilot, "*/aws-*/*.json")
    if not sky:
        raise MeasuredDataMissing(f"{what}: no EC2 preemption traces under {skypilot}")
    for path in sky:
        series, _gap = tick_series(path)
        out.append(PreemptionProcess.from_series(str(path.relative_to(root)), series))
    return tuple(out)


def load_availability(data_dir: str | Path) -> tuple[AvailabilityTrace, ...]:
    """Every EC2 availability trace of SkyPilot, with its size class and request size."""
    root = Path(data_dir)
    what = "--spot-capacity finite"
    folder = _require(root / SKYPILOT_DIR / "availability", what)
    out: list[AvailabilityTrace] = []
    for path in _files(folder, "*-node/aws-*/*.json"):
        requested = int(path.parent.parent.name.split("-", 1)[0])
        size = _SIZE_OF_SUFFIX.get(path.stem.rsplit("_", 1)[-1])
        if size is None:
            continue  # not a GPU request we can place (none today)
        series, gap = tick_series(path)
        out.append(
            AvailabilityTrace(
                source=str(path.relative_to(root)),
                size_class=size,
                gap_seconds=gap,
                requested=requested,
                available=tuple(min(max(c, 0), requested) for c in series.counts),
            )
        )
    if {a.size_class for a in out} != set(_SIZE_OF_SUFFIX.values()):
        raise MeasuredDataMissing(f"{what}: no one- and eight-GPU availability traces in {folder}")
    return tuple(out)


def load_measured(data_dir: str | Path, *, preemption: bool, availability: bool) -> MeasuredSpot:
    """The parts of the measured market the settings use; MeasuredDataMissing, with what is
    needed and where, when a part is absent."""
    return MeasuredSpot(
        root=Path(data_dir),
        preemption=load_preemption(data_dir) if preemption else (),
        availability=load_availability(data_dir) if availability else (),
    )


def describe(measured: MeasuredSpot) -> dict[str, object]:
    """A short summary for the JSON and the report: rates and availability of each trace."""
    return {
        "data": str(measured.root),
        "preemption": {
            p.source: {
                "per_instance_hour": round(p.per_instance_hour, 3),
                "exposure_hours": round(p.period_seconds / 3600, 1),
                "instants": len(p.instants),
            }
            for p in measured.preemption
        },
        "availability": {
            a.source: {"size": a.size_class, "mean_share": round(a.mean_share, 3)}
            for a in measured.availability
        },
    }
