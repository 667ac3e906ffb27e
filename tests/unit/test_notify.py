"""Where a job's status changes go (domain/notify.py), what people read, and intake's refusal
of a spec naming a topic its team may not use."""

from __future__ import annotations

from typing import Any, cast

import pytest

from gpufleet.adapters.local.memory import RecordingNotifier, RecordingPublisher
from gpufleet.domain.config import ConfigFileError, FleetConfig, config_from_yaml
from gpufleet.domain.job import JobStatus
from gpufleet.domain.notify import (
    STATUSES,
    StatusChange,
    TeamNotify,
    destinations,
    message,
    named_topics,
    notified_teams,
    teams_with_emails,
    topics_outside,
)
from gpufleet.domain.spec import SpecError, spec_from_mapping
from gpufleet.services.notifications import StatusNotifications
from gpufleet.topology import DETAIL_JOB_REJECTED, DETAIL_JOB_STATUS_CHANGED
from tests.helpers import intake_for, local_ports, make_settings, sent_as

ACCOUNT = "123456789012"
TOPIC = f"arn:aws:sns:us-east-1:{ACCOUNT}:vision-jobs"
SWEEPS = f"arn:aws:sns:us-east-1:{ACCOUNT}:vision-sweeps"
OWN = f"arn:aws:sns:us-east-1:{ACCOUNT}:gpufleet-Team-vision"
TEAMS = {
    "vision": TeamNotify(notify=[TOPIC, SWEEPS, "oncall@example.com"]),
    "nlp": TeamNotify(notify=["nlp@example.com"], notify_on=["RUNNING", "FAILED"]),
}
TEAM_TOPICS = {"vision": OWN, "nlp": f"arn:aws:sns:us-east-1:{ACCOUNT}:gpufleet-Team-nlp"}
BASE = {"name": "resnet", "team": "vision", "image": "pytorch:2.4", "command": ["python"]}


def test_the_statuses_are_the_jobs() -> None:
    assert set(STATUSES) == {status.value for status in JobStatus}


def test_a_team_is_told_of_its_ends_on_its_topics_and_its_own() -> None:
    assert destinations("vision", "SUCCEEDED", None, TEAMS, TEAM_TOPICS) == (TOPIC, SWEEPS, OWN)
    assert destinations("vision", "RUNNING", None, TEAMS, TEAM_TOPICS) == ()


def test_notify_on_names_the_statuses_told() -> None:
    assert destinations("nlp", "RUNNING", None, TEAMS, TEAM_TOPICS) == (TEAM_TOPICS["nlp"],)
    assert destinations("nlp", "SUCCEEDED", None, TEAMS, TEAM_TOPICS) == ()


def test_a_spec_topic_of_its_team_is_the_one_destination() -> None:
    assert destinations("vision", "FAILED", SWEEPS, TEAMS, TEAM_TOPICS) == (SWEEPS,)


def test_a_spec_topic_the_team_no_longer_names_goes_to_the_teams_destinations() -> None:
    gone = f"arn:aws:sns:us-east-1:{ACCOUNT}:gone"
    assert destinations("vision", "FAILED", gone, TEAMS, TEAM_TOPICS) == (TOPIC, SWEEPS, OWN)


def test_a_team_the_config_does_not_name_is_told_nothing() -> None:
    assert destinations("audio", "FAILED", None, TEAMS, TEAM_TOPICS) == ()


def test_the_rule_hears_every_team_that_may_be_told_anything() -> None:
    # The Notify rule's filter (topology.rules) is safe only if no other team is ever told.
    teams = {**TEAMS, "audio": TeamNotify()}
    assert notified_teams(teams) == ("nlp", "vision")
    for team in ("audio", "speech"):
        for status in STATUSES:
            assert destinations(team, status, TOPIC, teams, TEAM_TOPICS) == ()
    assert notified_teams({}) == ()


def test_the_deployment_makes_topics_for_addresses_and_may_publish_to_named_ones() -> None:
    assert teams_with_emails(TEAMS) == ("nlp", "vision")
    assert named_topics(TEAMS) == (TOPIC, SWEEPS)
    other = {"x": TeamNotify(notify=["arn:aws:sns:eu-west-1:999999999999:t", TOPIC])}
    assert topics_outside(other, ACCOUNT, "us-east-1") == ["arn:aws:sns:eu-west-1:999999999999:t"]


