"""After a run: requeue (checkpointed, interrupted, retryable) or the job's outcome."""

from __future__ import annotations

import pytest

from gpufleet.domain.retry import INTERRUPTED, PREEMPTED, RETRY, after_run
from gpufleet.domain.spec import JobSpec, parse_spec

SPEC = parse_spec(
    "name: a\nteam: t\nimage: i\ncommand: [x]\nmax_retries: 2\ntimeout: 1h\n"
    "retry_exit_codes: []\nno_retry_exit_codes: [2]\n"
)


def verdict(
    state: dict[str, object], spec: JobSpec = SPEC, **kwargs: object
) -> tuple[bool, str | None]:
    values: dict[str, object] = {
        "drain_reason": None,
        "retries": 0,
        "interruptions": 0,
        "ran_seconds": 60.0,
    }
    values.update(kwargs)
    result = after_run(spec, state, **values)  # type: ignore[arg-type]
    return result.requeue, result.kind


def test_success_and_cancellation_end_the_job() -> None:
    assert verdict({"run": {"exit_code": 0}}) == (False, None)
    assert verdict({"run": {"cancelled": True}}, drain_reason=PREEMPTED) == (False, None)


def test_a_checkpointed_run_is_always_requeued() -> None:
    assert verdict({"run": {"exit_code": 0}}, drain_reason=PREEMPTED) == (True, PREEMPTED)


def test_interruptions_requeue_up_to_a_cap_and_do_not_use_retries() -> None:
    assert verdict({"run": {"exit_code": 0}}, drain_reason=INTERRUPTED, retries=2) == (
        True,
        INTERRUPTED,
    )
    assert verdict({"run": {"exit_code": 0, "interrupted": True}}) == (True, INTERRUPTED)
    assert verdict({"run": {}}, drain_reason=INTERRUPTED, interruptions=10)[0] is False


@pytest.mark.parametrize(
    ("exit_code", "retries", "expected"),
    [(1, 0, True), (1, 2, False), (2, 0, False), (137, 1, True)],
)
def test_failed_runs_retry_per_the_spec(exit_code: int, retries: int, expected: bool) -> None:
    assert verdict({"run": {"exit_code": exit_code}}, retries=retries)[0] is expected


def test_an_allow_list_of_exit_codes_limits_retries() -> None:
    spec = SPEC.model_copy(update={"retry_exit_codes": [75]})
    assert verdict({"run": {"exit_code": 75}}, spec) == (True, RETRY)
    assert verdict({"run": {"exit_code": 1}}, spec) == (False, None)


def test_lost_nodes_are_retried_but_an_exceeded_timeout_is_final() -> None:
    assert verdict({"run": {"exit_code": None, "reason": "instance terminated"}}) == (True, RETRY)
    assert verdict({"error": {"Error": "States.HeartbeatTimeout"}}) == (True, RETRY)
    assert verdict({"error": {"Error": "States.Timeout"}}, ran_seconds=120.0) == (True, RETRY)
    assert verdict({"error": {"Error": "States.Timeout"}}, ran_seconds=4000.0) == (False, None)
    assert verdict({"launch": {"give_up": True}}) == (False, None)


def test_a_control_plane_step_that_kept_failing_is_retried_but_a_job_error_is_final() -> None:
    crashed = {"error": {"Error": "ProvisionedThroughputExceededException", "Cause": "..."}}
    assert verdict(crashed) == (True, RETRY)
    assert verdict(crashed, SPEC.model_copy(update={"max_retries": 0})) == (False, None)
    assert verdict({"error": {"Error": "NoFeasibleOffering", "Cause": "x"}}) == (False, None)
