"""How long one execution of the job lifecycle may run before it continues as a new one.

A Standard workflow's execution holds at most 25,000 history events: the event that passes the
quota fails it (docs/aws-fidelity.md F5). Every requeue (a preemption, an interruption, a retry,
an elastic resize, a stage on new instances) loops Release -> Requeue -> Enqueue -> Launch in the
same execution, and preemptions and resizes are unbounded. So Requeue counts the cycles of its
execution and, past `requeue_budget`, starts the next execution of the job from the state it
rebuilt (`<job_id>-<n>`: a name is not reused for 90 days) and lets the current one succeed.

The worst cases below are counted over `statemachines/job_lifecycle.asl.json`
(tests/unit/test_history.py counts them again from the definition). A Task state is entered and
exited (2 events) and each of its attempts is scheduled, started, submitted and ends (4 events,
an upper bound for both `lambda:invoke` and `.waitForTaskToken`), with as many attempts as its
retriers allow (1 + the sum of their MaxAttempts). A Choice, Pass, Wait or Succeed state is
entered and exited (2 events).
"""

from __future__ import annotations

import re

from gpufleet.domain.job import JOB_ID_PATTERN
from gpufleet.domain.spec import MAX_STAGES

HISTORY_EVENT_LIMIT = 25_000
# Well under the quota: a fifth is left for what the count does not foresee.
HISTORY_EVENT_TARGET = 20_000

# Per attempt (9 for Release, 8 for the other Tasks): Release 38, Enqueue, Launch, Requeue 34.
# A run's end to the next Launch through the queue: Release, Requeue?, Requeue, ContinuedAsNew?,
# Enqueue, Admitted?.
EVENTS_PER_REQUEUE = 38 + 2 + 34 + 2 + 34 + 2
# A launch round: Launch, Launched?, NextLaunchStep, LaunchAgain?, WaitForCapacity (the round
# that launches, Launch and Launched?, is less). A run has at most `max_launch_attempts` rounds.
EVENTS_PER_LAUNCH_ROUND = 34 + 2 + 2 + 2 + 2
# A stage run on the last one's instances, without Requeue: Release, Requeue?, NextStageHere.
EVENTS_PER_STAGE_HERE = 38 + 2 + 2
# ExecutionStarted, then Waits for admission?, Enqueue and Admitted? before the first run (a
# child of an array, admitted before its execution starts, goes straight to Launch).
EVENTS_TO_FIRST_RUN = 1 + 2 + 34 + 2
# The longest way out: Release, Requeue?, Requeue, ContinuedAsNew?, a Succeed state,
# ExecutionSucceeded.
EVENTS_TO_END = 38 + 2 + 34 + 2 + 2 + 1

_CONTINUED = re.compile(rf"({JOB_ID_PATTERN.strip('^$')})-([1-9][0-9]*)")


def worst_history(max_launch_attempts: int, requeues: int) -> int:
    """The most history events an execution that requeues `requeues` times in place holds.

    It runs at most 1 + requeues + (MAX_STAGES - 1) runs (its first, one per requeue, one per
    stage run in place), each of at most `max_launch_attempts` launch rounds, and ends by the
    longest way out."""
    run = max_launch_attempts * EVENTS_PER_LAUNCH_ROUND
    return (
        EVENTS_TO_FIRST_RUN
        + EVENTS_TO_END
        + (MAX_STAGES - 1) * EVENTS_PER_STAGE_HERE
        + (MAX_STAGES + requeues) * run
        + requeues * EVENTS_PER_REQUEUE
    )


def requeue_budget(max_launch_attempts: int) -> int:
    """How many requeues one execution runs in place before the next one continues as new:
    the most whose `worst_history` stays within the target. Raises ValueError when not even
    one fits."""
    per_requeue = EVENTS_PER_REQUEUE + max_launch_attempts * EVENTS_PER_LAUNCH_ROUND
    budget = (HISTORY_EVENT_TARGET - worst_history(max_launch_attempts, 0)) // per_requeue
    if budget < 1:
        raise ValueError(
            f"max_launch_attempts {max_launch_attempts} leaves no requeue within "
            f"{HISTORY_EVENT_TARGET} history events per execution"
        )
    return budget


def execution_name(job_id: str, continuation: int) -> str:
    """The name of the job's `continuation`th execution: the job id, then `<job_id>-<n>`
    (at most 80 characters of letters, digits, - and _, as Step Functions allows)."""
    return job_id if continuation == 0 else f"{job_id}-{continuation}"


def job_of_execution(name: str) -> tuple[str, int]:
    """The job and continuation an execution's name stands for (`execution_name` reversed); a
    name of another form stands for itself, as the first execution."""
    match = _CONTINUED.fullmatch(name)
    if match is None:
        return name, 0
    return match.group(1), int(match.group(2))
