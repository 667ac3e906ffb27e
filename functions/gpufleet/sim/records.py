"""The simulated jobs' records and usage, in the shapes the stack keeps them (`gpufleet simulate
--records DIR`), so that `gpufleet review --records DIR` reviews a simulated month as it would
the stack's.

`RecordWriter` is the engine's `RunObserver`: it keeps each job's record as the settlement of
its last run left it (`domain.settlement.settle`, the rule the Release step applies: status,
placement, release, counters, `cost_usd` and `prior_*` over all its runs), and for each run
and node a usage document (`domain/usage_layout.py`) made from what the simulation knows:

- samples from the launch to the release, every minute as the agent samples, merged pairwise
  (the interval doubling) to at most `USAGE_SAMPLES`; a sample's GPU utilization is the share
  of its interval the run worked (100 % working, 0 while booting or restoring), on the GPUs
  the spec asks for on a node; the type's other GPUs idle at 0;
- GPU memory used: what the trace mapping says each working GPU needs (the spec's
  `gpu_memory_gib`; the traces do not say more); host CPU and memory unknown (null);
- marks: `started` when the work (re)started, then `finished` when the run exited or
  `interrupted` when it was interrupted or drained.

With `until` (the end of the trace window, `gpufleet simulate --days D`), the records are the
store as it stood then, as a review run at the end of the window would read it, not after the
simulation drained the jobs still running: a run that outlived `until` is recorded live
(RUNNING, or LAUNCHING before its work started; no release, no cost yet) with its usage up to
`until` and no end mark, a job waiting then is QUEUED, and nothing that happened later is
recorded. Without it, every job as it ended.

A job that ended while it waited (never admissible, never admitted again) is settled by the
rule the stack's backstop applies to a job whose workflow ended without a run to settle
(`settle` with an `ABANDONED` end): FAILED with the reason, its earlier runs' cost kept.

Times are the simulation's seconds after the trace's start plus `origin` (the trace's own
wall clock where it gives one, e.g. Philly's first submission, read as UTC). Job ids are
derived as intake derives them (`job_id_for_delivery`), from `simulation/<spec name>`.
"""

from __future__ import annotations

import math
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime

from gpufleet.adapters.local.records import Export
from gpufleet.domain.catalog import Catalog
from gpufleet.domain.job import Job, JobStatus, job_id_for_delivery
from gpufleet.domain.settlement import EndKind, RunEnd, Settlement, settle
from gpufleet.domain.spec import JobSpec
from gpufleet.domain.usage_layout import (
    EVENT_FINISHED,
    EVENT_INTERRUPTED,
    EVENT_STARTED,
    NodeUsage,
    Sample,
)
from gpufleet.sim.engine import Workload

USAGE_SAMPLES = 48  # per run and node: a month of runs stays a few hundred MB
AGENT_INTERVAL = 60.0  # the node agent's sampling interval (agent/usage.py)
# Where a trace gives no wall clock: 2025-12-01T00:00:00Z.
DEFAULT_ORIGIN = 1_764_547_200.0


def trace_origin(origin: datetime | None) -> float:
    """Epoch seconds of the trace's `submit_seconds == 0` (a naive time read as UTC)."""
    if origin is None:
        return DEFAULT_ORIGIN
    return (origin if origin.tzinfo else origin.replace(tzinfo=UTC)).timestamp()


@dataclass(frozen=True)
class _Run:
    job_id: str
    placement_launched: float
    released: float
    worked_from: float | None
    interrupted: bool
    instance_ids: tuple[str, ...]
    gpus_total: tuple[float, ...]  # MiB per GPU of the type
    working_gpus: int
    gpu_mem_needed_mib: float
    live: bool = False  # still running at the records' end: no end mark


