"""A run's usage on one node: the layout of `runs/<job>/usage/<instance>.json`.

The node agent (`agent/usage.py`) writes it, a sample each minute, beside the run's manifest
(one S3 object per run and node, never in the job's DynamoDB item); `gpufleet status`,
`gpufleet report` and `gpufleet review` read it. Standard library only: the agent runs it on the
instance, without the control plane's dependencies.

The document is columnar and compact (whole numbers, times as offsets from `t0`):

    {"v": 1, "job": "j-...", "instance": "i-...", "interval": 60, "t0": 1764672000.0,
     "gpu_mem_total": [81559, ...],          # MiB per GPU
     "host_mem_total": 2097152,              # MiB
     "t": [0, 60, ...],                      # seconds after t0, one per sample
     "gpu_util": [[97, 95, ...], ...],       # percent, per sample and GPU
     "gpu_mem": [[70211, 70188, ...], ...],  # MiB used, per sample and GPU
     "cpu": [41, ...], "mem": [180233, ...], # host CPU percent and memory used (MiB)
     "events": [[0, "started"], [3600, "checkpoint"], ...]}

A value the node could not read is null. A document holds at most MAX_SAMPLES samples: past
that, neighbouring samples are merged (their peaks kept) and the interval doubles, so a run of
any length stays a few hundred kilobytes.
"""

from __future__ import annotations

import itertools
import json
import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field, replace
from typing import cast

from gpufleet.errors import RefusedInput

LAYOUT_VERSION = 1
USAGE_DIR = "usage"
# Two weeks at a minute; a longer run's samples are merged pairwise.
MAX_SAMPLES = 20160
# A GPU below this utilization is idle (what `gpufleet review` counts as held while idle).
IDLE_UTILIZATION_PERCENT = 5.0

# The agent's timeline marks, in the order a run goes through them.
EVENT_STARTED = "started"
EVENT_CHECKPOINT = "checkpoint"
EVENT_INTERRUPTED = "interrupted"
EVENT_FINISHED = "finished"
EVENTS = (EVENT_STARTED, EVENT_CHECKPOINT, EVENT_INTERRUPTED, EVENT_FINISHED)


class UsageLayoutError(RefusedInput, ValueError):
    """A usage document that is not in this layout (still a ValueError for the agent's readers)."""


def usage_prefix(runs_prefix: str, job_id: str) -> str:
    return f"{runs_prefix}{job_id}/{USAGE_DIR}/"


def usage_key(runs_prefix: str, job_id: str, instance_id: str) -> str:
    return f"{usage_prefix(runs_prefix, job_id)}{instance_id}.json"


@dataclass(frozen=True)
class Sample:
    t: float  # epoch seconds
    gpu_util: tuple[float | None, ...] = ()  # percent, per GPU
    gpu_mem_mib: tuple[float | None, ...] = ()  # used, per GPU
    cpu_percent: float | None = None
    mem_mib: float | None = None


