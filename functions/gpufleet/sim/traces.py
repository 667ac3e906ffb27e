"""Loaders for the real cluster traces the simulator replays.

Three formats, each read from the files as published (see each folder's SOURCE.md under
`../shared/data/traces`); every loader yields `TraceJob`s with times in seconds relative to the
trace's start:

- `philly`: Microsoft Philly 2017, the Pollux authors' per-job CSV `philly.csv`
  (`timestamp,duration,num_gpus,gpu_time,cluster`). No job id in the file: the id is
  `philly-NNNNN`, the 1-based data row. Trace start = the earliest `timestamp` in the file
  (a naive local wall-clock string; `Trace.origin` keeps it). Team = the virtual cluster hash.
- `itp`: Microsoft ITP 2021 (ElasticFlow raw traces), `clusterNN.csv`
  (`job_id,submission_time,duration,num_gpu`). A directory reads every `cluster*.csv` in it;
  a file reads one cluster. Times are already relative to the collection window start
  (2021-03-04, shared by all clusters). Team = the file's stem (`cluster04`).
- `openb`: Alibaba GPU-sharing cluster 2023, `openb_pod_list_default.csv`. Submit =
  `creation_time`; duration = `deletion_time - scheduled_time` (run time; a pod still
  `Running` at deletion ran until then); the QoS class and final phase are kept as hints.
  GPUs: `num_gpu` whole GPUs; a fractional request (`num_gpu == 1`, `gpu_milli < 1000`) is
  rounded up to one whole GPU (EC2 sells whole GPUs; selection never picks the fractional
  g6f/gr6f types), and `gpu_milli` keeps the original share. Pods that were never scheduled
  (`Pending`, no `scheduled_time`: no run time to replay) are skipped; CPU-only pods
  (`num_gpu == 0`) are skipped unless `include_cpu_only=True`. No team column: team is None.

`load_trace` returns a `Trace`: the jobs in the window, sorted by (submit time, id), and the
number of rows skipped for each reason.
"""

from __future__ import annotations

import csv
import math
from collections import Counter
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Literal, get_args

from gpufleet.errors import RefusedInput

TraceFormat = Literal["philly", "itp", "openb"]
FORMATS: tuple[TraceFormat, ...] = get_args(TraceFormat)

SECONDS_PER_DAY = 86400.0

PHILLY_FILE = "philly.csv"
ITP_GLOB = "cluster*.csv"
OPENB_FILE = "openb_pod_list_default.csv"

# Skip reasons reported in `Trace.skipped`.
SKIP_NONPOSITIVE_DURATION = "nonpositive_duration"
SKIP_NEVER_SCHEDULED = "never_scheduled"
SKIP_CPU_ONLY = "cpu_only"


class TraceError(RefusedInput, ValueError):
    """A trace file is missing, of the wrong format, or has a malformed row."""


@dataclass(frozen=True, slots=True)
class RunExit:
    """How a run that ended by itself (not interrupted, not stopped) ended: its container's
    exit code, and whether it died of GPU out-of-memory."""

    exit_code: int
    oom: bool = False


@dataclass(frozen=True, slots=True)
class TraceJob:
    """One job (or pod) of a trace, as the trace records it."""

    job_id: str
    submit_seconds: float  # since the trace's start (see the module doc for each format)
    duration_seconds: float  # run time, > 0
    gpus: int  # whole GPUs in total (all nodes); openb fractional requests rounded up
    team: str | None = None  # Philly virtual cluster, ITP cluster; None for openb
    qos: str | None = None  # openb QoS class: LS, BE, Burstable, Guaranteed
    status: str | None = None  # openb final pod phase: Running, Succeeded, Failed
    gpu_milli: int | None = None  # openb: the requested share of one GPU when fractional
    cpu_milli: int | None = None  # openb: requested CPU, milli-cores
    memory_mib: int | None = None  # openb: requested memory, MiB
    trace_wait_seconds: float | None = None  # openb: scheduled - created in the real cluster
    # How the job's first runs that reach their end end, in order (each after the run's full
    # duration); every later one exits 0. The trace formats give none: a run there succeeds
    # (openb's Failed phase is not read as one).
    failed_runs: tuple[RunExit, ...] = ()

    @property
    def end_seconds(self) -> float:
        """When the job would finish if it started at submit (no queueing)."""
        return self.submit_seconds + self.duration_seconds


