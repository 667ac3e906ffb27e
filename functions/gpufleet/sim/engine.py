"""The discrete-event loop: a trace replayed through the domain core on a simulated clock.

One run replays one workload (trace jobs mapped to job specs) under one policy configuration
(`SimPolicy`, built by `gpufleet.sim.policies`). Nothing here decides policy: the loop only
moves jobs between states and asks the core what to do.

- Queue, admission, quotas, borrowing, preemption: `gpufleet.domain.queueing.decide`, called
  by a simulated dispatcher (see "Dispatch passes"), with each team's fair-share usage: the
  GPU-hours each settlement charges (`ReleaseShare`), kept and decayed by
  `gpufleet.domain.fair_share` as the queue's ledger keeps them.
- Instance choice and launch order: `gpufleet.domain.planning.plan_launch` (which ranks with
  `selection.select` and `diversify`); after a failed launch `LaunchPlan.after_failure` says
  whether to try the next capacity type, wait `retry_wait_seconds`, or give up. Offerings that
  failed are remembered (`launch.shortage_keys`) in an in-memory capacity memory
  (`adapters.local.memory.InMemoryCapacityMemory`) for `capacity_memory_seconds` and skipped by
  the next plans, as the lifecycle service does.
- Launch failures, spot capacity, spot interruptions, boot and restore:
  `gpufleet.sim.market.MarketModel` (a launch takes a `Lease` of room in a pool; its release
  gives it back).
- Expected durations, which plans are ranked by: with `durations='oracle'` the trace's true
  duration (the spec's `expected_duration`); with `durations='history'` what the Lambdas would
  have, `domain.duration.estimate_duration` on the job without `expected_duration`, fed the
  team's `HISTORY_DEPTH` most recently submitted jobs, of which those that completed count
  with the time their last placement was held (as `recent_for_team` and the lifecycle do).
- Cost: `domain.cost.run_cost_usd` per held interval (one `Placement` per launch).
- How a run ends (back to the queue, retried on GPUs with more memory, succeeded, failed):
  `domain.settlement.settle`, on the job as its record would stand, as Release settles it.
  The loop only says how the run ended (`RunEnd`) and carries the settlement out.

Per job: arrival -> queued -> admitted by `decide` -> launch attempts per the plan -> boot
(`boot_seconds`, plus `restore_seconds` when resuming from a checkpoint) -> running -> one of

- its end: it exits 0, or with the exit (code, out of memory) its trace job's `failed_runs`
  give the next run that reaches its end; a failed run keeps its last periodic checkpoint;
- spot interruption (market): work since the last checkpoint is lost (`checkpointed_progress`
  on the run's own progress: periodic checkpoints every `checkpoint_interval_seconds` of work);
- preemption (`decide`): the victim is marked draining for its preemptor, checkpoints at once
  (keeps all its progress) and is released `preemption_grace_seconds` later. A victim still
  launching or booting is released at once.

Each is then settled: released (cost recorded) and requeued (`requeues`; a preempted job with
`preempted_for`), or ended.

Dispatch passes. A pass (one `decide` call) runs when something changed: an arrival, a
release, a requeue. Passes are coalesced to at most one per `dispatch_interval_seconds` (a
dispatcher's batching window); while jobs wait under a preempting policy a pass also runs every
`recheck_seconds` (victims come of age after `min_runtime_seconds`). A pass reads each team's
and class's jobs as the dispatcher does: in order, no further than the queue's state shows
something could be admitted, nor past `LOOKAHEAD` of them in a row that wait. No pass runs while
the queue is empty. A job no state of the fleet could ever admit fails on arrival, as intake
refuses it (`never_admissible`).

Simplifications (documented in sim/README.md): the simulated fleet picks the first override of a
step that the market has room for (cheapest first), the 2-minute interruption notice is not
used for an extra checkpoint, a failed run takes its full trace duration, run timeouts are not
enforced (every mapped timeout is at least twice the trace duration, except for jobs longer
than the spec's 14-day cap, which the trace says did finish), and a static pool packs jobs by
GPU count (no fragmentation).
"""

from __future__ import annotations

import gc
import heapq
import math
import random
import time
from collections import deque
from collections.abc import Callable, Iterable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field, replace
from typing import Any, Literal, Protocol

from gpufleet.adapters.local.memory import InMemoryCapacityMemory
from gpufleet.domain.catalog import Catalog, InstanceType, Offering, load_bundled
from gpufleet.domain.cost import held_seconds, run_cost_usd
from gpufleet.domain.duration import HISTORY_DEPTH, DurationEstimate, PastRun, estimate_duration
from gpufleet.domain.fair_share import add_charge, charge, usage_by_team
from gpufleet.domain.job import Job, JobStatus, Placement
from gpufleet.domain.launch import (
    CapacityType,
    LaunchError,
    LaunchOverride,
    LaunchResult,
    shortage_keys,
)
from gpufleet.domain.planning import LaunchPlan, LaunchStep, plan_launch
from gpufleet.domain.queueing import (
    Decision,
    QueuedJob,
    QueuePolicy,
    RunningJob,
    decide,
    never_admissible,
    next_window_change,
)
from gpufleet.domain.selection import NoFeasibleOffering, observed_hazard
from gpufleet.domain.settlement import (
    DEFAULT_MAX_INTERRUPTIONS,
    PREEMPTED,
    RECLAIMED,
    WINDOW,
    EndKind,
    ReleaseShare,
    RunEnd,
    Settlement,
    settle,
)
from gpufleet.domain.spec import JobSpec, Priority, Resources, SpotPolicy
from gpufleet.sim.bound import cheapest_hourly_usd
from gpufleet.sim.mapping import TraceMapping, to_spec
from gpufleet.sim.market import Lease, MarketConfig, MarketModel, checkpointed_progress
from gpufleet.sim.traces import RunExit, Trace, TraceJob

DurationModel = Literal["oracle", "history"]


