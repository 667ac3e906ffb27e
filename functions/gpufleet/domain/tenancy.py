"""Which team's data a job's container may touch: the session tags the node agent puts on the
job role's session, and the prefixes the job role's policies read them into.

The job role (infra/constructs/job_role.py) is one role for every team, scoped by attribute:
its policies name `${aws:PrincipalTag/<tag>}`, so a session tagged with job J of team T reaches
only `runs/J/stages/` and `<checkpoint prefix>/T/`. Only the instance role may assume it, and
only with both tags (the agent on the host, agent/credentials.py); the container gets the
session's short-lived keys, never the instance role's.
"""

from __future__ import annotations

from typing import Final

# Session tag keys: IAM allows letters, digits, spaces and _.:/=+-@ (128 characters at most).
JOB_TAG: Final = "gpufleet-job"
TEAM_TAG: Final = "gpufleet-team"
SESSION_TAG_KEYS: Final = (JOB_TAG, TEAM_TAG)


def principal_tag(key: str) -> str:
    """The IAM policy variable that reads a session tag of the caller."""
    return "${aws:PrincipalTag/" + key + "}"


def session_tags(job_id: str, team: str) -> list[dict[str, str]]:
    """The tags of a job's session, as `sts:AssumeRole` takes them (`Tags`). Job ids and team
    names (domain/spec.py) use only characters a session tag value may hold."""
    return [{"Key": JOB_TAG, "Value": job_id}, {"Key": TEAM_TAG, "Value": team}]


def session_name(job_id: str) -> str:
    """The role session's name (CloudTrail shows it): the job's id, within STS's 64 characters
    of [\\w+=,.@-]."""
    return f"gpufleet-{job_id}"[:64]


def team_checkpoint_prefix(prefix: str, team: str) -> str:
    """Where team `team` keeps checkpoints in the configured checkpoint bucket: under the
    configured prefix (may be empty), one folder per team."""
    return f"{prefix}/{team}/" if prefix else f"{team}/"
