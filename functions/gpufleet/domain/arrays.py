"""Arrays, sweeps and dependencies between jobs (docs/arrays.md): the one place of their rules.

- `child_spec`: what child `index` of an array or sweep runs (its index and sweep values in
  the environment).
- `submission_from_mapping`: one spec, or a top-level `jobs:` list of them; names unique,
  dependencies resolvable and acyclic, element-by-element dependencies between arrays of one
  size; refused whole otherwise (`SpecError`).
- `submission_job_ids`, `with_job_ids`: the id of each job of a submission, derived from the
  delivery, and a spec's dependencies on names of its submission rewritten as those ids.
- `child_job_id`, `array_status`, `status_counts`: each child's id, derived from its array's,
  and what an array's children's statuses add up to.
- `dependency_verdict`: whether a job (or child) whose dependencies ended as they did waits,
  may run, or ends CANCELLED with the reason.
"""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from enum import StrEnum

from gpufleet.domain.job import (
    TERMINAL_STATUSES,
    Job,
    JobStatus,
    is_job_id,
    job_id_for_delivery,
)
from gpufleet.domain.spec import (
    ARRAY_INDEX_ENV,
    BATCH_ARRAY_INDEX_ENV,
    DEPENDENCY_ENDS,
    Dependency,
    DependencyMode,
    FieldError,
    JobSpec,
    SpecError,
    SweepValue,
    spec_from_mapping,
)

MAX_SUBMISSION_JOBS = 100


def env_value(value: SweepValue) -> str:
    """A sweep value as the child's environment holds it: a string as written, a number or a
    flag in its JSON form (32, 0.001, true)."""
    return value if isinstance(value, str) else json.dumps(value)


def child_env(spec: JobSpec, index: int) -> dict[str, str]:
    """What child `index` finds in its environment besides the spec's env."""
    if not 0 <= index < spec.size:
        raise ValueError(f"child {index} of an array of {spec.size}")
    env = {ARRAY_INDEX_ENV: str(index), BATCH_ARRAY_INDEX_ENV: str(index)}
    if spec.sweep is not None:
        env |= {name: env_value(value) for name, value in spec.sweep.point(index).items()}
    return env


def child_spec(spec: JobSpec, index: int) -> JobSpec:
    """What child `index` runs: the spec without its array or sweep, its index and sweep values
    laid over its env. Dependencies are the parent's (resolved per child by
    `dependency_verdict`)."""
    return spec.model_copy(
        update={"env": {**spec.env, **child_env(spec, index)}, "array": None, "sweep": None}
    )


def child_job_id(array_id: str, index: int) -> str:
    """Child `index`'s id, derived from its array's (itself derived from the delivery): a
    redelivery names the same children, and anyone holding the array's id finds them."""
    return job_id_for_delivery(f"{array_id}#{index}")


def status_counts(statuses: Iterable[JobStatus]) -> dict[JobStatus, int]:
    """How many children are in each status, every status listed (0 for none), in the
    lifecycle's order."""
    counted = Counter(statuses)
    return {status: counted[status] for status in JobStatus}


def array_status(statuses: Sequence[JobStatus]) -> JobStatus:
    """An array's status, from its children's, as AWS Batch reports an array job's: ended once
    every child ended, SUCCEEDED only if every child succeeded, FAILED if any failed (else
    CANCELLED); before that RUNNING once a child launched, else QUEUED."""
    if not statuses:
        raise ValueError("an array has at least one child")
    if all(status.terminal for status in statuses):
        if all(status is JobStatus.SUCCEEDED for status in statuses):
            return JobStatus.SUCCEEDED
        return JobStatus.FAILED if JobStatus.FAILED in statuses else JobStatus.CANCELLED
    started = {JobStatus.LAUNCHING, JobStatus.RUNNING, *TERMINAL_STATUSES}
    return JobStatus.RUNNING if any(s in started for s in statuses) else JobStatus.QUEUED


@dataclass(frozen=True)
class Submission:
    """The jobs one delivery submits, in an order where each comes after those it names."""

    jobs: tuple[JobSpec, ...]

    @property
    def children(self) -> int:
        return sum(spec.size for spec in self.jobs)


