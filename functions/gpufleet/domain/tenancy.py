"""Which team's data a job's container may touch: the session tags the node agent puts on the
job role's session, and the prefixes the job role's policies read them into.

The job role (infra/constructs/job_role.py) is one role for every team, scoped by attribute:
its policies name `${aws:PrincipalTag/<tag>}`, so a session tagged with job J of team T reaches
only `runs/J/stages/` and `<checkpoint prefix>/T/`. Only the instance role may assume it, and
only with both tags (the agent on the host, agent/credentials.py); the container gets the
session's short-lived keys, never the instance role's.
"""

from __future__ import annotations

from typing import Any, Final

from gpufleet.topology import RUNS_PREFIX

# What a session may do with objects of its prefixes, and listing them.
OBJECT_ACTIONS: Final = ("s3:GetObject", "s3:PutObject", "s3:AbortMultipartUpload")
LIST_ACTION: Final = "s3:ListBucket"

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


def job_session_statements(
    bucket_arn: str, checkpoint_bucket_arn: str | None, checkpoint_prefix: str = ""
) -> list[dict[str, Any]]:
    """The job role's policy: with its session's tags read in, its job's stage data in the
    stack's bucket (`bucket_arn`) and its team's folder of the checkpoint location (when the
    deployment has one), nothing else. One definition for the stack (infra/constructs/job_role.py)
    and the embedded account, which judges a job session's requests by it."""
    stage_prefix = f"{RUNS_PREFIX}{principal_tag(JOB_TAG)}/stages/"
    statements = [
        _objects("StageData", f"{bucket_arn}/{stage_prefix}*"),
        _listing("ListStageData", bucket_arn, stage_prefix),
    ]
    if checkpoint_bucket_arn is not None:
        prefix = team_checkpoint_prefix(checkpoint_prefix, principal_tag(TEAM_TAG))
        statements += [
            _objects("Checkpoints", f"{checkpoint_bucket_arn}/{prefix}*"),
            _listing("ListCheckpoints", checkpoint_bucket_arn, prefix),
        ]
    return statements


def _objects(sid: str, objects: str) -> dict[str, Any]:
    return {"Sid": sid, "Effect": "Allow", "Action": list(OBJECT_ACTIONS), "Resource": objects}


def _listing(sid: str, bucket_arn: str, prefix: str) -> dict[str, Any]:
    return {
        "Sid": sid,
        "Effect": "Allow",
        "Action": LIST_ACTION,
        "Resource": bucket_arn,
        "Condition": {"StringLike": {"s3:prefix": [f"{prefix}*"]}},
    }
