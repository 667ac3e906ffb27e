"""Where a job's status changes go, and what people read (docs/notifications.md).

A team names its destinations in gpufleet.yaml (`teams.<team>.notify`): SNS topics of the
deployment's account, and e-mail addresses, which the stack subscribes to a topic of the team's
own. A spec may name one of its team's topics (`notify:`) to have its changes go there alone.
The notifier may publish to these topics and no other, so intake refuses a spec naming any other
topic (`check_notify`), and `destinations` is the one answer to "where does this change go" that
the Notify function, the embedded account and the tests all use.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Literal, get_args

from pydantic import BaseModel, ConfigDict, Field, field_validator

from gpufleet.domain.spec import SNS_TOPIC_ARN_PATTERN, FieldError, JobSpec, SpecError

# A message is read on a phone: a long reason (an error's cause) is cut.
MAX_REASON_CHARACTERS = 500
# Lambda's environment holds the whole config in 4 KiB: a few destinations a team.
MAX_DESTINATIONS = 10
# An address as SNS's email protocol takes it; what a mail server accepts is its business.
EMAIL_PATTERN = r"^[A-Za-z0-9._%+-]+@[A-Za-z0-9-]+(\.[A-Za-z0-9-]+)+$"
_TOPIC = re.compile(SNS_TOPIC_ARN_PATTERN)
# A job's statuses (domain/job.py's JobStatus: the fleet config is read before jobs are, and
# the job model's modules read the config) and those people are told of by default: the ends.
Status = Literal["SUBMITTED", "QUEUED", "LAUNCHING", "RUNNING", "SUCCEEDED", "FAILED", "CANCELLED"]
STATUSES: tuple[Status, ...] = get_args(Status)
DEFAULT_NOTIFY_ON: tuple[Status, ...] = ("SUCCEEDED", "FAILED", "CANCELLED")


@dataclass(frozen=True)
class Topic:
    arn: str
    region: str
    account: str
    name: str


def parse_topic(arn: str) -> Topic | None:
    """The parts of an SNS topic ARN; None for anything else."""
    match = _TOPIC.fullmatch(arn)
    if match is None:
        return None
    _, _, _, region, account, name = arn.split(":")
    return Topic(arn, region, account, name)


def is_email(text: str) -> bool:
    return re.fullmatch(EMAIL_PATTERN, text) is not None and len(text) <= 254


class TeamNotify(BaseModel):
    """One team's destinations: SNS topic ARNs and e-mail addresses, and the statuses that
    are told (the ends, unless `notify_on` names others)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    notify: list[str] = Field(default_factory=list, max_length=MAX_DESTINATIONS)
    notify_on: list[Status] = Field(
        default_factory=lambda: list(DEFAULT_NOTIFY_ON), min_length=1, max_length=7
    )

    @field_validator("notify")
    @classmethod
    def _topics_or_addresses(cls, destinations: list[str]) -> list[str]:
        for destination in destinations:
            if parse_topic(destination) is None and not is_email(destination):
                raise ValueError(
                    f"{destination!r} is neither an SNS topic ARN "
                    "(arn:aws:sns:REGION:ACCOUNT:NAME) nor an e-mail address"
                )
        if len(set(destinations)) != len(destinations):
            raise ValueError("a destination is named twice")
        return destinations

    @property
    def topics(self) -> tuple[str, ...]:
        return tuple(d for d in self.notify if parse_topic(d) is not None)

    @property
    def emails(self) -> tuple[str, ...]:
        return tuple(d for d in self.notify if parse_topic(d) is None)


def notified_teams(teams: Mapping[str, TeamNotify]) -> tuple[str, ...]:
    """The teams with a destination: `destinations` sends nothing of any other team's jobs."""
    return tuple(sorted(team for team, notify in teams.items() if notify.notify))


def teams_with_emails(teams: Mapping[str, TeamNotify]) -> tuple[str, ...]:
    """The teams the deployment makes a topic for (their e-mail addresses subscribe to it)."""
    return tuple(sorted(team for team, notify in teams.items() if notify.emails))


def named_topics(teams: Mapping[str, TeamNotify]) -> tuple[str, ...]:
    """Every existing topic the config names: with the teams' own, all the notifier may
    publish to."""
    return tuple(sorted({topic for notify in teams.values() for topic in notify.topics}))


def topics_outside(teams: Mapping[str, TeamNotify], account: str, region: str) -> list[str]:
    """The named topics the deployment cannot publish to: another account's or region's."""
    return [
        arn
        for arn in named_topics(teams)
        if (topic := parse_topic(arn)) and (topic.account, topic.region) != (account, region)
    ]


def check_notify(
    spec: JobSpec, teams: Mapping[str, TeamNotify], account: str, region: str
) -> JobSpec:
    """`spec` when its `notify` topic is one its team may use; else SpecError on the field."""
    if spec.notify is None:
        return spec
    topic = parse_topic(spec.notify)
    assert topic is not None  # the spec's field holds a topic ARN
    if account and topic.account != account:
        problem = f"the topic is in account {topic.account}; this deployment's is {account}"
    elif region and topic.region != region:
        problem = f"the topic is in {topic.region}; this deployment runs in {region}"
    elif spec.notify not in teams.get(spec.team, TeamNotify()).topics:
        problem = (
            f"the topic is not one of team {spec.team}'s: gpufleet.yaml's "
            f"teams.{spec.team}.notify names the topics its jobs may use"
        )
    else:
        return spec
    problems = [FieldError(field="notify", message=problem)]
    raise SpecError("the notify topic cannot be used", problems)


def destinations(
    team: str,
    status: str,
    spec_topic: str | None,
    teams: Mapping[str, TeamNotify],
    team_topics: Mapping[str, str],
) -> tuple[str, ...]:
    """The topics a change of a job of `team` to `status` goes to: the spec's topic when it
    names one its team may use, else the team's topics and its own (for its e-mail
    addresses, `team_topics`: team -> the topic the deployment made). Nothing for a status
    the team is not told of, nor for a team the config does not name."""
    notify = teams.get(team)
    if notify is None or status not in notify.notify_on:
        return ()
    # Intake held a spec's topic to its team's; a config redeployed without it since has the
    # change go to the team's destinations instead.
    if spec_topic is not None and spec_topic in notify.topics:
        return (spec_topic,)
    own = (team_topics[team],) if notify.emails and team in team_topics else ()
    return (*notify.topics, *own)


class StatusChange(BaseModel):
    """What a `Job Status Changed` event says (`Job.status_event`)."""

    model_config = ConfigDict(extra="ignore", frozen=True)

    job_id: str = Field(max_length=64)
    name: str = Field(max_length=63)
    team: str = Field(max_length=63)
    status: Status
    previous: Status | None = None
    reason: str | None = None
    cost_usd: float | None = None
    notify: str | None = Field(default=None, max_length=512)


def message(change: StatusChange) -> tuple[str, str]:
    """The subject and the short text people are sent."""
    subject = f"gpufleet: {change.name} {change.status}"
    lines = [
        f"Job {change.job_id} ({change.name}, team {change.team}) is {change.status}"
        + (f", was {change.previous}." if change.previous else "."),
    ]
    if change.reason:
        reason = change.reason
        if len(reason) > MAX_REASON_CHARACTERS:
            reason = reason[: MAX_REASON_CHARACTERS - 1] + "…"
        lines.append(f"Reason: {reason}")
    if change.cost_usd is not None:
        lines.append(f"Cost: ${change.cost_usd:,.2f}")
    lines.append(f"gpufleet status {change.job_id}")
    return subject, "\n".join(lines)