def submission_from_mapping(document: object) -> Submission:
    """One spec, or `{jobs: [spec, ...]}`; `SpecError` naming every problem otherwise."""
    if not (isinstance(document, dict) and "jobs" in document):
        return Submission(jobs=_ordered([spec_from_mapping(document)]))
    listed = document["jobs"]
    if set(document) != {"jobs"}:
        raise SpecError("a submission of several jobs holds only `jobs`")
    if not isinstance(listed, list) or not 1 <= len(listed) <= MAX_SUBMISSION_JOBS:
        raise SpecError(f"`jobs` is a list of 1 to {MAX_SUBMISSION_JOBS} job specs")
    specs: list[JobSpec] = []
    problems: list[FieldError] = []
    for at, item in enumerate(listed):
        try:
            specs.append(spec_from_mapping(item))
        except SpecError as exc:
            problems += [
                FieldError(field=f"jobs[{at}].{p.field}", message=p.message)
                for p in exc.fields or [FieldError(field="(document)", message=exc.message)]
            ]
    if problems:
        raise SpecError(f"{len(problems)} invalid field(s) in the submission", problems)
    return Submission(jobs=_ordered(specs))


def submission_job_ids(submission: Submission, delivery_key: str) -> dict[str, str]:
    """Each job's id by name, derived from the delivery (`job_id_for_delivery`): a redelivery
    names the same jobs. A submission of one job keeps the delivery's own id."""
    if len(submission.jobs) == 1:
        return {submission.jobs[0].name: job_id_for_delivery(delivery_key)}
    return {
        spec.name: job_id_for_delivery(f"{delivery_key}#{spec.name}") for spec in submission.jobs
    }


def with_job_ids(spec: JobSpec, job_ids: Mapping[str, str]) -> JobSpec:
    """The spec as stored: each dependency on a job of its submission names that job's id."""
    if not spec.depends_on:
        return spec
    depends_on = [
        dep.model_copy(update={"job": job_ids.get(dep.job, dep.job)}) for dep in spec.depends_on
    ]
    return spec.model_copy(update={"depends_on": depends_on})


def _ordered(specs: Sequence[JobSpec]) -> tuple[JobSpec, ...]:
    """The specs in dependency order (Kahn's algorithm), or `SpecError` for an unknown name,
    a mismatched element-by-element dependency or a cycle."""
    by_name = {spec.name: spec for spec in specs}
    if len(by_name) != len(specs):
        raise SpecError("the jobs of one submission have distinct names")
    problems: list[FieldError] = []
    for at, spec in enumerate(specs):
        for d, dep in enumerate(spec.depends_on):
            field = f"jobs[{at}].depends_on[{d}]" if len(specs) > 1 else f"depends_on[{d}]"
            problem = _dependency_problem(spec, dep, by_name)
            if problem:
                problems.append(FieldError(field=field, message=problem))
    if problems:
        raise SpecError(f"{len(problems)} invalid dependenc(ies)", problems)
    order: list[JobSpec] = []
    waiting = {spec.name: {d.job for d in spec.depends_on if d.job in by_name} for spec in specs}
    while waiting:
        ready = [name for name, deps in waiting.items() if not deps]
        if not ready:
            raise SpecError(f"the dependencies form a cycle: {_cycle(waiting)}")
        for name in ready:
            order.append(by_name[name])
            del waiting[name]
        for deps in waiting.values():
            deps.difference_update(ready)
    return tuple(order)


def _dependency_problem(spec: JobSpec, dep: Dependency, by_name: Mapping[str, JobSpec]) -> str:
    if dep.job == spec.name:
        return "a job cannot depend on itself"
    named = by_name.get(dep.job)
    if named is None and not is_job_id(dep.job):
        return f"{dep.job!r} is neither a job id nor a job of this submission"
    if dep.mode is DependencyMode.ELEMENT and named is not None and named.size != spec.size:
        return (
            f"element by element needs arrays of one size: {spec.name!r} has {spec.size} "
            f"children, {dep.job!r} {named.size}"
        )
    return ""


def _cycle(waiting: Mapping[str, set[str]]) -> str:
    """One cycle among jobs that all still wait, as `a -> b -> a`."""
    path = [min(waiting)]
    while path.count(path[-1]) < 2:
        path.append(min(waiting[path[-1]]))
    start = path.index(path[-1])
    return " -> ".join(path[start:])


class Readiness(StrEnum):
    WAIT = "wait"
    RUN = "run"
    CANCEL = "cancel"


@dataclass(frozen=True)
class DependencyVerdict:
    readiness: Readiness
    reason: str = ""


