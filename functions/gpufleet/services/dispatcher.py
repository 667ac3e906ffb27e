"""The dispatcher: one admission pass over the queue, applied exactly once.

A job that arrives when nothing waits is admitted by its own Enqueue task, with the same policy
and the same conditional write (`enqueue`). Passes are triggered by `Job Queued` and `Capacity
Freed` events and by a schedule (which also catches time window boundaries). Several can run
at once: a pass's admissions are written as many to one conditional transaction as fit (each
queue item must still exist, the caps and the teams' quotas must still have room for them all:
`adapters/admission_batches.py`), so a job is never admitted twice and no quota is exceeded,
whoever wins.

A job that depends on others (docs/arrays.md) reaches the policy only once
`arrays.dependency_verdict` says it may run: until then it waits out of the policy's sight (it
holds no reservation and blocks no backfill), and it ends CANCELLED, never admitted, as soon as
the verdict says so. A job's end wakes a pass (`Job Status Changed`, terminal statuses), so its
dependants are judged again. A job that waits for a dependency is held apart from its stream
(`QueueEntry.held_on`), so a pass reads none of the jobs held: it reads the holds with the queue's
state, one a dependency, and moves the jobs of each that settled back to their streams first.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field, replace
from itertools import islice

from gpufleet.domain.arrays import Readiness
from gpufleet.domain.cost import month_start
from gpufleet.domain.fair_share import usage_by_team
from gpufleet.domain.job import JobChanges, JobNotFound
from gpufleet.domain.planning import LaunchPlan
from gpufleet.domain.queueing import (
    Admission,
    QueuedJob,
    QueuePolicy,
    RunningJob,
    Stream,
    WaitingJobs,
    admission_limits,
    decide,
    decide_streams,
)
from gpufleet.domain.settlement import PREEMPTED, RECLAIMED, WINDOW
from gpufleet.domain.spec import Dependency
from gpufleet.errors import TransientError
from gpufleet.ports import (
    NO_WORKFLOW_YET,
    AdmissionRequest,
    Ports,
    QueueEntry,
    QueueState,
    RunningEntry,
)
from gpufleet.services.lifecycle import LifecycleService
from gpufleet.services.lifecycle_base import JobAlreadyEnded
from gpufleet.services.pass_reads import WAITS_FOR_DEPENDENCIES, DependencyStatuses, team_spend

# Held jobs a pass moves at most (of dependencies that settled); the next pass moves the rest.
MOVED_PER_PASS = 1000


@dataclass
class PassResult:
    admitted: list[str] = field(default_factory=list)
    cancelled: dict[str, str] = field(default_factory=dict)  # a dependency ended: why
    preempted: list[str] = field(default_factory=list)
    reclaimed: list[str] = field(default_factory=list)
    window_drained: list[str] = field(default_factory=list)  # their class's window began
    forced: list[str] = field(default_factory=list)
    lost_races: int = 0
    waiting: dict[str, str] = field(default_factory=dict)  # of the jobs the pass considered
    blocked: dict[str, str] = field(default_factory=dict)  # "team/class" it stopped reading: why
    items_read: int = 0
    released: int = 0  # held jobs moved out of their hold: their dependency settled
    waited_seconds: list[float] = field(default_factory=list)  # of each admission
    over_budget: list[str] = field(default_factory=list)  # stopped: cost reached the budget
    state: QueueState | None = None  # as the pass began (for the gauges)


class DispatcherService:
    def __init__(
        self,
        ports: Ports,
        lifecycle: LifecycleService,
        policy: QueuePolicy,
    ) -> None:
        self._ports = ports
        self._lifecycle = lifecycle
        self._policy = policy
        # Whether Step Functions throttled a start of an admitted child during this pass.
        self._starts_throttled = False
        # The plans of the children this pass starts, shared within an array (`start_admitted`):
        # a pass plans an array's children once, with the catalog and history of that moment.
        self._plans: dict[str, LaunchPlan] = {}

    def enqueue(self, queued: QueuedJob, task_token: str, plan: LaunchPlan) -> bool:
        """A job arrives at the queue (the workflow's Enqueue task). When nothing waits and
        the policy admits it now, it is admitted at once, in one read of the queue's state and
        one write, with no pass to wake (True); otherwise it waits for the passes, in its
        place (False)."""
        self._plans = {}  # none kept from a pass before
        entry = self._lifecycle.queue_entry(queued, task_token, plan)  # held, if it waits
        if self._admit_on_arrival(entry):
            return True
        self._lifecycle.enqueue(entry)
        return False

    def _admit_on_arrival(self, entry: QueueEntry) -> bool:
        ports, policy = self._ports, self._policy
        now = ports.clock.now()
        state = ports.queue.state()
        job_id = entry.job.job_id
        if any(state.waiting.values()) or any(r.job.job_id == job_id for r in state.running):
            return False  # others wait (the passes keep the order), or it is admitted already
        if entry.job.depends_on:
            return False  # the pass its arrival wakes judges its dependencies
        decision = decide(
            [entry.job],
            [r.job for r in state.running],
            state.bookings,
            now,
            policy,
            team_spend_usd=team_spend(ports, policy, now),
        )
        if not decision.admitted:
            return False  # it waits (or needs room made): the passes decide
        return self._admit(entry, decision.admitted[0], state, now, waiting=False)

    def run_pass(self, full: bool = True) -> PassResult:
        """One admission pass. It reads the streams (team, class) the queue's counters say
        are not empty, each lazily and only as far as `decide_streams` asks; a `full` pass
        (the schedule's) also stops the running jobs of teams over their monthly budget."""
        ports, policy = self._ports, self._policy
        now = ports.clock.now()
        read_before = ports.queue.items_read()
        result = PassResult()
        self._starts_throttled = False
        self._plans = {}
        dependencies = DependencyStatuses(ports.jobs)
        state = ports.queue.state()
        result.released = self._release_settled(state.holds, dependencies)
        if result.released:
            state = ports.queue.state()
        running, bookings = state.running, state.bookings
        result.state = state
        self._notify_admitted(running)
        result.forced = self._stop_overdue(running, now)
        result.over_budget = [
            r.job.job_id
            for r in running
            if r.job.stop_at is not None
            and r.job.stop_at <= now
            and self._lifecycle.over_budget(r.job.job_id)
        ]
        spend = team_spend(ports, policy, now)
        if full:
            result.over_budget += self._stop_teams_over_budget(running, spend, now)
        read: dict[str, QueueEntry] = {}  # the entries of the jobs the pass read
        held: dict[str, str] = {}  # read, but not for the policy: waits for dependencies
        cancels: dict[str, str] = {}  # read, and to be cancelled: why

        def jobs_of(entries: Iterator[QueueEntry]) -> Iterator[QueuedJob]:
            for entry in entries:
                verdict = dependencies.verdict(entry.job)
                if verdict.readiness is Readiness.WAIT:
                    held[entry.job.job_id] = WAITS_FOR_DEPENDENCIES
                    continue
                if verdict.readiness is Readiness.CANCEL:
                    cancels[entry.job.job_id] = verdict.reason
                    continue
                read[entry.job.job_id] = entry
                yield entry.job

        streams = [
            Stream(team, priority, shapes, jobs_of(ports.queue.stream(team, priority)))
            for (team, priority), shapes in sorted(state.streams.items())
        ]
        decision = decide_streams(
            WaitingJobs(streams, state.nominees),
            [r.job for r in running],
            bookings,
            now,
            policy,
            team_spend_usd=spend,
            team_usage=usage_by_team(state.team_usage, now, policy.fair_share_half_life_seconds),
        )
        nominees = {job.job_id: job for job in state.nominees}
        requests = []
        for admission in decision.admitted:
            # A nominee is considered before its stream is read: its entry is fetched.
            entry = read.get(admission.job_id) or ports.queue.waiting_entry(
                nominees[admission.job_id]
            )
            if entry is None:
                result.lost_races += 1
            else:
                requests.append(self._admission_request(entry, admission, state, now))
        # As many admissions to a transaction as fit; each job is then told as before.
        admitted = set(ports.queue.admit_all(requests))
        for request in requests:
            if request.job.job_id in admitted:
                self._tell(request.entry, state, now)
                result.admitted.append(request.job.job_id)
                result.waited_seconds.append(max(0.0, now - request.entry.queued_at))
            else:
                result.lost_races += 1
        for preemption in decision.preemptions:
            preemptor = read.get(preemption.for_job_id)
            for_job = preemptor.job if preemptor else nominees[preemption.for_job_id]
            if ports.queue.preempt(preemption.victim_id, for_job):
                self._lifecycle.drain(preemption.victim_id, PREEMPTED, preemption.for_job_id)
                ports.jobs.update(
                    preemption.victim_id, now, JobChanges(preempted_for=preemption.for_job_id)
                )
                result.preempted.append(preemption.victim_id)
        for job_id in decision.reclaims:
            if ports.queue.mark_draining(job_id, "reserve"):
                self._lifecycle.drain(job_id, RECLAIMED)
                result.reclaimed.append(job_id)
        for job_id in decision.window_drains:
            if ports.queue.mark_draining(job_id, WINDOW):
                self._lifecycle.drain(job_id, WINDOW)
                result.window_drained.append(job_id)
        for job_id, reason in cancels.items():
            if self._cancel(job_id, reason):
                result.cancelled[job_id] = reason
        result.waiting = held | {
            job_id: reason.value for job_id, reason in decision.waiting.items()
        }
        result.blocked = {
            f"{team}/{priority.value}": reason.value
            for (team, priority), reason in decision.blocked_streams.items()
        }
        result.items_read = ports.queue.items_read() - read_before
        return result

    def _release_settled(
        self, holds: frozenset[Dependency], dependencies: DependencyStatuses
    ) -> int:
        """The jobs held on a dependency that settled go to where they now wait: their stream,
        or the next dependency they wait for; at most MOVED_PER_PASS a pass. What a pass
        leaves, or a crash cut short, the next one moves: a hold stays in the state until it
        holds no job. How many moved."""
        budget, moved = MOVED_PER_PASS, 0
        dependencies.read_elements(holds)
        for dependency in sorted(holds, key=lambda d: (d.job, d.on)):
            if budget == 0:
                break
            if not dependencies.settles(dependency):
                continue
            entries = list(islice(self._ports.queue.held(dependency), budget))
            budget -= len(entries)
            placed = [replace(e, held_on=dependencies.held_on(e.job)) for e in entries]
            moved += self._ports.queue.move_held(dependency, placed)
            if budget:  # it holds no more (a job held meanwhile keeps it)
                self._ports.queue.forget_hold(dependency)
        return moved

    def _cancel(self, job_id: str, reason: str) -> bool:
        """End a waiting job whose dependency ended as it may not: False when it left the
        queue meanwhile (another pass, an operator)."""
        try:
            self._lifecycle.cancel(job_id, reason)
        except (JobAlreadyEnded, JobNotFound):
            return False
        return True

    def _admit(
        self,
        entry: QueueEntry,
        admission: Admission,
        state: QueueState,
        now: float,
        *,
        waiting: bool = True,
    ) -> bool:
        """Admit the job under the caps and quotas, and tell its workflow."""
        request = self._admission_request(entry, admission, state, now)
        if not self._ports.queue.admit(entry, request.job, request.limits, waiting=waiting):
            return False
        self._tell(entry, state, now)
        return True

    def _admission_request(
        self, entry: QueueEntry, admission: Admission, state: QueueState, now: float
    ) -> AdmissionRequest:
        """The job as it runs once admitted, and the caps and quotas its write must hold within."""
        job = entry.job
        limits = admission_limits(job, admission, state.bookings, now, self._policy)
        running = RunningJob(
            job_id=job.job_id,
            team=job.team,
            priority=job.priority,
            gpus=job.gpus,
            instances=job.instances,
            admitted_at=now,
            borrowed=admission.borrowed,
            in_reserve=admission.in_reserve,
            preemptions=job.preemptions,
            expected_end=now + job.expected_seconds,
        )
        return AdmissionRequest(entry, running, limits)

    def _tell(self, entry: QueueEntry, state: QueueState, now: float) -> None:
        """Tell an admitted job's workflow (with when the latest capacity shortage the state
        knows of expires, for its launch)."""
        # The launch that follows notes the wait on the job, in the write it makes anyway.
        told = {
            "queued_at": entry.queued_at,
            "admitted_at": now,
            "shortages_until": state.shortages_until,
        }
        self._tell_admitted(entry.job.job_id, entry.task_token, told)

    def _stop_teams_over_budget(
        self, running: list[RunningEntry], spend: dict[str, float], now: float
    ) -> list[str]:
        """A team whose actual spend this month passed its monthly budget: its running jobs
        are stopped as its policy says (or only reported), on the schedule's passes."""
        stopped = []
        for team, spent in sorted(spend.items()):
            quota = self._policy.quota(team)
            budget = quota.monthly_budget_usd
            if budget is None or spent <= budget:
                continue
            jobs = [r.job.job_id for r in running if r.job.team == team and not r.job.draining]
            if quota.on_budget == "notify":
                # Once a month per team, not on every pass.
                if jobs and self._ports.queue.first_notice(
                    f"team-budget#{team}#{int(month_start(now))}"
                ):
                    self._ports.notifier.notify(
                        f"gpufleet: team {team} is over its monthly budget",
                        f"Team {team} has spent ${spent:.2f} this month, over its budget of "
                        f"${budget:.2f}; {len(jobs)} of its jobs still run (on_budget: notify).",
                    )
                continue
            what = f"team {team}'s monthly budget of ${budget:.2f} (spent ${spent:.2f})"
            stopped += [
                job_id
                for job_id in jobs
                if self._lifecycle.stop_for_budget(job_id, what, quota.on_budget)
            ]
        return stopped

    def _notify_admitted(self, running: list[RunningEntry]) -> None:
        """An admission whose workflow was never told (the dispatcher died in between, or the
        telling failed): told again, with when it was admitted (its wait is not known then)."""
        for entry in running:
            if not entry.notified:
                admitted = {"admitted_at": entry.job.admitted_at}
                self._tell_admitted(entry.job.job_id, entry.task_token, admitted)

    def _tell_admitted(self, job_id: str, token: str, admission: dict[str, float]) -> None:
        if token == NO_WORKFLOW_YET:
            # A child of an array: its workflow starts with its admission (docs/arrays.md).
            # Once Step Functions throttles this pass's starts, the rest wait for the next
            # pass, which tells every admission not yet told (`_notify_admitted`).
            if not self._starts_throttled:
                try:
                    self._lifecycle.start_admitted(job_id, admission, self._plans)
                except TransientError:
                    self._starts_throttled = True
            return
        if self._ports.workflow.complete_task(token, {"admitted": True, **admission}):
            return  # its launch marks it notified, in the write it makes anyway
        # The workflow no longer waits: if the job ended (cancelled, stopped), its share goes
        # back; otherwise the next pass tells it again.
        try:
            ended = self._ports.jobs.get(job_id).status.terminal
        except JobNotFound:
            ended = True
        if ended:
            self._ports.queue.release(job_id)

    def _stop_overdue(self, running: list[RunningEntry], now: float) -> list[str]:
        """Victims that did not checkpoint within the grace period are stopped by force; the
        work since their last checkpoint is lost, and they are requeued all the same."""
        forced = []
        for entry in running:
            if not entry.job.draining:
                continue
            job = self._ports.jobs.get(entry.job.job_id)
            started = job.drain_requested_at
            if started is None or now - started < self._policy.preemption_grace_seconds:
                continue
            self._ports.fleet.terminate_job_instances(job.job_id)
            if job.task_token is not None:
                self._ports.workflow.complete_task(
                    job.task_token,
                    {
                        "exit_code": None,
                        "reason": "stopped after the grace period",
                    },
                )
            forced.append(job.job_id)
        return forced
