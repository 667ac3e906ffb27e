"""Who submits decides the team: which team a submission may be for, from who made it.

A spec's `team` is not a label its submitter chooses. It must be the team the submission was
made as, which IAM decides (one submit policy per team, `infra/constructs/submitters.py`):

- an upload under `jobs/<team>/...` is made as <team>: only principals with that team's policy
  may put objects under its prefix;
- an event from source `gpufleet.team.<team>` is made as <team>: only that team's policy may put
  events with that source (IAM condition `events:source`). When gpufleet.yaml's `submitters:`
  names teams, the event's `account` (the account of the principal that put it) must be one it
  allows that team: an account it lists, or the account of a role it lists.

When `submitters:` names teams, it names every team that may submit: another team's upload or
event is refused too. A refused submission changes nothing: intake reports it (`Job Rejected`)
and stores no job.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field, StringConstraints

from gpufleet.domain.spec import NAME_PATTERN, FieldError, SpecError, format_for, load_document
from gpufleet.topology import INTAKE_PREFIX, SUBMIT_SOURCE_PREFIX

AccountId = Annotated[str, StringConstraints(pattern=r"^[0-9]{12}$")]
RoleArn = Annotated[
    str,
    StringConstraints(
        max_length=2048, pattern=r"^arn:aws[a-z-]*:iam::[0-9]{12}:role/[A-Za-z0-9+=,.@_/-]+$"
    ),
]


class TeamSubmitters(BaseModel):
    """Who may submit by event for one team (gpufleet.yaml `submitters: {team: ...}`): the
    accounts its events may come from, and roles, which the stack gives the team's submit
    policy and whose accounts its events may come from."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    accounts: list[AccountId] = Field(default_factory=list, max_length=20)
    roles: list[RoleArn] = Field(default_factory=list, max_length=20)

    def allowed_accounts(self) -> frozenset[str]:
        return frozenset(self.accounts) | {role.split(":")[4] for role in self.roles}


@dataclass(frozen=True)
class Submitter:
    """Who made a submission, as its delivery shows it: the team its key or event source is
    for (None: it names none), and for an event, the account that put it."""

    channel: Literal["upload", "event"]
    team: str | None
    account: str | None = None


def upload_key(team: str, name: str) -> str:
    """Where team `team` uploads a spec named `name` (a file name, or a path under its folder)."""
    return f"{INTAKE_PREFIX}{team}/{name}"


def spec_upload_key(raw: bytes, name: str) -> str:
    """Where a spec uploaded as `name` goes: under the folder of the team it names (of all
    the jobs of a `jobs:` list), or, when it names none that can be read, under jobs/ itself
    (where intake refuses it)."""
    try:
        document = load_document(raw, format_for(name))
    except SpecError:
        document = None
    team = _team_named(document)
    return upload_key(team, name) if team is not None else f"{INTAKE_PREFIX}{name}"


def _team_named(document: object) -> str | None:
    """The one team a spec, or every spec of a `jobs:` list, names; None otherwise."""
    if not isinstance(document, dict):
        return None
    listed = document.get("jobs")
    specs = listed if isinstance(listed, list) else [document]
    teams = {spec.get("team") if isinstance(spec, dict) else None for spec in specs}
    team = teams.pop() if len(teams) == 1 else None
    return team if isinstance(team, str) else None


def team_source(team: str) -> str:
    """The event source team `team` submits from."""
    return f"{SUBMIT_SOURCE_PREFIX}{team}"


def upload_submitter(key: str) -> Submitter:
    """The submitter of an upload under `key`: the team of its folder under jobs/."""
    match = re.fullmatch(re.escape(INTAKE_PREFIX) + f"({NAME_PATTERN})/.+", key, re.DOTALL)
    return Submitter("upload", match.group(1) if match else None)


def event_submitter(source: str, account: str) -> Submitter:
    """The submitter of an event from `source`, put by a principal of `account`."""
    match = re.fullmatch(re.escape(SUBMIT_SOURCE_PREFIX) + f"({NAME_PATTERN})", source)
    return Submitter("event", match.group(1) if match else None, account)


def submission_refusal(
    submitter: Submitter,
    teams: Iterable[str],
    submitters: Mapping[str, TeamSubmitters],
) -> SpecError | None:
    """Why `submitter` may not submit jobs of `teams` (the spec's team, each job's; none: the
    check before the spec is read), or None when it may."""
    if submitter.team is None:
        where = (
            f"under {upload_key('<team>', '...')}"
            if submitter.channel == "upload"
            else f"from event source {team_source('<team>')}"
        )
        return SpecError(
            f"a submission is made as a team: submit {where}",
            [FieldError(field="(submitter)", message="names no team")],
        )
    if submitters and submitter.team not in submitters:
        return SpecError(
            f"team {submitter.team} may not submit: gpufleet.yaml's submitters name "
            f"{', '.join(sorted(submitters))}",
            [FieldError(field="(submitter)", message=f"team {submitter.team} is not a submitter")],
        )
    grant = submitters.get(submitter.team)
    if (
        submitter.channel == "event"
        and grant is not None
        and submitter.account not in grant.allowed_accounts()
    ):
        return SpecError(
            f"an event from account {submitter.account} may not submit for team "
            f"{submitter.team} (gpufleet.yaml's submitters)",
            [FieldError(field="(submitter)", message="account not allowed for the team")],
        )
    claimed = sorted({team for team in teams if team != submitter.team})
    if claimed:
        return SpecError(
            f"submitted as team {submitter.team}, the spec claims team {', '.join(claimed)}: a "
            "team submits its own jobs only",
            [FieldError(field="team", message=f"must be {submitter.team}")],
        )
    return None