class RecordWriter:
    """Collects the records and usage of one simulated run of a workload (an observer), as
    they stood at `until` (simulation seconds; None: at the end of the simulation)."""

    def __init__(
        self, workload: Workload, catalog: Catalog, origin: float, until: float | None = None
    ) -> None:
        self.origin = origin
        self.until = until
        self._catalog = catalog
        self._specs: dict[str, tuple[JobSpec, float]] = {
            spec.name: (spec, trace.submit_seconds)
            for trace, spec in zip(workload.jobs, workload.specs, strict=True)
        }
        self._records: dict[str, Job] = {}  # spec name -> the record as it stands (sim time)
        self._runs: list[_Run] = []

    # -- RunObserver ---------------------------------------------------------------------------

    def run_settled(
        self, record: Job, end: RunEnd, settlement: Settlement, worked_from: float | None
    ) -> None:
        placement = record.placement
        released, live = end.at, False
        if self.until is not None and end.at > self.until:
            if placement is None or placement.launched_at >= self.until:
                return  # it ran after the records' end
            # Still held at the records' end: the record as the run left it while it ran.
            released, live = self.until, True
            worked = worked_from is not None and worked_from <= self.until
            self._records[record.job_id] = record.model_copy(
                update={
                    "status": JobStatus.RUNNING if worked else JobStatus.LAUNCHING,
                    "updated_at": placement.launched_at,
                }
            )
        else:
            self._records[record.job_id] = settlement.job
        if placement is None:
            return
        resources = record.effective_spec.resources
        total = placement.gpu_memory_gib * 1024
        gpus = self._catalog.instance_type(placement.instance_type).gpus
        self._runs.append(
            _Run(
                job_id=record.job_id,
                placement_launched=placement.launched_at,
                released=released,
                worked_from=worked_from,
                interrupted=end.kind is not EndKind.EXITED,
                instance_ids=tuple(placement.instance_ids),
                gpus_total=(total,) * gpus,
                working_gpus=resources.gpus,
                gpu_mem_needed_mib=min(total, resources.gpu_memory_gib * 1024),
                live=live,
            )
        )

    def ended_queued(self, job_id: str, reason: str, at: float) -> None:
        if self.until is not None and at > self.until:
            return  # still waiting at the records' end
        last = self._records.get(job_id) or self._queued(job_id)
        # No run to settle: the rule the backstop applies when a job's workflow ends so.
        ended = settle(last, RunEnd(EndKind.ABANDONED, at, reason=reason)).job
        self._records[job_id] = ended.model_copy(update={"updated_at": at})

    def _queued(self, name: str) -> Job:
        """The record of a job that has not run yet, as intake stored it."""
        spec, submitted = self._specs[name]
        return Job(
            job_id=name,
            status=JobStatus.QUEUED,
            spec=spec,
            source="simulation",
            created_at=submitted,
            updated_at=submitted,
        )

    # -- What it writes ------------------------------------------------------------------------

    def ids(self) -> Mapping[str, str]:
        """Spec name -> the job id its record has."""
        return {name: job_id_for_delivery(f"simulation/{name}") for name in self._submitted()}

    def jobs(self) -> Iterator[Job]:
        """Each job's record, in epoch seconds, under its job id (one submitted by the records'
        end that has not run by then: QUEUED)."""
        ids = self.ids()
        for name in self._submitted():
            job = self._records.get(name) or self._queued(name)
            yield self._shifted(job, ids[name])

    def _submitted(self) -> list[str]:
        """The jobs submitted by the records' end."""
        until = self.until
        return [n for n, (_, at) in self._specs.items() if until is None or at <= until]

    def usage(self) -> Iterator[NodeUsage]:
        """Each run's usage document per node, in epoch seconds, under its job's id."""
        ids = self.ids()
        for run in self._runs:
            samples = self._samples(run)
            events = []
            if run.worked_from is not None and run.worked_from <= run.released:
                events.append((run.worked_from, EVENT_STARTED))
            if not run.live:
                end_mark = EVENT_INTERRUPTED if run.interrupted else EVENT_FINISHED
                events.append((run.released, end_mark))
            interval = samples[1].t - samples[0].t if len(samples) > 1 else AGENT_INTERVAL
            shifted = tuple(Sample(s.t + self.origin, s.gpu_util, s.gpu_mem_mib) for s in samples)
            for instance in run.instance_ids:
                yield NodeUsage(
                    job_id=ids[run.job_id],
                    instance_id=instance,
                    interval_seconds=interval,
                    gpu_mem_total_mib=run.gpus_total,
                    samples=shifted,
                    events=tuple((t + self.origin, name) for t, name in events),
                )

    def export(self, region: str, start: float, simulated_until: float) -> Export:
        """What the records cover, from `start` (the simulation's seconds) to `until`, or to
        `simulated_until` (the simulation's end) without it."""
        end = self.until if self.until is not None else simulated_until
        return Export(region=region, start=start + self.origin, end=end + self.origin)

    def _shifted(self, job: Job, job_id: str) -> Job:
        o = self.origin
        placement = job.placement
        return job.model_copy(
            update={
                "job_id": job_id,
                "source": f"simulation/{job.job_id}",
                "created_at": job.created_at + o,
                "updated_at": job.updated_at + o,
                "released_at": None if job.released_at is None else job.released_at + o,
                "placement": None
                if placement is None
                else placement.model_copy(update={"launched_at": placement.launched_at + o}),
            }
        )

    @staticmethod
    def _samples(run: _Run) -> list[Sample]:
        """From the launch to the release, at most USAGE_SAMPLES, each the share of its
        interval that the run worked."""
        held = max(0.0, run.released - run.placement_launched)
        interval = AGENT_INTERVAL
        while held > interval * USAGE_SAMPLES:
            interval *= 2
        count = max(1, math.ceil(held / interval))
        gpus = len(run.gpus_total)
        samples = []
        for k in range(count):
            t = run.placement_launched + k * interval
            upto = min(run.released, t + interval)
            worked = 0.0
            if run.worked_from is not None and upto > t:
                worked = max(0.0, upto - max(t, run.worked_from)) / (upto - t)
            util = 100.0 * worked
            busy = min(run.working_gpus, gpus)
            mem = run.gpu_mem_needed_mib if worked > 0 else 0.0
            samples.append(
                Sample(
                    t,
                    (util,) * busy + (0.0,) * (gpus - busy),
                    (mem,) * busy + (0.0,) * (gpus - busy),
                )
            )
        return samples