@dataclass(frozen=True)
class NodeUsage:
    """What one node of a run used, sample by sample, and the agent's marks on its timeline."""

    job_id: str
    instance_id: str
    interval_seconds: float = 60.0
    gpu_mem_total_mib: tuple[float, ...] = ()
    host_mem_total_mib: float | None = None
    samples: tuple[Sample, ...] = ()
    events: tuple[tuple[float, str], ...] = ()  # (epoch seconds, one of EVENTS)

    def with_sample(self, sample: Sample) -> NodeUsage:
        samples = (*self.samples, sample)
        interval = self.interval_seconds
        if len(samples) > MAX_SAMPLES:
            samples = tuple(_merged(samples[i : i + 2]) for i in range(0, len(samples), 2))
            interval *= 2
        return replace(self, samples=samples, interval_seconds=interval)

    def with_event(self, t: float, name: str) -> NodeUsage:
        if name not in EVENTS:
            raise UsageLayoutError(f"unknown usage event {name!r}")
        return replace(self, events=(*self.events, (t, name)))

    def to_json(self) -> bytes:
        t0 = self.samples[0].t if self.samples else (self.events[0][0] if self.events else 0.0)
        document = {
            "v": LAYOUT_VERSION,
            "job": self.job_id,
            "instance": self.instance_id,
            "interval": self.interval_seconds,
            "t0": t0,
            "gpu_mem_total": [_whole(v) for v in self.gpu_mem_total_mib],
            "host_mem_total": _whole(self.host_mem_total_mib),
            "t": [_whole(s.t - t0) for s in self.samples],
            "gpu_util": [[_whole(v) for v in s.gpu_util] for s in self.samples],
            "gpu_mem": [[_whole(v) for v in s.gpu_mem_mib] for s in self.samples],
            "cpu": [_whole(s.cpu_percent) for s in self.samples],
            "mem": [_whole(s.mem_mib) for s in self.samples],
            "events": [[_whole(t - t0), name] for t, name in self.events],
        }
        return json.dumps(document, separators=(",", ":")).encode()

    @classmethod
    def from_json(cls, raw: bytes) -> NodeUsage:
        """The document `raw`; UsageLayoutError when it is not one of this layout."""
        c = _Columns.read(raw)
        # Each column checked whole (a review reads millions of samples): the rows are built
        # without checking each value again.
        samples = tuple(
            Sample(
                t=c.t0 + offset,
                gpu_util=tuple(gpu_util),
                gpu_mem_mib=tuple(gpu_mem),
                cpu_percent=cpu_percent,
                mem_mib=mem_mib,
            )
            for offset, gpu_util, gpu_mem, cpu_percent, mem_mib in zip(
                c.offsets, c.gpu_util, c.gpu_mem, c.cpu, c.mem, strict=True
            )
        )
        return cls(
            job_id=c.job_id,
            instance_id=c.instance_id,
            interval_seconds=c.interval_seconds,
            gpu_mem_total_mib=c.gpu_mem_total_mib,
            host_mem_total_mib=c.host_mem_total_mib,
            samples=samples,
            events=c.events,
        )

    def summarized(self) -> NodeSummary:
        samples = self.samples
        return NodeSummary(
            job_id=self.job_id,
            instance_id=self.instance_id,
            usage=_summary_of(
                [s.gpu_util for s in samples],
                [s.gpu_mem_mib for s in samples],
                [s.cpu_percent for s in samples],
                [s.mem_mib for s in samples],
                self.gpu_mem_total_mib,
                self.host_mem_total_mib,
            ),
            events=self.events,
        )


@dataclass(frozen=True)
class _Columns:
    """A usage document's fields, each column checked whole."""

    job_id: str
    instance_id: str
    interval_seconds: float
    gpu_mem_total_mib: tuple[float, ...]
    host_mem_total_mib: float | None
    t0: float
    offsets: list[float]
    gpu_util: list[list[float | None]]
    gpu_mem: list[list[float | None]]
    cpu: list[float | None]
    mem: list[float | None]
    events: tuple[tuple[float, str], ...]

    @classmethod
    def read(cls, raw: bytes) -> _Columns:
        """The columns of the document `raw`; UsageLayoutError when it is not of this layout."""
        try:
            # NaN and Infinity refused as they are read: every number left is finite.
            document = json.loads(raw, parse_constant=_not_finite)
            if not isinstance(document, dict) or document.get("v") != LAYOUT_VERSION:
                raise UsageLayoutError(f"not a usage document of layout {LAYOUT_VERSION}")
            t0 = _number(document["t0"])
            offsets = _numbers(document["t"])
            columns = [document[name] for name in ("gpu_util", "gpu_mem", "cpu", "mem")]
            if any(not isinstance(c, list) or len(c) != len(offsets) for c in columns):
                raise UsageLayoutError("the usage columns differ in length")
            util, mem, cpu, host = columns
            _check_rows(util)
            _check_rows(mem)
            _check_optional(cpu)
            _check_optional(host)
            return cls(
                job_id=str(document["job"]),
                instance_id=str(document["instance"]),
                interval_seconds=_number(document["interval"]),
                gpu_mem_total_mib=tuple(_number(v) for v in document["gpu_mem_total"]),
                host_mem_total_mib=_optional(document["host_mem_total"]),
                t0=t0,
                offsets=offsets,
                gpu_util=util,
                gpu_mem=mem,
                cpu=cpu,
                mem=host,
                events=tuple((t0 + _number(t), str(name)) for t, name in document["events"]),
            )
        except UsageLayoutError:
            raise
        except (ValueError, KeyError, TypeError) as exc:
            raise UsageLayoutError(f"not a usage document: {exc!r}") from exc


