"""An array past Step Functions' StartExecution bucket on the embedded account
(docs/arrays.md, "Throttled starts"): its children are started across passes, each once, and
none is lost."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from gpufleet.adapters.aws.runtime import aws_ports
from gpufleet.emulator.account import Account
from gpufleet.emulator.demo import DemoScenario, Submission, run_demo
from gpufleet.emulator.nodes import Behaviour, NodeScenario
from gpufleet.emulator.throttling import BucketQuota
from gpufleet.settings import Settings
from tests.integration.test_arrays import ARRAY, executions

pytestmark = pytest.mark.long  # whole demos: scheduled first (tests/conftest.py)


def test_an_array_past_step_functions_bucket_is_started_across_passes_with_nothing_lost(
    tmp_path: Path,
) -> None:
    """Step Functions throttles StartExecution with a token bucket (the embedded account's,
    here a bucket of 1 refilled at 1 a second: AWS's own is 1,300 and 300 a second): one pass
    admits all 3 children but starts 1; the start it is throttled on waits, with the rest, for
    the passes that follow. Every child runs once, and nothing is left behind."""
    (tmp_path / "wide.json").write_text(json.dumps({**ARRAY, "name": "wide", "array": {"size": 3}}))
    seen: dict[str, Any] = {}

    def count_starts(account: Account) -> None:
        seen["throttled"] = account.start_executions.throttled
        seen["executions"] = executions(account)
        seen["queued"] = len(aws_ports(Settings.from_env(account.environment())).queue.waiting())

    result = run_demo(
        DemoScenario(
            name="throttled-starts",
            submissions=[Submission("s3", tmp_path / "wide.json")],
            nodes=NodeScenario(boot_seconds=0.2, default=Behaviour(duration_seconds=1.0)),
            timeout_seconds=170,
            start_execution=BucketQuota(size=1, refill_per_second=1),
        ),
        before_teardown=count_starts,
    )
    assert result.completed and result.instances_running == 0 and result.rejected == 0
    children = [j for j in result.to_json()["jobs"] if "array_id" in j]
    assert sorted(j["array_index"] for j in children) == list(range(3))
    assert {j["status"] for j in children} == {"SUCCEEDED"}
    assert {j["retries"] for j in children} == {0}
    assert seen["throttled"] > 0  # some starts were refused ...
    assert seen["executions"] == sorted(j["id"] for j in children)  # ... and made later, once
    assert seen["queued"] == 0