@dataclass(frozen=True, slots=True)
class Trace:
    """The jobs of a trace window, sorted by (submit time, job id)."""

    fmt: TraceFormat
    source: str
    jobs: tuple[TraceJob, ...]
    # Wall-clock time of `submit_seconds == 0` when the trace gives it (Philly: naive local
    # time of its first submission); None otherwise.
    origin: datetime | None
    window_start_seconds: float
    window_end_seconds: float | None
    skipped: Mapping[str, int] = field(default_factory=dict)

    def __iter__(self) -> Iterator[TraceJob]:
        return iter(self.jobs)

    def __len__(self) -> int:
        return len(self.jobs)

    @property
    def gpu_hours(self) -> float:
        return sum(j.gpus * j.duration_seconds for j in self.jobs) / 3600.0


# --- Row parsing helpers ----------------------------------------------------------------------


def _open_rows(path: Path, header: tuple[str, ...]) -> Iterator[list[str]]:
    """Data rows of a CSV whose first line must start with `header`."""
    try:
        fh = path.open(newline="", encoding="utf-8")
    except OSError as exc:
        raise TraceError(f"cannot read trace file {path}: {exc.strerror or exc}") from None
    with fh:
        reader = csv.reader(fh)
        first = next(reader, None)
        if first is None or tuple(c.strip() for c in first[: len(header)]) != header:
            raise TraceError(
                f"{path}: expected a CSV header starting with {','.join(header)}, got "
                f"{','.join(first or []) or 'an empty file'}"
            )
        for row in reader:
            if row:  # a trailing blank line
                yield row


def _bad_row(path: Path, line: int, row: list[str], exc: Exception) -> TraceError:
    return TraceError(f"{path}:{line}: malformed row {','.join(row)!r}: {exc}")


def _resolve(path: Path, filename: str) -> Path:
    """`path` itself, or `path/filename` when `path` is a directory."""
    if path.is_dir():
        path = path / filename
    if not path.is_file():
        raise TraceError(f"trace file not found: {path}")
    return path


# --- Philly -----------------------------------------------------------------------------------

_PHILLY_HEADER = ("timestamp", "duration", "num_gpus", "gpu_time", "cluster")
_NAIVE_EPOCH = datetime(1970, 1, 1)


def read_philly(
    path: str | Path, skipped: Counter[str] | None = None
) -> tuple[list[TraceJob], datetime]:
    """Every job of the Philly CSV (file order) and the trace's origin (first submission)."""
    file = _resolve(Path(path), PHILLY_FILE)
    parsed: list[tuple[str, float, int, str]] = []
    stamps: dict[str, float] = {}
    origin_text: str | None = None
    for line, row in enumerate(_open_rows(file, _PHILLY_HEADER), start=2):
        try:
            stamp, duration, gpus, cluster = row[0], float(row[1]), int(row[2]), row[4]
            if stamp not in stamps:
                # Naive wall-clock arithmetic: no time zone, no DST, same on every machine.
                stamps[stamp] = (datetime.fromisoformat(stamp) - _NAIVE_EPOCH).total_seconds()
        except (IndexError, ValueError) as exc:
            raise _bad_row(file, line, row, exc) from None
        if origin_text is None or stamp < origin_text:  # fixed-width ISO strings sort as times
            origin_text = stamp
        parsed.append((stamp, duration, gpus, cluster))
    if origin_text is None:
        raise TraceError(f"{file}: no jobs")
    origin = datetime.fromisoformat(origin_text)
    zero = stamps[origin_text]
    jobs = []
    for index, (stamp, duration, gpus, cluster) in enumerate(parsed, start=1):
        if not duration > 0:
            _count(skipped, SKIP_NONPOSITIVE_DURATION)
            continue
        jobs.append(
            TraceJob(
                job_id=f"philly-{index:05d}",
                submit_seconds=stamps[stamp] - zero,
                duration_seconds=duration,
                gpus=gpus,
                team=cluster or None,
            )
        )
    return jobs, origin


# --- ITP --------------------------------------------------------------------------------------

_ITP_HEADER = ("job_id", "submission_time", "duration", "num_gpu")


def read_itp(path: str | Path, skipped: Counter[str] | None = None) -> Iterator[TraceJob]:
    """Jobs of one ITP cluster file, or of every `cluster*.csv` in a directory."""
    root = Path(path)
    files = sorted(root.glob(ITP_GLOB)) if root.is_dir() else [root]
    if not files or not files[0].is_file():
        raise TraceError(f"no ITP cluster files ({ITP_GLOB}) at {root}")
    for file in files:
        team = file.stem
        for line, row in enumerate(_open_rows(file, _ITP_HEADER), start=2):
            try:
                job_id, submit, duration, gpus = row[0], float(row[1]), float(row[2]), int(row[3])
            except (IndexError, ValueError) as exc:
                raise _bad_row(file, line, row, exc) from None
            if not duration > 0:
                _count(skipped, SKIP_NONPOSITIVE_DURATION)
                continue
            yield TraceJob(
                job_id=job_id,
                submit_seconds=submit,
                duration_seconds=duration,
                gpus=gpus,
                team=team,
            )