@dataclass(frozen=True)
class Stat:
    """The peak and mean of known values; their total and count kept so that several nodes'
    combine into the stat of all their values."""

    peak: float | None = None
    total: float = 0
    count: int = 0

    @property
    def mean(self) -> float | None:
        return self.total / self.count if self.count else None

    @classmethod
    def of(cls, values: Iterable[float | None]) -> Stat:
        return cls._of_known([v for v in values if v is not None])

    @classmethod
    def _of_known(cls, known: list[float]) -> Stat:
        if not known:
            return cls()
        return cls(peak=max(known), total=sum(known), count=len(known))

    @classmethod
    def combined(cls, stats: Iterable[Stat]) -> Stat:
        stats = [s for s in stats if s.count]
        if not stats:
            return cls()
        return cls(
            peak=max(s.peak for s in stats if s.peak is not None),
            total=sum(s.total for s in stats),
            count=sum(s.count for s in stats),
        )


@dataclass(frozen=True)
class UsageSummary:
    """Peaks and means over a run's nodes: GPU utilization (a GPU's, each sample), GPU memory
    used (the fullest GPU's), host CPU and memory; and the share of GPU samples that were
    idle (below IDLE_UTILIZATION_PERCENT)."""

    nodes: int = 0
    samples: int = 0
    gpu_util_percent: Stat = field(default_factory=Stat)
    gpu_mem_mib: Stat = field(default_factory=Stat)
    gpu_mem_total_mib: float | None = None
    cpu_percent: Stat = field(default_factory=Stat)
    host_mem_mib: Stat = field(default_factory=Stat)
    host_mem_total_mib: float | None = None
    idle_gpu_samples: int = 0  # GPU samples below IDLE_UTILIZATION_PERCENT

    @property
    def idle_fraction(self) -> float | None:
        count = self.gpu_util_percent.count
        return self.idle_gpu_samples / count if count else None

    def as_dict(self) -> dict[str, float | int | None]:
        def rounded(value: float | None) -> float | None:
            return None if value is None else round(value, 1)

        out: dict[str, float | int | None] = {"nodes": self.nodes, "samples": self.samples}
        for name, stat in (
            ("gpu_util_percent", self.gpu_util_percent),
            ("gpu_mem_mib", self.gpu_mem_mib),
            ("cpu_percent", self.cpu_percent),
            ("host_mem_mib", self.host_mem_mib),
        ):
            out[f"{name}_peak"] = rounded(stat.peak)
            out[f"{name}_mean"] = rounded(stat.mean)
        out["gpu_mem_total_mib"] = rounded(self.gpu_mem_total_mib)
        out["host_mem_total_mib"] = rounded(self.host_mem_total_mib)
        out["gpu_idle_fraction"] = (
            None if self.idle_fraction is None else round(self.idle_fraction, 3)
        )
        return out


@dataclass(frozen=True)
class NodeSummary:
    """What the review reads of one node's usage: its summary and its timeline's marks, without
    the samples (a month's review reads millions of them)."""

    job_id: str
    instance_id: str
    usage: UsageSummary = field(default_factory=UsageSummary)
    events: tuple[tuple[float, str], ...] = ()

    @classmethod
    def from_json(cls, raw: bytes) -> NodeSummary:
        """The summary of the document `raw`, checked as `NodeUsage.from_json` checks it."""
        c = _Columns.read(raw)
        return cls(
            job_id=c.job_id,
            instance_id=c.instance_id,
            usage=_summary_of(
                c.gpu_util, c.gpu_mem, c.cpu, c.mem, c.gpu_mem_total_mib, c.host_mem_total_mib
            ),
            events=c.events,
        )


def summarize(nodes: Sequence[NodeUsage]) -> UsageSummary:
    return combined(node.summarized().usage for node in nodes)


def combined(summaries: Iterable[UsageSummary]) -> UsageSummary:
    """The summary of several nodes' usage: the stats of all their values, the smallest
    totals (what a type sized for every node must hold)."""
    summaries = list(summaries)
    totals = [s.gpu_mem_total_mib for s in summaries if s.gpu_mem_total_mib is not None]
    hosts = [s.host_mem_total_mib for s in summaries if s.host_mem_total_mib is not None]
    return UsageSummary(
        nodes=sum(s.nodes for s in summaries),
        samples=sum(s.samples for s in summaries),
        gpu_util_percent=Stat.combined(s.gpu_util_percent for s in summaries),
        gpu_mem_mib=Stat.combined(s.gpu_mem_mib for s in summaries),
        gpu_mem_total_mib=min(totals) if totals else None,
        cpu_percent=Stat.combined(s.cpu_percent for s in summaries),
        host_mem_mib=Stat.combined(s.host_mem_mib for s in summaries),
        host_mem_total_mib=min(hosts) if hosts else None,
        idle_gpu_samples=sum(s.idle_gpu_samples for s in summaries),
    )


