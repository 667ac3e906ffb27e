"""The lifecycle's history quota (docs/aws-fidelity.md F5): the worst case of each way through
the definition, counted here from the ASL, is what `domain/history.py` budgets with, and the
budget keeps every execution under Step Functions' 25,000 events."""

from __future__ import annotations

import re
from itertools import pairwise

import pytest

from gpufleet.domain import history
from gpufleet.domain.history import (
    HISTORY_EVENT_LIMIT,
    HISTORY_EVENT_TARGET,
    execution_name,
    job_of_execution,
    requeue_budget,
    worst_history,
)
from gpufleet.settings import Settings
from tests.unit.test_lifecycle_definition import DEFINITION, STATES

EXECUTION_STARTED = EXECUTION_ENDED = 1
DEFAULT_LAUNCH_ATTEMPTS: int = Settings.model_fields["max_launch_attempts"].default
JOB_ID = "j-" + "0123456789" * 2


def events_of(name: str) -> int:
    """The most events a state adds to the history: entered and exited, and for a Task each
    attempt its retriers allow scheduled, started, submitted and ended."""
    state = STATES[name]
    if state["Type"] != "Task":
        return 2
    attempts = 1 + sum(retrier["MaxAttempts"] for retrier in state.get("Retry", []))
    return 2 + 4 * attempts


def successors(name: str) -> set[str]:
    state = STATES[name]
    nexts = {state.get("Next"), state.get("Default")}
    nexts |= {choice["Next"] for choice in state.get("Choices", [])}
    nexts |= {catcher["Next"] for catcher in state.get("Catch", [])}
    return {n for n in nexts if n is not None}


def events_along(*path: str) -> int:
    """The events of a way through the definition, each state one the last can go to."""
    for here, there in pairwise(path):
        assert there in successors(here), f"{here} does not go to {there}"
    return sum(events_of(name) for name in path)


def longest_way_out(name: str, avoiding: frozenset[str]) -> int:
    """The most events from `name` to the execution's end without entering `avoiding`."""
    ways = [longest_way_out(n, avoiding) for n in successors(name) - avoiding]
    return events_of(name) + (max(ways) if ways else EXECUTION_ENDED)


def test_the_budgets_worst_cases_are_the_definitions() -> None:
    assert DEFINITION["StartAt"] == "Waits for admission?"
    first_run = ("Waits for admission?", "Enqueue", "Admitted?", "Launch")
    assert EXECUTION_STARTED + events_along(*first_run) - events_of("Launch") == (
        history.EVENTS_TO_FIRST_RUN
    )
    requeue = ("Release", "Requeue?", "Requeue", "ContinuedAsNew?", "Enqueue", "Admitted?")
    assert events_along(*requeue, "Launch") - events_of("Launch") == history.EVENTS_PER_REQUEUE
    round_ = ("Launch", "Launched?", "NextLaunchStep", "LaunchAgain?", "WaitForCapacity")
    assert events_along(*round_, "Launch") - events_of("Launch") == history.EVENTS_PER_LAUNCH_ROUND
    # The round that launches is shorter than one that waits for capacity.
    assert events_along("Launch", "Launched?", "Release") - events_of("Release") <= (
        history.EVENTS_PER_LAUNCH_ROUND
    )
    here = ("Release", "Requeue?", "NextStageHere")
    assert events_along(*here, "Launch") - events_of("Launch") == history.EVENTS_PER_STAGE_HERE
    # From a run's end, the longest way to the execution's end that runs nothing more.
    runs = frozenset({"Enqueue", "Launch"})
    assert longest_way_out("Release", runs) == history.EVENTS_TO_END


@pytest.mark.parametrize("max_launch_attempts", [1, DEFAULT_LAUNCH_ATTEMPTS, 30, 40])
def test_the_requeue_budget_keeps_an_execution_well_under_the_history_quota(
    max_launch_attempts: int,
) -> None:
    budget = requeue_budget(max_launch_attempts)
    assert budget >= 1
    worst = worst_history(max_launch_attempts, budget)
    assert worst <= HISTORY_EVENT_TARGET < HISTORY_EVENT_LIMIT
    # Each requeue in place adds its cycle and a run of every launch round; the budget is the
    # most that fit.
    per_requeue = history.EVENTS_PER_REQUEUE + max_launch_attempts * history.EVENTS_PER_LAUNCH_ROUND
    assert worst_history(max_launch_attempts, budget + 1) == worst + per_requeue
    assert worst + per_requeue > HISTORY_EVENT_TARGET


def test_the_default_settings_budget_requeues_and_refuse_launch_rounds_that_leave_none() -> None:
    # 20 launch rounds a run: 952 events a requeue at worst, 11 of them in place.
    assert DEFAULT_LAUNCH_ATTEMPTS == 20 and requeue_budget(20) == 11
    with pytest.raises(ValueError, match="leaves no requeue"):
        requeue_budget(100)


def test_a_continued_execution_is_named_after_its_job_and_tells_it_back() -> None:
    assert execution_name(JOB_ID, 0) == JOB_ID
    for continuation in (1, 9, 10, 10**9):
        name = execution_name(JOB_ID, continuation)
        # Step Functions: at most 80 characters; letters, digits, - and _ are safe.
        assert re.fullmatch(r"[A-Za-z0-9_-]{1,80}", name)
        assert job_of_execution(name) == (JOB_ID, continuation)
    assert job_of_execution(JOB_ID) == (JOB_ID, 0)
    # A name of another form is its own first execution (a job id has no `-<n>` tail).
    assert job_of_execution("other-1") == ("other-1", 0)
    assert job_of_execution(f"{JOB_ID}-0") == (f"{JOB_ID}-0", 0)
