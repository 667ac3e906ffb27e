"""The steps of a job's lifecycle, each called by one task of the state machine or one event,
as one service: its parts live in one module per trigger.

- `queue_steps`: Prepare (a new job's first plan, at intake), Enqueue, Requeue.
- `launch_steps`: Launch, one step of the plan.
- `run_reports`: a node's start, heartbeats and finish; spot warnings and instances gone.
- `release_steps`: Release (the run's end, settled by `domain.settlement`) and the end of a job
  whose workflow ended without settling it.
- `job_commands`: cancel, resize, budget stops.
- `lifecycle_base`: what they share (status moves, plans, drains, the run manifest).
"""

from __future__ import annotations

from gpufleet.services.job_commands import JobCommands
from gpufleet.services.launch_steps import LaunchSteps
from gpufleet.services.queue_steps import QueueSteps
from gpufleet.services.release_steps import ReleaseSteps
from gpufleet.services.run_reports import RunReports


class LifecycleService(QueueSteps, LaunchSteps, RunReports, ReleaseSteps, JobCommands):
    """Every step of a job's lifecycle, on one set of ports, one planner and one policy."""
