"""Dependencies between jobs through the real workflow on the embedded account: one upload of a
`jobs:` list, where a job runs after the one it depends on succeeded, one whose dependency
failed ends CANCELLED without an instance, and one that depends on any end runs after the
failure."""

from __future__ import annotations

from pathlib import Path

from gpufleet.adapters.aws.job_store import DynamoJobStore
from gpufleet.emulator.account import Account
from gpufleet.emulator.demo import DemoScenario, Submission, run_demo
from gpufleet.emulator.nodes import Behaviour, NodeScenario
from gpufleet.topology import JOBS_TABLE

PIPELINE = """\
jobs:
  - {name: report, team: nlp, image: img:1, command: [python, report.py],
     template: cpu-preprocess, depends_on: [{job: broken, on: any}]}
  - {name: prep, team: nlp, image: img:1, command: [python, prep.py], template: cpu-preprocess}
  - {name: train, team: nlp, image: img:1, command: [python, train.py],
     template: cpu-preprocess, depends_on: [{job: prep}]}
  - {name: broken, team: nlp, image: img:1, command: [python, broken.py],
     template: cpu-preprocess, max_retries: 0}
  - {name: skipped, team: nlp, image: img:1, command: [python, skipped.py],
     template: cpu-preprocess, depends_on: [{job: broken}]}
"""


def test_dependants_run_after_success_are_cancelled_after_failure_and_run_after_any_end(
    tmp_path: Path,
) -> None:
    (tmp_path / "pipeline.yaml").write_text(PIPELINE)
    ended: dict[str, tuple[float | None, float | None]] = {}

    def times(account: Account) -> None:
        """When each job was first admitted and when its instances went: from its record."""
        store = DynamoJobStore(
            account.client("dynamodb"), account.table_names[JOBS_TABLE.construct_id]
        )
        for job in store.list_jobs():
            ended[job.spec.name] = (job.first_admitted_at, job.released_at)

    result = run_demo(
        DemoScenario(
            name="dependencies",
            submissions=[Submission("s3", tmp_path / "pipeline.yaml")],
            nodes=NodeScenario(
                boot_seconds=0.2,
                default=Behaviour(duration_seconds=1.0),
                behaviours={"broken": Behaviour(duration_seconds=0.5, exit_code=3)},
            ),
            timeout_seconds=110,
        ),
        before_teardown=times,
    )
    assert result.completed and result.instances_running == 0 and result.rejected == 0
    jobs = {job["name"]: job for job in result.to_json()["jobs"]}
    assert {name: job["status"] for name, job in jobs.items()} == {
        "prep": "SUCCEEDED",
        "train": "SUCCEEDED",
        "broken": "FAILED",
        "skipped": "CANCELLED",
        "report": "SUCCEEDED",
    }
    # Each dependant was admitted only once its dependency's run was over.
    for dependant, dependency in (("train", "prep"), ("report", "broken")):
        admitted, _ = ended[dependant]
        _, released = ended[dependency]
        assert admitted is not None and released is not None and admitted >= released
    skipped = jobs["skipped"]
    assert skipped["failure_reason"] == f"dependency {jobs['broken']['id']} ended FAILED"
    assert skipped["instances"] == [] and skipped["instance_type"] is None
    assert not skipped["cost_usd"] and ended["skipped"] == (None, None)
