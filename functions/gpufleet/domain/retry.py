"""After a run ends: is the job retried (back to the queue) or is this its outcome?

A run that was stopped to make room (preempted, reclaimed) is always requeued: it checkpointed
and lost nothing. A run cut short by a spot interruption is requeued too, up to a cap, and is
not a failure. A failed run (non-zero exit code, lost node) is retried up to the spec's
`max_retries`, unless its exit code says retrying is pointless. So is a job whose control-plane
step kept failing (a handler that crashed through all of the workflow's own retries): the fault
was not the job's. Exceeding the job's own timeout, running out of launch attempts, or an error
that says the job cannot run at all is final.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from gpufleet.domain.spec import JobSpec

PREEMPTED = "preempted"
RECLAIMED = "reclaimed"
INTERRUPTED = "interrupted"
RETRY = "retry"
OUT_OF_MEMORY = "out-of-memory"  # a retry on GPUs with more memory
RESIZED = "resized"
IDLE = "idle"  # released because its GPUs sat idle: the job ends
OVERHEATED = "overheated"  # moved off hardware running too hot: requeued elsewhere
# GPU memory kept growing: restarted (from its checkpoint, if it writes one), counted as a retry.
MEMORY_LEAK = "memory-leak"
# Stopped (at a checkpoint, or at once) because its cost reached its budget: the job ends.
BUDGET = "budget"
# A stage of a multi-stage job succeeded: the job goes back to the queue for its next stage.
NEXT_STAGE = "next-stage"

# Errors a workflow step raises because of the job itself: retrying it would fail the same way.
JOB_ERRORS = frozenset(
    {
        "NoFeasibleOffering",
        "SpecError",
        "UnknownTemplate",
        "JobNotFound",
        "IllegalTransition",
        "JobAlreadyEnded",
        "ObjectTooLarge",
    }
)

# A job interrupted this often is probably asking for capacity that keeps being reclaimed.
DEFAULT_MAX_INTERRUPTIONS = 10


@dataclass(frozen=True)
class Verdict:
    requeue: bool
    kind: str | None = None  # PREEMPTED | RECLAIMED | INTERRUPTED | RETRY when requeued
    reason: str = ""


def _retryable_exit(spec: JobSpec, exit_code: int) -> bool:
    if exit_code in spec.no_retry_exit_codes:
        return False
    return not spec.retry_exit_codes or exit_code in spec.retry_exit_codes


def after_run(
    spec: JobSpec,
    state: Mapping[str, Any],
    *,
    drain_reason: str | None,
    retries: int,
    interruptions: int,
    ran_seconds: float | None,
    max_interruptions: int = DEFAULT_MAX_INTERRUPTIONS,
) -> Verdict:
    """What to do with a job whose run just ended, from the workflow's state."""
    run = state.get("run")
    run = run if isinstance(run, Mapping) else None
    if run is not None and run.get("cancelled"):
        return Verdict(False)
    if drain_reason == BUDGET:
        return Verdict(False, reason="its cost reached its budget")
    if drain_reason in (PREEMPTED, RECLAIMED, RESIZED, OVERHEATED):
        return Verdict(True, drain_reason, f"stopped at a checkpoint: {drain_reason}")
    if drain_reason == MEMORY_LEAK:
        retry = retries < spec.max_retries
        return Verdict(retry, RETRY if retry else None, "its GPU memory kept growing (a leak)")
    if drain_reason == INTERRUPTED or (run is not None and run.get("interrupted")):
        if interruptions < max_interruptions:
            return Verdict(True, INTERRUPTED, "spot interruption")
        return Verdict(False, reason=f"interrupted {interruptions} times; giving up")
    retries_left = retries < spec.max_retries
    if run is not None:
        exit_code = run.get("exit_code")
        if exit_code == 0:
            return Verdict(False)
        if isinstance(exit_code, int):
            if run.get("oom") and spec.retry_oom_with_more_memory and retries_left:
                return Verdict(True, OUT_OF_MEMORY, "the GPUs ran out of memory")
            if retries_left and _retryable_exit(spec, exit_code):
                return Verdict(True, RETRY, f"exit code {exit_code}")
            return Verdict(False)
        lost = str(run.get("reason") or "the node was lost")
        return Verdict(retries_left, RETRY if retries_left else None, lost)
    error = state.get("error")
    if isinstance(error, Mapping):
        name = str(error.get("Error", ""))
        silent = name == "States.HeartbeatTimeout" or (
            name == "States.Timeout"
            and ran_seconds is not None
            and ran_seconds < spec.timeout_seconds
        )
        if silent and retries_left:
            return Verdict(True, RETRY, "the node was lost: its heartbeats stopped")
        step_failed = name != "States.Timeout" and name not in JOB_ERRORS
        if step_failed and retries_left:
            return Verdict(True, RETRY, f"a control-plane step failed: {name or 'unknown error'}")
    return Verdict(False)
