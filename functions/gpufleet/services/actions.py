"""What a running job's metric alarms do (docs/fleet.md, "Metric-driven actions").

- idle: an elastic job above its `min_nodes` gives back a step of nodes; any other job (or an
  elastic one at its min) is flagged, and released when its spec says `on_idle: release`.
- busy (GPU utilization high) and scaleon (the job's own `scale_on` metric): an elastic job
  below its `max_nodes` gets a step more nodes. Other jobs get neither alarm.
- hot: alert (SNS) and move the job to other hardware.
- leak (GPU memory used grew in every period): alert, flag and restart the job (a retry).

A change of shape is a resize: the job checkpoints, is released, requeued and resumes on the
new number of nodes, keeping its id and history; its next launch gets alarms for that shape.
Alarms go off once per state change and EventBridge may deliver twice: a job already draining
or no longer running is left alone.
"""

from __future__ import annotations

from collections.abc import Callable

from gpufleet.domain.config import MetricPolicy
from gpufleet.domain.job import Job, JobChanges, JobStatus
from gpufleet.domain.scaling import AlarmKind, scaled_in, scaled_out
from gpufleet.domain.settlement import IDLE, MEMORY_LEAK, OVERHEATED
from gpufleet.domain.spec import Resources
from gpufleet.ports import Ports
from gpufleet.services.lifecycle import LifecycleService
from gpufleet.topology import CONTROL_PLANE_SOURCE, DETAIL_JOB_FLAGGED, DETAIL_JOB_SCALED

FLAG_LOW_UTILIZATION = "low-utilization"
FLAG_OVERHEATING = "overheating"
FLAG_SCALED_OUT = "scaled-out"
FLAG_SCALED_IN = "scaled-in"
FLAG_MEMORY_LEAK = "memory-leak"


class MetricActions:
    def __init__(self, ports: Ports, lifecycle: LifecycleService, policy: MetricPolicy) -> None:
        self._ports = ports
        self._lifecycle = lifecycle
        self._policy = policy

    def on_alarm(self, job_id: str, kind: AlarmKind) -> list[str]:
        """Act on one of the job's alarms going off; return the job's flags after."""
        actions: dict[AlarmKind, Callable[[str], list[str]]] = {
            AlarmKind.IDLE: self.gpus_idle,
            AlarmKind.HOT: self.gpus_hot,
            AlarmKind.LEAK: self.memory_leak,
            AlarmKind.BUSY: self.scale_out,
            AlarmKind.SCALE_ON: self.scale_out,
        }
        return actions[kind](job_id)

    def gpus_idle(self, job_id: str) -> list[str]:
        """An elastic job above its min gives back a step of nodes; any other job is flagged
        (or released, as its spec says)."""
        job = self._ports.jobs.get(job_id)
        smaller = scaled_in(job.effective_spec.resources, self._policy.scale_step_nodes)
        if smaller is None:
            return self._idle(job)
        if not _steady(job):
            return job.flags
        return self._resize(job, smaller, FLAG_SCALED_IN)

    def _idle(self, job: Job) -> list[str]:
        """Flag the job, and checkpoint-and-release it when its spec says so."""
        if job.status is not JobStatus.RUNNING:
            return job.flags
        # The action is asked for before the flag says so: a run that ends once it is flagged
        # (its owner watching the flag) must still end as a drained one.
        if job.effective_spec.on_idle == "release":
            self._lifecycle.drain(job.job_id, IDLE)
        return self._flag(job, FLAG_LOW_UTILIZATION)

    def gpus_hot(self, job_id: str) -> list[str]:
        """A GPU of the job ran above the temperature limit: tell the operators, and move the
        job off that hardware (checkpoint, requeue, resume elsewhere)."""
        job = self._ports.jobs.get(job_id)
        if job.status is not JobStatus.RUNNING:
            return job.flags
        self._ports.notifier.notify(
            f"gpufleet: job {job.spec.name} overheating",
            f"A GPU of job {job_id} ({job.spec.name}, team {job.spec.team}){_where(job)} ran "
            f"above {self._policy.hot_temperature_celsius:g} C. The job is checkpointed and "
            "moved to other hardware; check the instance's cooling and health.",
        )
        self._lifecycle.drain(job_id, OVERHEATED)  # before the flag, as for an idle job
        return self._flag(job, FLAG_OVERHEATING)

    def scale_out(self, job_id: str) -> list[str]:
        """Busy GPUs, or the job's own metric says it is short of them: a step more nodes, up
        to its max."""
        job = self._ports.jobs.get(job_id)
        larger = scaled_out(job.effective_spec.resources, self._policy.scale_step_nodes)
        if larger is None or not _steady(job):
            return job.flags
        return self._resize(job, larger, FLAG_SCALED_OUT)

    def memory_leak(self, job_id: str) -> list[str]:
        """GPU memory used grew in every period of the window: tell the operators and restart
        the job from its checkpoint before it runs out (a retry). A job with no retries left
        is only flagged: it runs on until it ends or runs out of memory."""
        job = self._ports.jobs.get(job_id)
        if job.status is not JobStatus.RUNNING:
            return job.flags
        restart = _steady(job) and job.retries < job.spec.max_retries
        then = (
            "It is checkpointed and restarted (counted as a retry)."
            if restart
            else "It has no retries left and keeps running: it may run out of GPU memory."
        )
        self._ports.notifier.notify(
            f"gpufleet: job {job.spec.name} leaks GPU memory",
            f"The GPU memory used by job {job_id} ({job.spec.name}, team {job.spec.team})"
            f"{_where(job)} "
            f"grew in each of the last {self._policy.memory_leak_periods} periods of "
            f"{self._policy.period_seconds} s. {then}",
        )
        if restart:
            self._lifecycle.drain(job_id, MEMORY_LEAK)  # before the flag, as for an idle job
        return self._flag(job, FLAG_MEMORY_LEAK)

    def _flag(self, job: Job, flag: str) -> list[str]:
        """Add `flag` to the job's flags and say so on the bus (`Job Flagged`)."""
        flags = sorted({*job.flags, flag})
        self._ports.jobs.update(job.job_id, self._ports.clock.now(), JobChanges(flags=flags))
        self._ports.events.publish(
            CONTROL_PLANE_SOURCE, DETAIL_JOB_FLAGGED, {"job_id": job.job_id, "flags": flags}
        )
        return flags

    def _resize(self, job: Job, resources: Resources, flag: str) -> list[str]:
        flags = sorted({*job.flags, flag})
        self._ports.jobs.update(job.job_id, self._ports.clock.now(), JobChanges(flags=flags))
        self._lifecycle.resize(job.job_id, resources)
        self._ports.events.publish(
            CONTROL_PLANE_SOURCE,
            DETAIL_JOB_SCALED,
            {
                "job_id": job.job_id,
                "nodes": resources.nodes,
                "previous_nodes": job.effective_spec.resources.nodes,
            },
        )
        return flags


def _where(job: Job) -> str:
    placement = job.placement
    return f" on {', '.join(placement.instance_ids)}" if placement else ""


def _steady(job: Job) -> bool:
    """Running and not already asked to stop: a shape change or restart may start now."""
    return job.status is JobStatus.RUNNING and job.drain_reason is None
