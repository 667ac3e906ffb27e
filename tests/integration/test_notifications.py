"""Notifications on the embedded account: a team's e-mail topic, as the stack makes it, gets
the SUCCEEDED of a demo job; a spec naming a topic of another account makes no job."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from gpufleet.domain.notify import TeamNotify
from gpufleet.emulator.account import ACCOUNT_ID, Account, repository_config
from gpufleet.emulator.demo import (
    EVENTS_DIR,
    DemoResult,
    DemoScenario,
    Submission,
    nodes_from_config,
    run_demo,
)

ADDRESS = "vision-oncall@example.com"
ELSEWHERE = "arn:aws:sns:us-east-1:999999999999:someone-elses"


class _Subscriber:
    """An SQS queue of the test's subscribed to the vision team's topic, as an e-mail would."""

    def __init__(self) -> None:
        self.messages: list[dict[str, Any]] = []
        self.subscriptions: list[dict[str, Any]] = []
        self.refusal: dict[str, Any] = {}
        self._url = ""

    def subscribe(self, account: Account) -> None:
        topic = account.team_topics["vision"]
        sqs = account.client("sqs")
        self._url = sqs.create_queue(QueueName="vision-notifications")["QueueUrl"]
        queue_arn = sqs.get_queue_attributes(QueueUrl=self._url, AttributeNames=["QueueArn"])[
            "Attributes"
        ]["QueueArn"]
        sns = account.client("sns")
        sns.subscribe(TopicArn=topic, Protocol="sqs", Endpoint=queue_arn)
        self.subscriptions = sns.list_subscriptions_by_topic(TopicArn=topic)["Subscriptions"]

    def drain(self, account: Account) -> None:
        report = account.client("s3").get_object(
            Bucket=account.bucket, Key="jobs/vision/elsewhere.yaml.error.json"
        )
        self.refusal = json.loads(report["Body"].read())
        sqs = account.client("sqs")
        while batch := sqs.receive_message(QueueUrl=self._url, MaxNumberOfMessages=10).get(
            "Messages", []
        ):
            self.messages += [json.loads(m["Body"]) for m in batch]
            for m in batch:
                sqs.delete_message(QueueUrl=self._url, ReceiptHandle=m["ReceiptHandle"])


@pytest.fixture(scope="module")
def notified(tmp_path_factory: pytest.TempPathFactory) -> tuple[DemoResult, _Subscriber]:
    folder: Path = tmp_path_factory.mktemp("specs")
    spec = (EVENTS_DIR / "jobs" / "resnet-baseline.yaml").read_text()
    refused = folder / "elsewhere.yaml"
    refused.write_text(spec.replace("resnet-baseline", "elsewhere") + f"notify: {ELSEWHERE}\n")
    config = repository_config().model_copy(
        update={"teams": {"vision": TeamNotify(notify=[ADDRESS])}}
    )
    scenario_nodes = json.loads((EVENTS_DIR / "demo-scenario.json").read_text())
    scenario = DemoScenario(
        name="notify",
        submissions=[
            Submission("s3", EVENTS_DIR / "jobs" / "resnet-baseline.yaml"),
            Submission("s3", refused),
        ],
        nodes=nodes_from_config(scenario_nodes),
        config=config,
    )
    subscriber = _Subscriber()
    result = run_demo(scenario, on_ready=subscriber.subscribe, before_teardown=subscriber.drain)
    return result, subscriber


def test_the_team_topic_has_the_configured_address_subscribed(
    notified: tuple[DemoResult, _Subscriber],
) -> None:
    _, subscriber = notified
    emails = [s["Endpoint"] for s in subscriber.subscriptions if s["Protocol"] == "email"]
    assert emails == [ADDRESS]


def test_the_succeeded_job_is_told_to_its_teams_topic(
    notified: tuple[DemoResult, _Subscriber],
) -> None:
    result, subscriber = notified
    assert result.completed
    [job] = result.jobs
    assert job["status"] == "SUCCEEDED"
    told = {m["Subject"]: m["Message"] for m in subscriber.messages}
    # The team is told of the ends only (the default notify_on): this job's one end.
    assert list(told) == ["gpufleet: resnet-baseline SUCCEEDED"]
    text = told["gpufleet: resnet-baseline SUCCEEDED"]
    assert f"Job {job['id']} (resnet-baseline, team vision) is SUCCEEDED" in text
    assert f"Cost: ${job['cost_usd']:,.2f}" in text


def test_a_spec_naming_another_accounts_topic_makes_no_job(
    notified: tuple[DemoResult, _Subscriber],
) -> None:
    result, subscriber = notified
    assert result.rejected == 1
    assert [job["name"] for job in result.jobs] == ["resnet-baseline"]
    [problem] = subscriber.refusal["fields"]
    assert problem == {
        "field": "notify",
        "message": f"the topic is in account 999999999999; this deployment's is {ACCOUNT_ID}",
    }