def test_the_message_says_the_job_its_status_reason_and_cost() -> None:
    change = StatusChange(
        job_id="j-0123456789abcdef0123",
        name="resnet",
        team="vision",
        status="FAILED",
        previous="RUNNING",
        reason="exit code 3 " + "x" * 2000,
        cost_usd=1234.5,
    )
    subject, text = message(change)
    assert subject == "gpufleet: resnet FAILED"
    lines = text.splitlines()
    assert lines[0] == "Job j-0123456789abcdef0123 (resnet, team vision) is FAILED, was RUNNING."
    assert lines[1].startswith("Reason: exit code 3 x") and len(lines[1]) < 520
    assert lines[2] == "Cost: $1,234.50"


@pytest.mark.parametrize(
    "notify",
    [["not a destination"], ["a@example.com", "a@example.com"], ["arn:aws:sqs:us-east-1:1:q"]],
)
def test_a_config_destination_is_a_topic_or_an_address_once(notify: list[str]) -> None:
    with pytest.raises(ConfigFileError, match=r"teams\.vision\.notify"):
        config_from_yaml(f"teams: {{vision: {{notify: {notify}}}}}")


def test_a_spec_names_a_topic_never_an_address() -> None:
    with pytest.raises(SpecError) as refused:
        spec_from_mapping({**BASE, "notify": "me@example.com"})
    [problem] = refused.value.fields
    assert problem.field == "notify"
    assert "subscribed in gpufleet.yaml" in problem.message


def _intake(teams: dict[str, TeamNotify]) -> tuple[Any, Any]:
    ports = local_ports()
    settings = make_settings(config=FleetConfig(teams=teams), account_id=ACCOUNT)
    return intake_for(ports, settings), ports


@pytest.mark.parametrize(
    ("topic", "says"),
    [
        ("arn:aws:sns:us-east-1:999999999999:vision-jobs", "in account 999999999999"),
        (f"arn:aws:sns:eu-west-1:{ACCOUNT}:vision-jobs", "in eu-west-1"),
        (f"arn:aws:sns:us-east-1:{ACCOUNT}:nlp-jobs", "not one of team vision's"),
    ],
)
def test_intake_refuses_a_topic_the_team_may_not_use_and_makes_no_job(
    topic: str, says: str
) -> None:
    intake, ports = _intake(TEAMS)
    outcome = intake.submit_document(
        {**BASE, "notify": topic}, "event:1", "event:1", sent_as("vision")
    )
    assert not outcome.accepted
    [problem] = cast(dict[str, Any], outcome.error)["fields"]
    assert problem["field"] == "notify" and says in problem["message"]
    assert ports.jobs.list_jobs() == []
    assert len(cast(RecordingPublisher, ports.events).of_type(DETAIL_JOB_REJECTED)) == 1


def test_a_job_naming_its_teams_topic_carries_it_in_its_status_events() -> None:
    intake, ports = _intake(TEAMS)
    outcome = intake.submit_document(
        {**BASE, "notify": SWEEPS}, "event:1", "event:1", sent_as("vision")
    )
    assert outcome.accepted
    [event] = cast(RecordingPublisher, ports.events).of_type(DETAIL_JOB_STATUS_CHANGED)
    assert event["notify"] == SWEEPS and event["status"] == "QUEUED"
    assert {"reason", "cost_usd"} <= set(event)


def test_the_notify_service_publishes_a_status_event_to_each_destination() -> None:
    notifier = RecordingNotifier()
    service = StatusNotifications(notifier, TEAMS, TEAM_TOPICS)
    intake, ports = _intake(TEAMS)
    job_id = intake.submit_document(dict(BASE), "event:1", "event:1", sent_as("vision")).job_id
    assert job_id is not None
    job = ports.jobs.get(job_id).model_copy(update={"status": JobStatus.SUCCEEDED})
    event = job.status_event(JobStatus.RUNNING)
    assert service.status_changed(StatusChange.model_validate(event)) == (TOPIC, SWEEPS, OWN)
    assert [topic for topic, _, _ in notifier.published] == [TOPIC, SWEEPS, OWN]
    assert all(subject == "gpufleet: resnet SUCCEEDED" for _, subject, _ in notifier.published)
