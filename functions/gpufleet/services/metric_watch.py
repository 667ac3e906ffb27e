"""MetricWatch: once a minute, every running job's metrics against its alarms, in one pass.

The pass reads the series every running job's rules watch (`domain.scaling.job_alarm_rules`)
with as few `GetMetricData` calls as CloudWatch's limits allow (`metric_batches`: about 60 for
10,000 running jobs), decides each job's alarms (`evaluate_alarms`), records which are in ALARM
on the job (`Job.alarming`) and carries out the action of each that just went there
(`MetricActions`). Launching and releasing a job make no CloudWatch call at all.

Recording the state before acting makes a repeated pass (the schedule's events are delivered at
least once) harmless: it finds the alarm already in ALARM and acts no more. The state is written
only if the job was not written since it was listed (its version), so of two passes that
overlap only one acts; the actions themselves leave a job that is draining or no longer running
alone.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from gpufleet.domain.config import MetricPolicy
from gpufleet.domain.job import IllegalTransition, JobChanges, JobNotFound, JobStatus
from gpufleet.domain.scaling import (
    AlarmKind,
    AlarmRule,
    Series,
    SeriesQuery,
    evaluate_alarms,
    job_alarm_rules,
    metric_batches,
    watched_series,
)
from gpufleet.ports import Ports
from gpufleet.services.actions import MetricActions

# The most running jobs one pass reads (the jobs table's status index, newest first).
MAX_WATCHED_JOBS = 50_000


@dataclass
class WatchResult:
    jobs: int = 0  # running jobs watched
    calls: int = 0  # GetMetricData calls made
    fired: dict[str, list[str]] = field(default_factory=dict)  # job id -> alarms that acted


class MetricWatch:
    def __init__(self, ports: Ports, actions: MetricActions, policy: MetricPolicy) -> None:
        self._ports = ports
        self._actions = actions
        self._policy = policy

    def run(self) -> WatchResult:
        if not self._policy.enabled:
            return WatchResult()  # no job has alarms: nothing to read
        now = self._ports.clock.now()
        jobs = {
            job.job_id: job
            for job in self._ports.jobs.list_jobs(JobStatus.RUNNING, limit=MAX_WATCHED_JOBS)
        }
        rules: dict[str, tuple[AlarmRule, ...]] = {
            job_id: job_alarm_rules(job.effective_spec, self._policy)
            for job_id, job in jobs.items()
        }
        batches = metric_batches(watched_series(rules), now)
        series: dict[SeriesQuery, Series] = {}
        for batch in batches:
            series.update(self._ports.metrics.read(batch))
        result = WatchResult(jobs=len(jobs), calls=len(batches))
        for job_id, job in jobs.items():
            evaluation = evaluate_alarms(job_id, rules[job_id], series, job.alarming, now)
            if set(evaluation.alarming) == set(job.alarming):
                continue
            try:
                # Only if the job is as listed: of two passes that overlap, one acts.
                self._ports.jobs.transition(
                    job_id,
                    JobStatus.RUNNING,
                    now,
                    JobChanges(alarming=list(evaluation.alarming)),
                    sources=(JobStatus.RUNNING,),
                    version=job.version,
                )
            except (IllegalTransition, JobNotFound):
                continue  # written since it was listed: the next pass sees it as it is now
            for kind in evaluation.fired:
                self._actions.on_alarm(job_id, kind)
            if evaluation.fired:
                result.fired[job_id] = [kind.value for kind in evaluation.fired]
        return result


def fired_count(result: WatchResult, kind: AlarmKind) -> int:
    """How many jobs' `kind` alarm acted in the pass."""
    return sum(kind.value in kinds for kinds in result.fired.values())