@contextmanager
def _collector_paused() -> Iterator[None]:
    """No cycle collection while a whole trace's objects are made or replayed: they are
    millions, long-lived, and make next to no cyclic garbage (Philly: a few thousand objects
    in all), yet each full collection walks every one of them (Philly: sixteen passes, 4 s of
    a 70 s run). Whatever cycles a run leaves are collected after it."""
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()


# --- Inputs -----------------------------------------------------------------------------------


@dataclass(frozen=True)
class Workload:
    """The trace jobs of a window and the job specs they map to (same order)."""

    jobs: tuple[TraceJob, ...]
    specs: tuple[JobSpec, ...]
    mapping: TraceMapping
    name: str = "workload"

    @classmethod
    def from_trace(cls, trace: Trace | Sequence[TraceJob], mapping: TraceMapping) -> Workload:
        jobs = tuple(trace)
        name = f"{trace.fmt}:{trace.source}" if isinstance(trace, Trace) else "jobs"
        with _collector_paused():
            specs = tuple(to_spec(j, mapping) for j in jobs)
        return cls(jobs, specs, mapping, name)

    def __len__(self) -> int:
        return len(self.jobs)

    @property
    def start_seconds(self) -> float:
        return min((j.submit_seconds for j in self.jobs), default=0.0)

    def peak_gpus(self) -> int:
        """Most GPUs the jobs hold at once if each runs from its submission, without waiting
        (the trace durations, requested GPU counts of the mapped specs)."""
        deltas: list[tuple[float, int]] = []
        for job, spec in zip(self.jobs, self.specs, strict=True):
            gpus = spec.resources.total_gpus
            deltas.append((job.submit_seconds, gpus))
            deltas.append((job.submit_seconds + job.duration_seconds, -gpus))
        deltas.sort()  # at equal times releases (negative) come first
        held = peak = 0
        for _, delta in deltas:
            held += delta
            peak = max(peak, held)
        return peak


@dataclass(frozen=True)
class StaticPool:
    """A fixed fleet held for the whole run: `count` instances of one offering."""

    offering: Offering
    count: int

    @property
    def gpus(self) -> int:
        return self.offering.instance_type.gpus * self.count


@dataclass(frozen=True)
class SimPolicy:
    """A policy is a configuration of the one engine and the one core."""

    name: str
    queue: QueuePolicy
    # Rewrite each job's queue identity before it meets `decide` (None: the spec's own team
    # and priority). E.g. FIFO = one team, one class.
    team_of: str | None = None
    priority_of: Priority | None = None
    spot: SpotPolicy | None = None  # None: the spec's spot policy
    static_pool: StaticPool | None = None
    # Requeued jobs keep their first submission time (they age on and keep their place);
    # False puts them at the back of their class.
    requeue_keeps_place: bool = True
    # Spot interruptions are capped at the spec's `max_retries` instead of the Lambdas'
    # `max_interruptions`, and the next one fails the job (spot: auto too; the Lambdas move
    # it to on-demand).
    interruptions_use_retries: bool = False
    # The Lambdas' `max_interruptions` (their settings' default).
    max_interruptions: int = DEFAULT_MAX_INTERRUPTIONS
    # After a spot interruption, the pool it happened in is remembered as short (for
    # `capacity_memory_seconds`), so the relaunch fails over to the next zone or type.
    avoid_interrupted_pool: bool = False
    # Launch attempts before giving up (None: the engine's `max_launch_attempts`).
    max_launch_attempts: int | None = None
    description: str = ""


@dataclass(frozen=True)
class EngineConfig:
    """The simulated control plane's timings (defaults are the Lambda settings' defaults)."""

    max_launch_attempts: int = 20
    retry_wait_seconds: int = 60
    boot_allowance_seconds: int = 900
    heartbeat_timeout_seconds: int = 900
    capacity_memory_seconds: int = 300
    dispatch_interval_seconds: float = 60.0
    recheck_seconds: float = 300.0
    # What plans are ranked by: the true duration, or the estimate from the team's history.
    durations: DurationModel = "oracle"
    # Time series resolution for reports; None: the run's span / 400, at least 60 s.
    sample_seconds: float | None = None


# --- Output -----------------------------------------------------------------------------------


@dataclass
class Series:
    """Samples of the fleet's state over time (for plots)."""

    t: list[float] = field(default_factory=list)
    cost_usd: list[float] = field(default_factory=list)  # spent so far
    queued: list[int] = field(default_factory=list)
    gpus_held: list[int] = field(default_factory=list)  # GPUs on held instances
    gpus_used: list[int] = field(default_factory=list)  # GPUs of jobs doing work


@dataclass
class SimResult:
    policy: str
    jobs: int
    completed: int = 0
    failed: int = 0
    failures: dict[str, int] = field(default_factory=dict)  # reason -> jobs
    cost_usd: float = 0.0
    gpu_seconds_paid: float = 0.0
    gpu_seconds_useful: float = 0.0
    interruptions: int = 0
    requeues: int = 0
    preemptions: int = 0
    window_drains: int = 0  # checkpointed and requeued because a window drains their class
    ondemand_fallbacks: int = 0
    launches: int = 0
    launch_failures: int = 0
    dispatch_passes: int = 0
    decide_seconds: float = 0.0
    wall_seconds: float = 0.0
    end_seconds: float = 0.0  # simulated time of the last event
    # Per job (workload order): trace priority, wait until first running (None: never ran),
    # completion time after submission (None: did not complete).
    priorities: list[str] = field(default_factory=list)
    waits: list[float | None] = field(default_factory=list)
    jcts: list[float | None] = field(default_factory=list)
    # Per job, the expected duration its last plan was ranked by (None: never planned), and
    # per source of that estimate (spec, history, default), how many plans used it.
    expected_seconds: list[int | None] = field(default_factory=list)
    expected_sources: dict[str, int] = field(default_factory=dict)
    series: Series = field(default_factory=Series)
    # Per capacity type, what released placements paid above their job's cheapest price
    # (`bound.cheapest_hourly_usd`, the bound's): nodes x (price - cheapest) x hours held.
    # None for a static pool (no placement of a job holds its instances).
    price_above_cheapest_usd: dict[str, float] | None = field(default_factory=dict)
    info: dict[str, Any] = field(default_factory=dict)


