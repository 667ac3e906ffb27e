"""A job's runs on a timeline: what `gpufleet report` draws.

From the job's record (queued, admitted, released) and its nodes' usage marks (started,
checkpoint, interrupted, finished: domain/usage_layout.py), in epoch seconds. Pure: the
caller reads the record and the documents.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from gpufleet.domain.job import Job
from gpufleet.domain.usage_layout import (
    EVENT_CHECKPOINT,
    EVENT_FINISHED,
    EVENT_INTERRUPTED,
    EVENT_STARTED,
    NodeUsage,
)

QUEUED = "queued"
LAUNCHING = "launching"
RUNNING = "running"
HELD_AFTER = "held after the run"
PHASES = (QUEUED, LAUNCHING, RUNNING, HELD_AFTER)
RELEASED = "released"


@dataclass(frozen=True)
class Span:
    phase: str  # one of PHASES
    start: float
    end: float
    instance_id: str | None = None  # a node's span (running)


@dataclass(frozen=True)
class Mark:
    name: str  # checkpoint, interrupted, released
    t: float
    instance_id: str | None = None


@dataclass(frozen=True)
class Timeline:
    spans: tuple[Span, ...]
    marks: tuple[Mark, ...]

    @property
    def start(self) -> float:
        return min([s.start for s in self.spans] + [m.t for m in self.marks], default=0.0)

    @property
    def end(self) -> float:
        return max([s.end for s in self.spans] + [m.t for m in self.marks], default=0.0)


def node_runs(usage: NodeUsage, until: float) -> list[tuple[float, float]]:
    """Each run of one node, from its `started` mark to its `finished` one (to `until` while
    it has none: the run goes on, or the node died)."""
    runs: list[tuple[float, float]] = []
    started: float | None = None
    for t, name in sorted(usage.events):
        if name == EVENT_STARTED:
            if started is not None:
                runs.append((started, t))
            started = t
        elif name == EVENT_FINISHED and started is not None:
            runs.append((started, t))
            started = None
    if started is not None:
        runs.append((started, max(started, until)))
    return runs


def timeline(job: Job, nodes: Sequence[NodeUsage], now: float) -> Timeline:
    """The job's phases: queued (submitted to first admitted), launching (admitted to its
    first node's start), each node's runs, held after the run (the last node's end to the
    release); its checkpoint and interruption marks and the release."""
    until = job.released_at if job.released_at is not None else now
    runs = [
        Span(RUNNING, start, end, usage.instance_id)
        for usage in nodes
        for start, end in node_runs(usage, until)
    ]
    spans: list[Span] = []
    admitted = job.first_admitted_at
    first_start = min((r.start for r in runs), default=None)
    queued_until = admitted if admitted is not None else first_start
    if queued_until is not None:
        spans.append(Span(QUEUED, job.created_at, max(job.created_at, queued_until)))
    if admitted is not None:
        launched_until = first_start if first_start is not None else until
        spans.append(Span(LAUNCHING, admitted, max(admitted, launched_until)))
    spans.extend(sorted(runs, key=lambda r: (r.start, r.instance_id or "")))
    last_end = max((r.end for r in runs), default=None)
    if job.released_at is not None and last_end is not None and job.released_at > last_end:
        spans.append(Span(HELD_AFTER, last_end, job.released_at))
    marks = [
        Mark(name, t, usage.instance_id)
        for usage in nodes
        for t, name in usage.events
        if name in (EVENT_CHECKPOINT, EVENT_INTERRUPTED)
    ]
    if job.released_at is not None:
        marks.append(Mark(RELEASED, job.released_at))
    return Timeline(tuple(spans), tuple(sorted(marks, key=lambda m: m.t)))
