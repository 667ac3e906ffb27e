"""How long a job is expected to run: from its spec, else from its team's similar jobs.

Selection compares offerings by the expected cost of finishing, so it needs a duration. A spec
that says `expected_duration` is taken at its word. Otherwise the team's recent successful runs
of the same image and resources say it: their median (robust to the odd outlier), once there
are enough of them. With neither, one hour: the unit prices are quoted in.

The history is the team's `HISTORY_DEPTH` most recently submitted jobs (`past_runs` keeps the
successful ones, with the time their last placement was held): what the Lambdas read from the
job store, and what the simulator keeps up to date as jobs arrive and end.
"""

from __future__ import annotations

import statistics
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from gpufleet.domain.cost import held_seconds
from gpufleet.domain.job import Job, JobStatus
from gpufleet.domain.spec import DEFAULT_EXPECTED_SECONDS, JobSpec, Resources

DEFAULT_SECONDS = DEFAULT_EXPECTED_SECONDS
MIN_SAMPLES = 3
# How many of a team's most recently submitted jobs the history reads.
HISTORY_DEPTH = 100


@dataclass(frozen=True, slots=True)
class PastRun:
    """A finished run of a team's job: what it ran and for how long."""

    image: str
    resources: Resources
    run_seconds: float


@dataclass(frozen=True, slots=True)
class DurationEstimate:
    seconds: int
    source: str  # "spec" | "history" | "default"
    samples: int = 0

    def describe(self) -> str:
        if self.source == "history":
            return f"median of {self.samples} similar past runs"
        if self.source == "spec":
            return "the spec's expected_duration"
        return "default (no expected_duration and too little history)"


def past_runs(jobs: Iterable[Job]) -> list[PastRun]:
    """The runs of `jobs` (a team's most recent) the history counts: those that succeeded,
    for as long as their last placement was held (boot and restore included)."""
    return [
        PastRun(job.spec.image, job.spec.resources, held_seconds(job.placement, released))
        for job in jobs
        if job.status is JobStatus.SUCCEEDED
        and job.placement is not None
        and (released := job.released_at) is not None
    ]


def estimate_duration(
    spec: JobSpec, history: Sequence[PastRun], *, min_samples: int = MIN_SAMPLES
) -> DurationEstimate:
    if spec.expected_duration_seconds:
        return DurationEstimate(spec.expected_duration_seconds, "spec")
    image, resources = spec.image, spec.resources
    # `is` first: runs of one shape often share its `Resources` (the simulator's always do),
    # and pydantic's == compares them field by field.
    similar = [
        run.run_seconds
        for run in history
        if run.image == image
        and (run.resources is resources or run.resources == resources)
        and run.run_seconds > 0
    ]
    if len(similar) >= min_samples:
        return DurationEstimate(round(statistics.median(similar)), "history", len(similar))
    return DurationEstimate(DEFAULT_SECONDS, "default")
