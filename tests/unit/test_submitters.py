"""Who submits decides the team (domain/submitters.py): an upload's folder under jobs/ and an
event's source name the team a submission is made as; a spec may claim only that team, and
gpufleet.yaml's `submitters:` decides which accounts' events may submit for a team."""

from __future__ import annotations

from typing import cast

import pytest
from pydantic import ValidationError

from gpufleet.adapters.local.memory import RecordingPublisher, RecordingWorkflow
from gpufleet.domain.config import FleetConfig
from gpufleet.domain.submitters import (
    Submitter,
    TeamSubmitters,
    event_submitter,
    spec_upload_key,
    submission_refusal,
    team_source,
    upload_key,
    upload_submitter,
)
from gpufleet.services.factory import build_lifecycle
from gpufleet.services.intake import IntakeService
from tests.helpers import local_ports, make_settings

ACCOUNT, OTHER_ACCOUNT = "123456789012", "210987654321"
VISION_CI = "arn:aws:iam::333333333333:role/ci/vision-ci"


@pytest.mark.parametrize(
    ("key", "team"),
    [
        ("jobs/vision/resnet.yaml", "vision"),
        ("jobs/vision/nested/deeper/a.json", "vision"),
        ("jobs/nlp.v2/a.yaml", "nlp.v2"),
        ("jobs/resnet.yaml", None),  # not under a team's folder
        ("jobs/Vision/a.yaml", None),  # no team is named so
        ("jobs/../vision/a.yaml", None),
        ("jobs/vision/", None),  # the folder itself
        ("runs/vision/a.yaml", None),
        ("jobs//a.yaml", None),
    ],
)
def test_an_upload_is_made_as_the_team_of_its_folder(key: str, team: str | None) -> None:
    assert upload_submitter(key) == Submitter("upload", team)


@pytest.mark.parametrize(
    ("source", "team"),
    [
        ("gpufleet.team.vision", "vision"),
        ("gpufleet.team.nlp-research", "nlp-research"),
        ("gpufleet", None),
        ("gpufleet.team.", None),
        ("gpufleet.agent", None),
        ("gpufleet.team.Vision", None),
        ("xgpufleet.team.vision", None),
    ],
)
def test_an_event_is_made_as_the_team_of_its_source(source: str, team: str | None) -> None:
    assert event_submitter(source, ACCOUNT) == Submitter("event", team, ACCOUNT)


def test_the_key_and_source_of_a_team_are_the_ones_read_back() -> None:
    assert upload_submitter(upload_key("audio", "asr.yaml")).team == "audio"
    assert event_submitter(team_source("audio"), ACCOUNT).team == "audio"


def test_a_spec_goes_under_the_folder_of_the_team_it_names() -> None:
    assert spec_upload_key(b"name: a\nteam: nlp\n", "a.yaml") == "jobs/nlp/a.yaml"
    assert spec_upload_key(b'{"team": "audio"}', "a.json") == "jobs/audio/a.json"
    # A `jobs:` list goes under the one team all its jobs name.
    pair = b"jobs: [{name: a, team: nlp}, {name: b, team: nlp}]\n"
    assert spec_upload_key(pair, "ab.yaml") == "jobs/nlp/ab.yaml"
    # No team that can be read (or several): under jobs/ itself, where intake refuses it.
    mixed = b"jobs: [{name: a, team: nlp}, {name: b, team: audio}]\n"
    for body in (b"name: a\n", b"name: [", b"- a\n", b"team: 3\n", mixed, b"jobs: [3]\n"):
        assert spec_upload_key(body, "a.yaml") == "jobs/a.yaml"


def test_a_team_submits_its_own_jobs() -> None:
    for submitter in (
        upload_submitter("jobs/vision/a.yaml"),
        event_submitter(team_source("vision"), ACCOUNT),
    ):
        assert submission_refusal(submitter, (), {}) is None
        assert submission_refusal(submitter, ["vision"], {}) is None


def test_a_spec_claiming_another_team_is_refused_on_its_team_field() -> None:
    for submitter in (
        upload_submitter("jobs/vision/a.yaml"),
        event_submitter(team_source("vision"), ACCOUNT),
    ):
        refusal = submission_refusal(submitter, ["nlp"], {})
        assert refusal is not None
        assert "submitted as team vision, the spec claims team nlp" in refusal.message
        assert [(f.field, f.message) for f in refusal.fields] == [("team", "must be vision")]
        # One job of several claiming another team is enough.
        assert submission_refusal(submitter, ["vision", "audio"], {}) is not None


def test_a_submission_that_names_no_team_is_refused() -> None:
    upload = submission_refusal(upload_submitter("jobs/a.yaml"), (), {})
    event = submission_refusal(event_submitter("gpufleet", ACCOUNT), (), {})
    assert upload is not None and "jobs/<team>/" in upload.message
    assert event is not None and "gpufleet.team.<team>" in event.message


def test_events_come_from_the_accounts_the_config_allows_the_team() -> None:
    submitters = {"vision": TeamSubmitters(accounts=[ACCOUNT], roles=[VISION_CI])}
    source = team_source("vision")
    assert submission_refusal(event_submitter(source, ACCOUNT), (), submitters) is None
    # A role's account is allowed too.
    assert submission_refusal(event_submitter(source, "333333333333"), (), submitters) is None
    refusal = submission_refusal(event_submitter(source, OTHER_ACCOUNT), (), submitters)
    assert refusal is not None and f"account {OTHER_ACCOUNT}" in refusal.message
    # Uploads carry no account: the folder's policy decides who put them.
    assert submission_refusal(upload_submitter("jobs/vision/a.yaml"), (), submitters) is None


def test_the_configs_submitters_name_every_team_that_may_submit() -> None:
    submitters = {"vision": TeamSubmitters(accounts=[ACCOUNT])}
    for submitter in (
        upload_submitter("jobs/nlp/a.yaml"),
        event_submitter(team_source("nlp"), ACCOUNT),
    ):
        refusal = submission_refusal(submitter, ["nlp"], submitters)
        assert refusal is not None and "team nlp may not submit" in refusal.message


@pytest.mark.parametrize(
    "grant",
    [
        {"accounts": ["12345"]},
        {"roles": ["arn:aws:iam::123456789012:user/alice"]},
        {"roles": ["vision-ci"]},
        {"users": ["alice"]},
    ],
)
def test_the_config_refuses_what_names_no_account_or_role(grant: dict[str, list[str]]) -> None:
    with pytest.raises(ValidationError):
        TeamSubmitters.model_validate(grant)


def test_intake_refuses_an_event_from_an_account_the_team_is_not_allowed_and_does_nothing() -> None:
    config = FleetConfig(submitters={"vision": TeamSubmitters(accounts=[OTHER_ACCOUNT])})
    ports = local_ports()
    intake = IntakeService(ports, build_lifecycle(ports, make_settings()), config)
    spec = {"name": "a", "team": "vision", "image": "img", "command": ["x"]}
    refused = intake.submit_event(spec, "event:1", "event:1", team_source("vision"), ACCOUNT)
    assert refused.job_id is None and refused.error is not None
    assert f"account {ACCOUNT} may not submit for team vision" in refused.error["message"]
    published = cast(RecordingPublisher, ports.events).events
    assert [detail_type for _, detail_type, _ in published] == ["Job Rejected"]
    assert ports.jobs.list_jobs() == []
    assert cast(RecordingWorkflow, ports.workflow).started == []
    allowed = intake.submit_event(spec, "event:2", "event:2", team_source("vision"), OTHER_ACCOUNT)
    assert allowed.job_id is not None