class RunObserver(Protocol):
    """Told how each job's runs ended, as the stack's records would say (`sim/records.py`
    writes them): it never changes the run."""

    def run_settled(
        self, record: Job, end: RunEnd, settlement: Settlement, worked_from: float | None
    ) -> None:
        """A run ended: the job's record as it stood (`record`, with the run's placement),
        how the run ended, and its settlement (the record after it, what the run cost);
        `worked_from`: when its work (re)started (None: it never got past the boot)."""

    def ended_queued(self, job_id: str, reason: str, at: float) -> None:
        """The job failed while it waited (never admissible, or never admitted again)."""


# --- The loop ---------------------------------------------------------------------------------

# Job states.
_PENDING, _QUEUED, _LAUNCHING, _BOOTING, _RUNNING, _DRAINING, _DONE, _FAILED = range(8)
# Event kinds; at equal times, lower kinds go first (releases before the dispatch pass).
_END, _INTERRUPT, _DRAINED, _START, _LAUNCH, _DISPATCH = range(6)


class _Job:
    __slots__ = (
        "attempts",
        "base_plan",
        "drain_reason",
        "duration",
        "ended_runs",
        "enqueued_at",
        "expected",
        "failed_runs",
        "first_start",
        "gpus",
        "idx",
        "in_history",
        "instance_gpus",
        "interruptions",
        "job_id",
        "lease",
        "nodes",
        "on_demand_only",
        "past_run",
        "placement",
        "preempted_for",
        "preemptions",
        "prior",
        "priority",
        "progress",
        "resources_override",
        "retries",
        "run_from",
        "run_shape",
        "run_spec",
        "shape",
        "spec",
        "spot_held_seconds",
        "state",
        "step",
        "submit",
        "team",
        "version",
        "work_start",
    )

    def __init__(self, idx: int, trace: TraceJob, spec: JobSpec, policy: SimPolicy) -> None:
        self.idx = idx
        self.job_id = spec.name
        # With the policy's spot policy, if it has one: the job's plans and settlement read it.
        spot = policy.spot or spec.spot
        self.spec = spec if spot is spec.spot else spec.model_copy(update={"spot": spot})
        self.submit = trace.submit_seconds
        self.duration = trace.duration_seconds
        self.gpus = trace.gpus  # useful GPUs (the trace's)
        self.nodes = spec.resources.nodes
        self.team = policy.team_of or spec.team
        self.priority = policy.priority_of or spec.priority
        self.state = _PENDING
        self.version = 0
        self.enqueued_at = self.submit
        self.preempted_for: str | None = None
        self.progress = 0.0  # work kept (checkpointed) so far, seconds
        self.run_from = 0.0  # progress when the current run started working
        self.work_start = 0.0  # when the current run starts (or started) working
        self.first_start: float | None = None
        # What the one settlement (`domain.settlement.settle`) reads and updates, as on the
        # job's record: why its run is being stopped, its counters, what it now asks for.
        self.drain_reason: str | None = None
        self.retries = 0
        self.interruptions = 0
        self.preemptions = 0
        self.resources_override: Resources | None = None
        self.on_demand_only = False
        self.spot_held_seconds = 0.0
        # What its earlier runs cost and held (the record's `prior_*`), as settlements said.
        self.prior: dict[str, Any] = {}
        self.failed_runs: tuple[RunExit, ...] = trace.failed_runs
        self.ended_runs = 0  # runs that reached their end (successful or not)
        self.attempts = 0
        self.step = 0
        self.base_plan: LaunchPlan | None = None
        self.lease: Lease | None = None
        self.instance_gpus = 0
        self.placement: Placement | None = None
        self.shape = resource_shape(spec.resources)  # the spec's (its team's history is by it)
        # What it now asks for (the record's `effective_spec`): the spec, with the override if
        # any, on-demand only once it gave up on spot.
        self.run_spec = self.spec
        self.run_shape = self.shape
        self.past_run: PastRun | None = None  # its completed run, for the team's history
        self.in_history = False  # among its team's HISTORY_DEPTH most recent submissions
        self.expected: DurationEstimate | None = None  # what its current plan is ranked by


def _plan_seconds(seconds: int) -> int:
    """The expected duration the plan is ranked with, to two significant figures, so that
    plans can be cached per (shape, duration) without changing any ranking materially."""
    if seconds < 100:
        return max(1, seconds)
    scale: int = 10 ** (len(str(seconds)) - 2)
    return max(1, round(seconds / scale) * scale)


def resource_shape(r: Resources) -> tuple[object, ...]:
    """The resources as a hashable key (plans, history and the lower bound are cached by it)."""
    return (r.gpus, r.gpu_memory_gib, tuple(r.gpu_models), r.vcpus, r.memory_gib, r.nodes, r.arch)