# --- openb ------------------------------------------------------------------------------------

_OPENB_HEADER = (
    "name",
    "cpu_milli",
    "memory_mib",
    "num_gpu",
    "gpu_milli",
    "gpu_spec",
    "qos",
    "pod_phase",
    "creation_time",
    "deletion_time",
    "scheduled_time",
)


def read_openb(
    path: str | Path,
    skipped: Counter[str] | None = None,
    *,
    include_cpu_only: bool = False,
) -> Iterator[TraceJob]:
    """Scheduled pods of the openb default pod list (see the module doc for the rules)."""
    file = _resolve(Path(path), OPENB_FILE)
    for line, row in enumerate(_open_rows(file, _OPENB_HEADER), start=2):
        try:
            name, qos, phase = row[0], row[6], row[7]
            cpu_milli, memory_mib = int(row[1]), int(row[2])
            num_gpu, gpu_milli = int(row[3]), int(row[4] or 0)
            created, deleted = float(row[8]), float(row[9])
            scheduled = float(row[10]) if row[10] else None
        except (IndexError, ValueError) as exc:
            raise _bad_row(file, line, row, exc) from None
        if scheduled is None:
            _count(skipped, SKIP_NEVER_SCHEDULED)
            continue
        if num_gpu == 0 and not include_cpu_only:
            _count(skipped, SKIP_CPU_ONLY)
            continue
        duration = deleted - scheduled
        if not duration > 0:
            _count(skipped, SKIP_NONPOSITIVE_DURATION)
            continue
        fractional = num_gpu == 1 and 0 < gpu_milli < 1000
        yield TraceJob(
            job_id=name,
            submit_seconds=created,
            duration_seconds=duration,
            gpus=num_gpu,  # a fractional share of one GPU is one whole GPU (ceil)
            team=None,
            qos=qos or None,
            status=phase or None,
            gpu_milli=gpu_milli if fractional else None,
            cpu_milli=cpu_milli,
            memory_mib=memory_mib,
            trace_wait_seconds=scheduled - created,
        )


# --- Windows ----------------------------------------------------------------------------------


def _count(skipped: Counter[str] | None, reason: str) -> None:
    if skipped is not None:
        skipped[reason] += 1


def _window(
    jobs: Iterable[TraceJob], start_days: float, days: float | None
) -> tuple[list[TraceJob], float, float | None]:
    lo = start_days * SECONDS_PER_DAY
    hi = None if days is None else lo + days * SECONDS_PER_DAY
    if hi is None:
        kept = [j for j in jobs if j.submit_seconds >= lo]
    else:
        kept = [j for j in jobs if lo <= j.submit_seconds < hi]
    kept.sort(key=lambda j: (j.submit_seconds, j.job_id))
    return kept, lo, hi


def load_trace(
    path: str | Path,
    fmt: TraceFormat | str,
    start_days: float = 0,
    days: float | None = None,
    *,
    include_cpu_only: bool = False,
) -> Trace:
    """The jobs submitted in [start_days, start_days + days) days after the trace's start.

    `days=None` reads to the end. `path` is the trace file, or its folder (ITP: the folder of
    `cluster*.csv` files, or one of them). `submit_seconds` stays relative to the trace's start,
    not the window's (`Trace.window_start_seconds` says where the window begins).
    `include_cpu_only` keeps openb's CPU-only pods (gpus == 0); other traces have none.
    """
    if fmt not in FORMATS:
        raise TraceError(f"unknown trace format {fmt!r}; expected one of {', '.join(FORMATS)}")
    if not (math.isfinite(start_days) and start_days >= 0):
        raise TraceError("start_days must be a finite number >= 0")
    if days is not None and not (math.isfinite(days) and days > 0):
        raise TraceError("days must be a positive number (or None for the rest of the trace)")
    skipped: Counter[str] = Counter()
    origin: datetime | None = None
    jobs: Iterable[TraceJob]
    if fmt == "philly":
        jobs, origin = read_philly(path, skipped)
    elif fmt == "itp":
        jobs = read_itp(path, skipped)
    else:
        jobs = read_openb(path, skipped, include_cpu_only=include_cpu_only)
    kept, lo, hi = _window(jobs, start_days, days)
    return Trace(
        fmt=fmt,
        source=str(path),
        jobs=tuple(kept),
        origin=origin,
        window_start_seconds=lo,
        window_end_seconds=hi,
        skipped=dict(skipped),
    )