def dependency_verdict(
    dependencies: Sequence[tuple[Dependency, Sequence[JobStatus]]], index: int | None = None
) -> DependencyVerdict:
    """Whether a job, or child `index` of an array, may run: each dependency with the statuses
    of its children in index order (one status for a plain job). CANCEL, with the reason, as
    soon as a success dependency ended otherwise; RUN once every dependency is met; else WAIT."""
    waits = False
    for dep, statuses in dependencies:
        if dep.mode is DependencyMode.ELEMENT:
            if index is None or not 0 <= index < len(statuses):
                raise ValueError(f"no element {index} of {dep.job!r}'s {len(statuses)}")
            statuses = [statuses[index]]
        failed = [s for s in statuses if s.terminal and s is not JobStatus.SUCCEEDED]
        if dep.on == "success" and failed:
            return DependencyVerdict(
                Readiness.CANCEL, f"dependency {dep.job} ended {failed[0].value}"
            )
        waits = waits or not all(s in TERMINAL_STATUSES for s in statuses)
    return DependencyVerdict(Readiness.WAIT if waits else Readiness.RUN)


def held_on(
    dependencies: Sequence[tuple[Dependency, Sequence[JobStatus]]], index: int | None = None
) -> Dependency | None:
    """The dependency a job that waits (`dependency_verdict`) is held on, out of the admission
    queue's streams until that dependency settles (`settles`): the first, not element by
    element, whose own verdict waits; else the first element that waits (`element_of`: child
    `index` waits for the dependency's child of its index alone). None when the job does not
    wait (it runs or is cancelled)."""
    if dependency_verdict(dependencies, index).readiness is not Readiness.WAIT:
        return None
    for dep, statuses in dependencies:
        if dep.mode is not DependencyMode.ELEMENT and not settles(dep, statuses):
            return dep
    for dep, statuses in dependencies:
        if dep.mode is DependencyMode.ELEMENT and index is not None:  # the verdict checked it
            element = element_of(dep, index)
            if not settles(element, [statuses[index]]):
                return element
    return None


def holds_settled_by(job_id: str, array_id: str | None = None) -> frozenset[Dependency]:
    """The holds (`held_on`) a job's end may settle: on the job itself, and for a child of
    array `array_id`, on the child as an element (`element_of`) and on its array (which
    settles with its last child, or with a child that did not succeed). Only a job's end
    that finds none of them holding a job may go without waking a pass."""
    holds = {Dependency(job=job_id, on=on) for on in DEPENDENCY_ENDS}
    if array_id is not None:
        holds |= {
            Dependency(job=job_id, on=on, mode=DependencyMode.ELEMENT) for on in DEPENDENCY_ENDS
        }
        holds |= {Dependency(job=array_id, on=on) for on in DEPENDENCY_ENDS}
    return frozenset(holds)


def element_of(dep: Dependency, index: int) -> Dependency:
    """What child `index` of an array waiting element by element on `dep` is held on: the
    dependency's child of that index, a plain job, marked `element` (a pass reads the statuses
    of such holds in batches, knowing each is one child's)."""
    return Dependency(job=child_job_id(dep.job, index), on=dep.on, mode=DependencyMode.ELEMENT)


def settles(dep: Dependency, statuses: Sequence[JobStatus]) -> bool:
    """Whether the jobs held on `dep` are to be judged again: its own verdict no longer waits
    (it ended, or, for `on: success`, one of its children ended other than SUCCEEDED). A hold
    on an element (`element_of`) has its one child's status."""
    index = 0 if dep.mode is DependencyMode.ELEMENT else None
    return dependency_verdict([(dep, statuses)], index).readiness is not Readiness.WAIT


def shared_plan_key(job: Job) -> str | None:
    """What a child of an array shares its plan by: children of one key are planned alike (their
    specs differ only in their environment, which no plan reads), so one plan serves them all
    while the plan's other inputs (the catalog, the team's past runs, the reservations) stand.
    The key holds the child's own inputs of a plan: its array, its stage, a resize, its giving
    up on spot, its spot history. None for a job that is not a child."""
    if job.array_id is None:
        return None
    override = job.resources_override.model_dump_json() if job.resources_override else ""
    own = (job.stage_index, override, job.on_demand_only, job.interruptions, job.spot_held_seconds)
    return json.dumps([job.array_id, *own])