class _Planner:
    """`plan_launch` with a cache per (resources, spot policy, rounded expected duration and
    its source, unavailable)."""

    def __init__(
        self, catalog: Catalog, region: str, config: EngineConfig, max_launch_attempts: int
    ) -> None:
        self._catalog = catalog
        self._region = region
        self._config = config
        self._max_launch_attempts = max_launch_attempts
        self._cache: dict[tuple[object, ...], LaunchPlan | NoFeasibleOffering] = {}
        self.calls = 0
        self.misses = 0

    def __call__(self, job: _Job, unavailable: frozenset[str]) -> LaunchPlan | None:
        """The plan for the job as it now asks (`run_spec`, whose `resource_shape` is
        `run_shape`), ranked by its `expected` duration (already rounded by `_plan_seconds`)
        and its spot experience, as `job_observed_hazard` reads it on the record."""
        spec, expected = job.run_spec, job.expected
        assert expected is not None
        hazard = observed_hazard(job.interruptions, job.spot_held_seconds, spec.resources.nodes)
        key = (job.run_shape, spec.spot, expected.seconds, expected.source, unavailable, hazard)
        self.calls += 1
        hit = self._cache.get(key)
        if hit is None:
            self.misses += 1
            if len(self._cache) > 50_000:
                self._cache.clear()
            c = self._config
            try:
                hit = plan_launch(
                    spec,
                    self._catalog,
                    self._region,
                    max_launch_attempts=self._max_launch_attempts,
                    retry_wait_seconds=c.retry_wait_seconds,
                    boot_allowance_seconds=c.boot_allowance_seconds,
                    heartbeat_timeout_seconds=c.heartbeat_timeout_seconds,
                    expected=expected,
                    unavailable=unavailable,
                    observed_hazard=hazard,
                )
            except NoFeasibleOffering as exc:
                hit = exc
            self._cache[key] = hit
        return None if isinstance(hit, NoFeasibleOffering) else hit


class _History:
    """What `recent_for_team` gives the duration estimate, kept up to date as jobs arrive and
    complete: per team its `HISTORY_DEPTH` most recently submitted jobs; per (team, image,
    shape) the completed runs among them (exactly those `estimate_duration` would keep: same
    image, same resources), and the estimate they give until they change."""

    def __init__(self) -> None:
        self._recent: dict[str, deque[_Job]] = {}
        self._runs: dict[tuple[object, ...], list[PastRun]] = {}
        self._estimates: dict[tuple[object, ...], DurationEstimate] = {}
        # estimate_duration reads only a spec's expected_duration, image and resources: one
        # spec without expected_duration per (image, shape) stands for every job of it.
        self._blind: dict[tuple[object, ...], JobSpec] = {}

    @staticmethod
    def _key(job: _Job) -> tuple[object, ...]:
        return (job.spec.team, job.spec.image, job.shape)

    def _changed(self, key: tuple[object, ...]) -> None:
        self._estimates.pop(key, None)

    def arrived(self, job: _Job) -> None:
        recent = self._recent.setdefault(job.spec.team, deque())
        if len(recent) == HISTORY_DEPTH:
            oldest = recent.pop()
            oldest.in_history = False
            if oldest.past_run is not None:
                key = self._key(oldest)
                self._runs[key].remove(oldest.past_run)
                self._changed(key)
        recent.appendleft(job)
        job.in_history = True

    def succeeded(self, job: _Job, held_seconds: float) -> None:
        """The job's last placement, held this long, ended its successful run."""
        job.past_run = PastRun(job.spec.image, job.spec.resources, held_seconds)
        if job.in_history:
            key = self._key(job)
            self._runs.setdefault(key, []).append(job.past_run)
            self._changed(key)

    def estimate(self, job: _Job) -> DurationEstimate:
        key = self._key(job)
        estimate = self._estimates.get(key)
        if estimate is None:
            blind = self._blind.get(key[1:])
            if blind is None:
                blind = job.spec.model_copy(update={"expected_duration_seconds": None})
                self._blind[key[1:]] = blind
            estimate = estimate_duration(blind, self._runs.get(key, ()))
            self._estimates[key] = estimate
        return estimate