def _summary_of(
    gpu_util: Sequence[Sequence[float | None]],
    gpu_mem: Sequence[Sequence[float | None]],
    cpu: Sequence[float | None],
    host_mem: Sequence[float | None],
    gpu_mem_total: Sequence[float],
    host_mem_total: float | None,
) -> UsageSummary:
    """One node's summary, from its columns (a row per sample, a value per GPU)."""
    utils = [v for v in itertools.chain.from_iterable(gpu_util) if v is not None]
    fullest = [_peak(row) for row in gpu_mem]
    return UsageSummary(
        nodes=1,
        samples=len(gpu_util),
        gpu_util_percent=Stat._of_known(utils),
        gpu_mem_mib=Stat.of(fullest),
        gpu_mem_total_mib=min(gpu_mem_total) if gpu_mem_total else None,
        cpu_percent=Stat.of(cpu),
        host_mem_mib=Stat.of(host_mem),
        host_mem_total_mib=host_mem_total,
        idle_gpu_samples=sum(1 for v in utils if v < IDLE_UTILIZATION_PERCENT),
    )


def _peak(values: Sequence[float | None]) -> float | None:
    """The largest known value (None when none is known); most rows have no null."""
    if values and None not in values:
        return max(cast(Sequence[float], values))
    return max((v for v in values if v is not None), default=None)


def _merged(pair: Sequence[Sample]) -> Sample:
    """Two neighbouring samples as one: the first's time, each value's peak."""
    first = pair[0]
    width = max(len(s.gpu_util) for s in pair)
    mem_width = max(len(s.gpu_mem_mib) for s in pair)
    return Sample(
        t=first.t,
        gpu_util=tuple(_peak([_at(s.gpu_util, i) for s in pair]) for i in range(width)),
        gpu_mem_mib=tuple(_peak([_at(s.gpu_mem_mib, i) for s in pair]) for i in range(mem_width)),
        cpu_percent=_peak([s.cpu_percent for s in pair]),
        mem_mib=_peak([s.mem_mib for s in pair]),
    )


def _at(values: Sequence[float | None], index: int) -> float | None:
    return values[index] if index < len(values) else None


def _whole(value: float | None) -> int | None:
    return None if value is None else round(value)


def _number(value: object) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise UsageLayoutError(f"{value!r} is not a number")
    number = float(value)
    if not math.isfinite(number):
        raise UsageLayoutError(f"{value!r} is not finite")
    return number


def _optional(value: object) -> float | None:
    return None if value is None else _number(value)


# What a column of a document read with `_not_finite` may hold (bool is not int here).
_OPTIONAL_NUMBER = frozenset({int, float, type(None)})
_NUMBER = frozenset({int, float})


def _not_finite(name: str) -> float:
    raise UsageLayoutError(f"{name} is not finite")


def _check_optional(values: Iterable[object]) -> None:
    """Every value a number or null: the set of their types, built in C, for the thousands a
    document holds."""
    values = list(values)
    if not set(map(type, values)) <= _OPTIONAL_NUMBER:
        bad = next(v for v in values if type(v) not in _OPTIONAL_NUMBER)
        raise UsageLayoutError(f"{bad!r} is not a number")


def _check_rows(rows: list[list[object]]) -> None:
    """Every row a list of numbers or nulls (a sample's value per GPU)."""
    if not all(type(row) is list for row in rows):
        bad = next(row for row in rows if type(row) is not list)
        raise UsageLayoutError(f"{bad!r} is not a list of numbers")
    _check_optional(itertools.chain.from_iterable(rows))


def _numbers(values: object) -> list[float]:
    """A list of finite numbers, as floats."""
    if not isinstance(values, list) or not set(map(type, values)) <= _NUMBER:
        raise UsageLayoutError(f"{values!r} is not a list of numbers")
    numbers = list(map(float, values))
    if not all(map(math.isfinite, numbers)):
        raise UsageLayoutError("a time is not finite")
    return numbers