class Engine:
    """One run of one policy over one workload. Use `simulate()`."""

    def __init__(
        self,
        workload: Workload,
        policy: SimPolicy,
        *,
        market: MarketModel,
        config: EngineConfig,
        seed: int,
        observer: RunObserver | None = None,
    ) -> None:
        self.workload = workload
        self.observer = observer
        self.policy = policy
        self.market = market
        self.config = config
        self.region = market.region
        self.rng = random.Random(seed)
        self.planner = _Planner(
            market.catalog,
            market.region,
            config,
            policy.max_launch_attempts or config.max_launch_attempts,
        )
        self.capacity = InMemoryCapacityMemory()
        # `capacity.unavailable(now)` changes only as time passes or a shortage is noted: the
        # launches of one dispatch pass (same `now`) share one answer.
        self._shortages_noted = 0
        self._unavailable_cache: tuple[float, int, frozenset[str]] = (-math.inf, -1, frozenset())
        self._offerings: dict[tuple[CapacityType, str, str | None], Offering] = {}
        self._record: Job | None = None  # a job's record, that `_settle` copies each job's into
        with _collector_paused():
            self.jobs = [
                _Job(i, trace, spec, policy)
                for i, (trace, spec) in enumerate(zip(workload.jobs, workload.specs, strict=True))
            ]
        self.checkpoint_every = workload.mapping.checkpoint_interval_seconds
        self.history = _History() if config.durations == "history" else None
        self.events: list[tuple[float, int, int, int, int]] = []
        self.seq = 0
        self.queue: dict[str, QueuedJob] = {}
        self.running: dict[str, RunningJob] = {}
        # Each team's fair-share ledger (entry -> amount), as the queue's team items hold it.
        self.usage_ledgers: dict[str, dict[str, float]] = {}
        self.by_id = {job.job_id: job for job in self.jobs}
        if len(self.by_id) != len(self.jobs):
            raise ValueError("job ids (spec names) must be unique within a workload")
        self.dispatch_at: float | None = None
        self.dispatch_version = 0
        self.last_pass = -math.inf
        self.instance_seq = 0
        self.result = SimResult(policy=policy.name, jobs=len(self.jobs))
        if policy.static_pool is not None:
            self.result.price_above_cheapest_usd = None
        self._catalog = market.catalog
        self._cheapest: dict[tuple[object, ...], float] = {}
        self.result.priorities = [spec.priority.value for spec in workload.specs]
        self.result.waits = [None] * len(self.jobs)
        self.result.jcts = [None] * len(self.jobs)
        self.result.expected_seconds = [None] * len(self.jobs)
        # Fleet state for the time series: integrated between events.
        self.now = workload.start_seconds
        self.spend_per_second = 0.0
        self.spent = 0.0
        self.gpus_held = 0
        self.gpus_used = 0
        span = max((j.submit_seconds + j.duration_seconds for j in workload.jobs), default=self.now)
        self.sample_every = config.sample_seconds or max(60.0, (span - self.now) / 400)
        self.next_sample = self.now

    # -- Events --------------------------------------------------------------------------------

    def _push(self, at: float, kind: int, job: _Job | None = None) -> None:
        self.seq += 1
        if job is None:
            heapq.heappush(self.events, (at, kind, self.seq, -1, 0))
        else:
            heapq.heappush(self.events, (at, kind, self.seq, job.idx, job.version))

    def _advance(self, t: float) -> None:
        """Move the clock to `t`, integrating spend and emitting samples on the way."""
        while self.next_sample <= t:
            self._sample(self.next_sample)
            self.next_sample += self.sample_every
        self.spent += self.spend_per_second * (t - self.now)
        self.now = t

    def _sample(self, at: float) -> None:
        series = self.result.series
        series.t.append(at)
        series.cost_usd.append(self.spent + self.spend_per_second * (at - self.now))
        series.queued.append(len(self.queue))
        series.gpus_held.append(self.gpus_held)
        series.gpus_used.append(self.gpus_used)

    def run(self) -> SimResult:
        with _collector_paused():
            return self._replay()

    def _replay(self) -> SimResult:
        started = time.perf_counter()
        handlers: dict[int, Callable[[_Job], None]] = {
            _END: self._on_end,
            _INTERRUPT: self._on_interrupt,
            _DRAINED: self._on_drained,
            _START: self._on_start,
            _LAUNCH: self._on_launch,
        }
        pool = self.policy.static_pool
        if pool is not None:
            self._hold_pool(pool)
        arrivals = sorted(self.jobs, key=lambda j: (j.submit, j.idx))
        next_arrival = 0
        events = self.events
        while True:
            arrival_t = arrivals[next_arrival].submit if next_arrival < len(arrivals) else None
            if arrival_t is not None and (not events or arrival_t <= events[0][0]):
                self._advance(arrival_t)
                job = arrivals[next_arrival]
                next_arrival += 1
                self._arrive(job)
                continue
            if not events:
                if self.queue and not self._stuck():
                    continue
                break
            at, kind, _, idx, version = heapq.heappop(events)
            self._advance(at)
            if kind == _DISPATCH:
                if version == self.dispatch_version:
                    self._dispatch()
                continue
            job = self.jobs[idx]
            if job.version != version:
                continue  # superseded (the run it belonged to has ended)
            handlers[kind](job)
        if pool is not None:
            self._release_pool(pool)
        self._advance(self.now)
        self._sample(self.now)  # the last point: everything spent
        self.result.end_seconds = self.now
        self.result.wall_seconds = time.perf_counter() - started
        self.result.info.update(
            plans=self.planner.calls,
            plan_cache_misses=self.planner.misses,
            sample_seconds=self.sample_every,
        )
        return self.result

    def _stuck(self) -> bool:
        """No event is pending and jobs wait: one last pass; if it admits nothing, the jobs
        left can never run (nothing will ever change) and fail."""
        self._dispatch()
        if self.events:
            return False
        for job_id in list(self.queue):
            del self.queue[job_id]
            self._fail(self.by_id[job_id], "never admitted", settled=False)
        return True

    # -- Queue and dispatch --------------------------------------------------------------------

    def _arrive(self, job: _Job) -> None:
        if self.history is not None:
            self.history.arrived(job)
        self._enqueue(job, job.submit, intake=True)

    def _enqueue(
        self, job: _Job, at: float, preempted_for: str | None = None, *, intake: bool = False
    ) -> None:
        """Into the queue; at `intake` (its arrival) refused when it could never be admitted,
        as intake refuses it (a requeue asks for what its first run did)."""
        job.state = _QUEUED
        if not self.policy.requeue_keeps_place:
            job.enqueued_at = at
        job.preempted_for = preempted_for
        queued = QueuedJob(
            job_id=job.job_id,
            team=job.team,
            priority=job.priority,
            gpus=job.spec.resources.total_gpus,
            instances=job.nodes,
            enqueued_at=job.enqueued_at,
            preempted_for=preempted_for,
            preemptions=job.preemptions,
            # What the queue entry carries in the Lambdas: the estimate its plan ranks by.
            expected_seconds=self._expected(job).seconds,
        )
        if intake and never_admissible(queued, self.policy.queue) is not None:
            self._fail(job, "never admissible", settled=False)  # intake refuses it
            return
        self.queue[job.job_id] = queued
        self._request_dispatch()

    def _request_dispatch(self, *, now: bool = False) -> None:
        """Ask for a pass: at once, or at the end of the current batching window."""
        if not self.queue:
            return
        interval = self.config.dispatch_interval_seconds
        self._schedule_pass(self.now if now else max(self.now, self.last_pass + interval))

    def _schedule_pass(self, at: float) -> None:
        if self.dispatch_at is not None and self.dispatch_at <= at:
            return
        self.dispatch_at = at
        self.dispatch_version += 1  # an earlier-scheduled, later pass is superseded
        self.seq += 1
        heapq.heappush(self.events, (at, _DISPATCH, self.seq, -1, self.dispatch_version))

    def _dispatch(self) -> None:
        """One dispatcher pass: `decide` over the queue and the running set, then apply."""
        self.dispatch_at = None
        windows = bool(self.policy.queue.windows)
        if not self.queue and not (windows and self.running):
            return
        self.last_pass = self.now
        started = time.perf_counter()
        queue_policy = self.policy.queue
        usage = usage_by_team(
            self.usage_ledgers, self.now, queue_policy.fair_share_half_life_seconds
        )
        decision = decide(
            self.queue.values(), self.running.values(), (), self.now, queue_policy, team_usage=usage
        )
        self.result.decide_seconds += time.perf_counter() - started
        self.result.dispatch_passes += 1
        self._apply(decision)
        if self.queue and self.running and self.policy.queue.preemption:
            self._schedule_pass(self.now + self.config.recheck_seconds)
        change = next_window_change(self.policy.queue, self.now)
        if change is not None and (self.queue or self.running):
            # A window's start or end changes the rules (caps, quotas, paused and drained
            # classes, the reserve): the schedule's pass at that minute, as in the Lambdas.
            self._schedule_pass(change)

    def _apply(self, decision: Decision) -> None:
        for admission in decision.admitted:
            queued = self.queue.pop(admission.job_id)
            job = self.by_id[admission.job_id]
            self.running[job.job_id] = RunningJob(
                job_id=job.job_id,
                team=queued.team,
                priority=queued.priority,
                gpus=queued.gpus,
                instances=queued.instances,
                admitted_at=self.now,
                borrowed=admission.borrowed,
                in_reserve=admission.in_reserve,
                preemptions=queued.preemptions,
                expected_end=self.now + queued.expected_seconds,
            )
            job.version += 1
            if self.policy.static_pool is not None:
                self._on_start(job)  # a warm pool: no launch, no boot
            else:
                self._begin_launch(job)
        for preemption in decision.preemptions:
            self._drain(self.by_id[preemption.victim_id], preemption.for_job_id)
        for job_id in decision.reclaims:
            self._drain(self.by_id[job_id], None)
        for job_id in decision.window_drains:
            self._drain(self.by_id[job_id], None, WINDOW)

    # -- Launch --------------------------------------------------------------------------------

    def _expected(self, job: _Job) -> DurationEstimate:
        """What the plan ranks offerings by (see the module doc)."""
        if self.history is None:
            return estimate_duration(job.spec, [])  # the spec's: the trace's true duration
        return self.history.estimate(job)

    def _begin_launch(self, job: _Job) -> None:
        job.state = _LAUNCHING
        job.attempts = 0
        job.step = 0
        expected = self._expected(job)
        self.result.expected_seconds[job.idx] = expected.seconds
        sources = self.result.expected_sources
        sources[expected.source] = sources.get(expected.source, 0) + 1
        # Plans are ranked (and cached) by the estimate to two significant figures.
        job.expected = DurationEstimate(_plan_seconds(expected.seconds), expected.source)
        job.base_plan = self.planner(job, frozenset())
        if job.base_plan is None:
            self._settle(job, RunEnd(EndKind.STEP_FAILED, self.now, reason="NoFeasibleOffering"))
            return
        self._on_launch(job)

    def _on_launch(self, job: _Job) -> None:
        plan = job.base_plan
        assert plan is not None
        capacity_type = plan.steps[job.step].capacity_type
        assert job.expected is not None
        unavailable = self._unavailable()
        current = self.planner(job, unavailable)
        step: LaunchStep | None = None
        if current is not None:
            step = next((s for s in current.steps if s.capacity_type == capacity_type), None)
        self.result.launches += 1
        lease: Lease | None = None
        if step is not None:
            for override in step.overrides:
                offering = self._offering(capacity_type, override)
                lease = self.market.launch(offering, job.nodes, self.now, self.rng)
                if lease is not None:
                    break
        job.attempts += 1
        if lease is not None:
            self._launched(job, lease, capacity_type, plan)
            return
        self.result.launch_failures += 1
        result = LaunchResult(
            capacity_type=capacity_type,
            errors=[
                LaunchError(
                    code="InsufficientInstanceCapacity",
                    instance_type=o.instance_type,
                    zone=o.zone,
                )
                for o in (step.overrides if step is not None else [])
            ],
        )
        self._remember(shortage_keys(result, self.region))
        move = plan.after_failure(job.step, job.attempts, result.error_category)
        if move.give_up:
            codes = sorted({error.code for error in result.errors})
            give_up = RunEnd(EndKind.LAUNCH_GAVE_UP, self.now, reason=", ".join(codes))
            self._settle(job, give_up)
            return
        job.step = move.step
        self._push(self.now + (move.wait_seconds if move.retry_later else 0), _LAUNCH, job)

    def _remember(self, shortages: Iterable[str]) -> None:
        """Note offerings as short for `capacity_memory_seconds`, as the lifecycle does."""
        self.capacity.remember(shortages, until=self.now + self.config.capacity_memory_seconds)
        self._shortages_noted += 1

    def _unavailable(self) -> frozenset[str]:
        at, noted, keys = self._unavailable_cache
        if at != self.now or noted != self._shortages_noted:
            keys = self.capacity.unavailable(self.now)
            self._unavailable_cache = (self.now, self._shortages_noted, keys)
        return keys

    def _offering(self, capacity_type: CapacityType, override: LaunchOverride) -> Offering:
        key = (capacity_type, override.instance_type, override.zone)
        offering = self._offerings.get(key)
        if offering is None:
            zone = override.zone or self.region
            offering = self.market.offering(
                f"{capacity_type.value}:{override.instance_type}:{zone}"
            )
            self._offerings[key] = offering
        return offering

    def _launched(
        self, job: _Job, lease: Lease, capacity_type: CapacityType, plan: LaunchPlan
    ) -> None:
        offering = lease.offering
        if plan.is_on_demand_fallback(job.step):
            self.result.ondemand_fallbacks += 1
        it: InstanceType = offering.instance_type
        ids = []
        for _ in range(job.nodes):
            self.instance_seq += 1
            ids.append(f"i-{self.instance_seq:017x}")
        job.placement = Placement(
            instance_ids=ids,
            instance_type=it.name,
            capacity_type=capacity_type.value,
            zone=offering.zone,
            hourly_usd=offering.hourly_usd,
            gpu_memory_gib=it.gpu_memory_gib,
            launched_at=self.now,
        )
        job.lease = lease
        job.instance_gpus = it.gpus * job.nodes
        self.gpus_held += job.instance_gpus
        self.spend_per_second += offering.hourly_usd * job.nodes / 3600.0
        job.state = _BOOTING
        ready = self.now + self.market.boot_seconds
        if job.progress > 0:
            ready += self.market.restore_seconds
        job.work_start = ready
        job.run_from = job.progress
        self._push(ready, _START, job)
        finish = ready + (job.duration - job.progress)
        interrupted = self.market.next_interruption(lease, self.now, self.rng, until=finish)
        if interrupted is not None:
            self._push(interrupted, _INTERRUPT, job)

    def _on_start(self, job: _Job) -> None:
        """The job starts (or resumes) its work now."""
        job.state = _RUNNING
        job.work_start = self.now
        job.run_from = job.progress
        if job.first_start is None:
            job.first_start = self.now
            self.result.waits[job.idx] = self.now - job.submit
        self.gpus_used += job.gpus
        self._push(self.now + (job.duration - job.progress), _END, job)

    # -- Ends of runs --------------------------------------------------------------------------

    def _release_instances(self, job: _Job) -> None:
        placement = job.placement
        if placement is None:
            return
        lease = job.lease
        assert lease is not None
        self.market.release(lease)
        held = held_seconds(placement, self.now)
        self.result.cost_usd += run_cost_usd(placement, self.now)
        self._price_above_cheapest(job, placement, held)
        self.result.gpu_seconds_paid += job.instance_gpus * held
        self.gpus_held -= job.instance_gpus
        self.spend_per_second -= lease.offering.hourly_usd * job.nodes / 3600.0
        if job.state == _DONE and self.history is not None:
            self.history.succeeded(job, held)
        job.placement = None
        job.lease = None

    def _price_above_cheapest(self, job: _Job, placement: Placement, held: float) -> None:
        """Add what the placement paid above the job's cheapest price, as the bound charges it
        (the spec's resources), to its capacity type's share."""
        above = self.result.price_above_cheapest_usd
        if above is None:
            return
        cheapest = self._cheapest.get(job.shape)
        if cheapest is None:
            cheapest = cheapest_hourly_usd(job.spec.resources, self._catalog, self.region)
            self._cheapest[job.shape] = cheapest
        usd = len(placement.instance_ids) * (placement.hourly_usd - cheapest) * held / 3600
        above[placement.capacity_type] = above.get(placement.capacity_type, 0.0) + usd

    def _avoid_interrupted_pool(self, job: _Job) -> None:
        """Market hook on an interruption: a policy that fails over remembers the pool."""
        if self.policy.avoid_interrupted_pool and job.lease is not None:
            self._remember({job.lease.offering.key})

    def _release_admission(self, job: _Job) -> None:
        self.running.pop(job.job_id, None)
        self._request_dispatch()

    def _checkpoints(self, job: _Job) -> bool:
        return self.checkpoint_every is not None and job.spec.checkpoint is not None

    def _stop_work(self, job: _Job) -> float:
        """Stop a running job's work now; return the progress it reached."""
        if job.state == _RUNNING:
            self.gpus_used -= job.gpus
            return job.run_from + (self.now - job.work_start)
        return job.progress

    def _kept(self, job: _Job, reached: float) -> float:
        """The progress a run that stopped unplanned at `reached` keeps: its last periodic
        checkpoint (none without checkpoints)."""
        if self.checkpoint_every is None or not self._checkpoints(job):
            return 0.0
        return job.run_from + checkpointed_progress(
            max(0.0, reached - job.run_from), self.checkpoint_every
        )

    def _on_end(self, job: _Job) -> None:
        """The run reached its end: it exits 0, or as the trace job's next failed run says."""
        reached = self._stop_work(job)
        job.version += 1
        failed = job.failed_runs[job.ended_runs] if job.ended_runs < len(job.failed_runs) else None
        job.ended_runs += 1
        end = RunEnd(
            EndKind.EXITED,
            self.now,
            exit_code=failed.exit_code if failed is not None else 0,
            oom=failed is not None and failed.oom,
        )
        if failed is not None:
            job.progress = self._kept(job, reached)
        self._settle(job, end)

    def _on_interrupt(self, job: _Job) -> None:
        job.progress = self._kept(job, self._stop_work(job))
        job.version += 1
        self._avoid_interrupted_pool(job)
        self.result.interruptions += 1
        self._settle(job, RunEnd(EndKind.INTERRUPTED, self.now))

    def _drain(self, job: _Job, for_job_id: str | None, reason: str | None = None) -> None:
        """`decide` asked this job to make room (or its window drains its class): checkpoint,
        stop, requeue."""
        running = self.running.get(job.job_id)
        if running is None or running.draining:
            return
        self.running[job.job_id] = replace(running, draining_for=for_job_id or "")
        job.preempted_for = for_job_id
        job.drain_reason = reason or (PREEMPTED if for_job_id is not None else RECLAIMED)
        if reason is None:
            self.result.preemptions += 1
        else:
            self.result.window_drains += 1
        if job.state == _RUNNING:
            reached = self._stop_work(job)
            job.progress = reached if self._checkpoints(job) else 0.0  # saved now, in full
            job.state = _DRAINING
            job.version += 1
            self._push(self.now + self.policy.queue.preemption_grace_seconds, _DRAINED, job)
            return
        # Launching or booting: nothing to save; stop at once.
        self._on_drained(job)

    def _on_drained(self, job: _Job) -> None:
        """The drained run stopped at its checkpoint, as asked."""
        job.version += 1
        self._settle(job, RunEnd(EndKind.DRAINED, self.now, exit_code=0))

    def _settle(self, job: _Job, end: RunEnd) -> None:
        """Settle the end of the job's run with the one rule the Release step applies
        (`domain.settlement.settle`, on the job as its record would stand), and carry it out:
        its instances and its share released, then back to the queue, or its end."""
        placement = job.placement
        if self._record is None:
            self._record = Job(
                job_id=job.job_id,
                status=JobStatus.RUNNING,
                spec=job.spec,
                source="simulation",
                created_at=job.submit,
                updated_at=job.submit,
            )
        # Every field below has the type of the record's (the spec validated by `to_spec`, the
        # others the loop's own or a settlement's): copied into one validated record rather
        # than validated again, which costs ten times the copy (the spec's rules, each time).
        record = self._record.model_copy(
            update={
                "job_id": job.job_id,
                "spec": job.spec,
                "created_at": job.submit,
                "updated_at": self.now,
                "placement": placement,
                "drain_reason": job.drain_reason,
                "preempted_for": job.preempted_for,
                "retries": job.retries,
                "interruptions": job.interruptions,
                "preemptions": job.preemptions,
                "resources_override": job.resources_override,
                "on_demand_only": job.on_demand_only,
                "spot_held_seconds": job.spot_held_seconds,
                **job.prior,
            }
        )
        cap = job.spec.max_retries if self.policy.interruptions_use_retries else None
        settlement = settle(
            record,
            end,
            max_interruptions=self.policy.max_interruptions if cap is None else cap,
            on_demand_after_cap=not self.policy.interruptions_use_retries,
            instance_type=self.market.catalog.instance_type(placement.instance_type)
            if placement is not None
            else None,
        )
        settled = settlement.job
        if self.observer is not None:
            working = job.state in (_RUNNING, _DRAINING)
            self.observer.run_settled(record, end, settlement, job.work_start if working else None)
        if settled.status is JobStatus.SUCCEEDED:
            job.state = _DONE
            job.progress = job.duration
            self.result.completed += 1
            self.result.gpu_seconds_useful += job.gpus * job.duration
            self.result.jcts[job.idx] = self.now - job.submit
        self._release_instances(job)
        self._release_admission(job)
        for command in settlement.commands:
            if isinstance(command, ReleaseShare):
                self._charge(job, command)
        if settlement.requeue is not None:
            self._requeue(job, settlement)
        elif settled.status is not JobStatus.SUCCEEDED:
            self._fail(job, settlement.reason)

    def _charge(self, job: _Job, share: ReleaseShare) -> None:
        """The run's GPU-hours, to the team the queue knows the job by (the policy's)."""
        half_life = self.policy.queue.fair_share_half_life_seconds
        add_charge(self.usage_ledgers, job.team, charge(share.gpu_hours, share.at, half_life))

    def _requeue(self, job: _Job, settlement: Settlement) -> None:
        """Back to the queue with what the settlement recorded: its counters, and what it now
        asks for (more GPU memory after it ran out of it, on-demand only after the
        interruption cap)."""
        settled = settlement.job
        job.retries = settled.retries
        job.interruptions = settled.interruptions
        job.preemptions = settled.preemptions
        job.spot_held_seconds = settled.spot_held_seconds
        job.prior = {
            "prior_cost_usd": settled.prior_cost_usd,
            "prior_held_seconds": settled.prior_held_seconds,
            "prior_storage_usd": settled.prior_storage_usd,
            "prior_capacity_usd": settled.prior_capacity_usd,
        }
        if (settled.resources_override, settled.on_demand_only) != (
            job.resources_override,
            job.on_demand_only,
        ):
            job.resources_override = settled.resources_override
            job.on_demand_only = settled.on_demand_only
            job.run_spec = settled.effective_spec
            job.run_shape = resource_shape(job.run_spec.resources)
        job.drain_reason = None
        self.result.requeues += 1
        preempted_for = job.preempted_for if settlement.requeue == PREEMPTED else None
        self._enqueue(job, self.now, preempted_for)

    def _fail(self, job: _Job, reason: str, *, settled: bool = True) -> None:
        """The job ended failed; `settled` False: with no run to settle (it never ran, or its
        requeued run could never be admitted again)."""
        if not settled and self.observer is not None:
            self.observer.ended_queued(job.job_id, reason, self.now)
        job.state = _FAILED
        job.version += 1
        self.result.failed += 1
        self.result.failures[reason] = self.result.failures.get(reason, 0) + 1

    # -- Static pool ---------------------------------------------------------------------------

    def _hold_pool(self, pool: StaticPool) -> None:
        self.pool_placement = Placement(
            instance_ids=[f"i-pool{i:012x}" for i in range(pool.count)],
            instance_type=pool.offering.instance_type.name,
            capacity_type=pool.offering.capacity_type,
            zone=pool.offering.zone,
            hourly_usd=pool.offering.hourly_usd,
            launched_at=self.now,
        )
        self.gpus_held = pool.gpus
        self.spend_per_second = pool.offering.hourly_usd * pool.count / 3600.0

    def _release_pool(self, pool: StaticPool) -> None:
        placement = self.pool_placement
        self.result.cost_usd += run_cost_usd(placement, self.now)
        self.result.gpu_seconds_paid += pool.gpus * held_seconds(placement, self.now)


def simulate(
    workload: Workload,
    policy: SimPolicy,
    *,
    seed: int = 0,
    market: MarketModel | None = None,
    market_config: MarketConfig | None = None,
    config: EngineConfig | None = None,
    catalog: Catalog | None = None,
    observer: RunObserver | None = None,
) -> SimResult:
    """Replay `workload` under `policy`; the same inputs and seed give the same result.
    `observer` is told how each run ended (`RunObserver`)."""
    if market is None:
        market = MarketModel(
            catalog or load_bundled(), workload.mapping.region, market_config, seed=seed
        )
    engine = Engine(
        workload,
        policy,
        market=market,
        config=config or EngineConfig(),
        seed=seed,
        observer=observer,
    )
    return engine.run()
