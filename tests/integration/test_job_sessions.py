"""Cross-tenant refusals end to end on the embedded account (issue #19 point 4): a job's
container holds what the node agent serves it, its job's session of the job role, opened with
the account's STS and read by botocore's own container provider as the container's SDK reads it;
the account judges every request signed with it by the job role's policy, as IAM would.

A job of team vision reaches its own stage data and its team's checkpoints; it cannot read a run
manifest or a node key, read or overwrite team nlp's checkpoint, list its folder, report for
another job, put metrics, or submit a job. Each refusal is AccessDenied and changes nothing.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from typing import Any

import boto3
import pytest
from botocore.credentials import ContainerProvider
from botocore.exceptions import ClientError

from gpufleet.agent.credentials import JobSession, credentials_endpoint
from gpufleet.domain.node_reports import node_key_object
from gpufleet.domain.submitters import upload_key
from gpufleet.emulator.account import CHECKPOINT_BUCKET, JOB_ROLE_ARN, Account
from gpufleet.services.lifecycle_base import run_manifest_key
from gpufleet.topology import AGENT_SOURCE, DETAIL_NODE_FINISHED, RUNS_PREFIX

MINE, THEIRS = "j-0000000000000000000a", "j-0000000000000000000b"
THEIR_CHECKPOINT = "nlp/llm/step-100.pt"
ORIGINAL = b"team nlp's weights"


@pytest.fixture(scope="module")
def seeded(account: Account) -> Account:
    """What the control plane and the other team put in the account: a run manifest and node
    key of each job, team nlp's checkpoint."""
    s3 = account.client("s3")
    for job in (MINE, THEIRS):
        s3.put_object(Bucket=account.bucket, Key=run_manifest_key(job), Body=b'{"env": {}}')
        s3.put_object(Bucket=account.bucket, Key=node_key_object(job), Body=b"key")
    s3.put_object(Bucket=CHECKPOINT_BUCKET, Key=THEIR_CHECKPOINT, Body=ORIGINAL)
    return account


@pytest.fixture(scope="module")
def container(seeded: Account) -> Iterator[boto3.session.Session]:
    """The SDK of the container of job MINE (team vision), with the keys the agent serves it."""
    session = JobSession(seeded.client("sts"), JOB_ROLE_ARN, MINE, "vision", clock=time.time)
    with credentials_endpoint(session) as environment:
        keys = ContainerProvider(environ=environment).load().get_frozen_credentials()
        yield boto3.session.Session(
            aws_access_key_id=keys.access_key,
            aws_secret_access_key=keys.secret_key,
            aws_session_token=keys.token,
            region_name=seeded.region,
        )


def _refused(call: Any, **params: Any) -> str:
    with pytest.raises(ClientError) as refused:
        call(**params)
    assert refused.value.response["Error"]["Code"] == "AccessDenied"
    return str(refused.value.response["Error"]["Message"])


def test_a_job_reaches_its_own_stage_data_and_its_teams_checkpoints(
    seeded: Account, container: boto3.session.Session
) -> None:
    s3 = container.client("s3")
    stage = f"{RUNS_PREFIX}{MINE}/stages/prepare/out.bin"
    s3.put_object(Bucket=seeded.bucket, Key=stage, Body=b"shard")
    assert s3.get_object(Bucket=seeded.bucket, Key=stage)["Body"].read() == b"shard"
    listed = s3.list_objects_v2(Bucket=seeded.bucket, Prefix=f"{RUNS_PREFIX}{MINE}/stages/")
    assert [o["Key"] for o in listed["Contents"]] == [stage]
    own = "vision/resnet/step-1.pt"
    s3.put_object(Bucket=CHECKPOINT_BUCKET, Key=own, Body=b"weights")
    assert s3.head_object(Bucket=CHECKPOINT_BUCKET, Key=own)["ContentLength"] == 7
    listed = s3.list_objects_v2(Bucket=CHECKPOINT_BUCKET, Prefix="vision/")
    assert [o["Key"] for o in listed["Contents"]] == [own]


@pytest.mark.parametrize(
    "key",
    [run_manifest_key(THEIRS), run_manifest_key(MINE), node_key_object(MINE)],
    ids=["their-manifest", "its-own-manifest", "its-node-key"],
)
def test_a_job_cannot_read_a_run_manifest_or_a_node_key(
    seeded: Account, container: boto3.session.Session, key: str
) -> None:
    message = _refused(container.client("s3").get_object, Bucket=seeded.bucket, Key=key)
    assert "s3:GetObject" in message and key in message
    assert "assumed-role/gpufleet-job/gpufleet-" + MINE in message


def test_a_job_cannot_read_overwrite_or_list_another_teams_checkpoints(
    seeded: Account, container: boto3.session.Session
) -> None:
    s3 = container.client("s3")
    _refused(s3.get_object, Bucket=CHECKPOINT_BUCKET, Key=THEIR_CHECKPOINT)
    _refused(s3.put_object, Bucket=CHECKPOINT_BUCKET, Key=THEIR_CHECKPOINT, Body=b"poison")
    _refused(s3.delete_object, Bucket=CHECKPOINT_BUCKET, Key=THEIR_CHECKPOINT)
    _refused(s3.list_objects_v2, Bucket=CHECKPOINT_BUCKET, Prefix="nlp/")
    _refused(s3.list_objects_v2, Bucket=CHECKPOINT_BUCKET, Prefix="")
    stored = seeded.client("s3").get_object(Bucket=CHECKPOINT_BUCKET, Key=THEIR_CHECKPOINT)
    assert stored["Body"].read() == ORIGINAL


def test_a_job_cannot_report_for_a_job_put_metrics_or_submit(
    seeded: Account, container: boto3.session.Session
) -> None:
    report = {"job_id": THEIRS, "run": 1, "phase": "finished", "exit_code": 0}
    _refused(
        container.client("events").put_events,
        Entries=[
            {
                "EventBusName": seeded.bus,
                "Source": AGENT_SOURCE,
                "DetailType": DETAIL_NODE_FINISHED,
                "Detail": json.dumps(report),
            }
        ],
    )
    metric = {"MetricName": "GPUUtilization", "Value": 0.0, "Dimensions": []}
    _refused(
        container.client("cloudwatch").put_metric_data,
        Namespace="GpuFleet/Jobs",
        MetricData=[{**metric, "Dimensions": [{"Name": "JobId", "Value": THEIRS}]}],
    )
    listed = seeded.client("cloudwatch").list_metrics(Namespace="GpuFleet/Jobs")
    assert [
        m for m in listed["Metrics"] if {"Name": "JobId", "Value": THEIRS} in m["Dimensions"]
    ] == []
    key = upload_key("nlp", "as-nlp.yaml")
    _refused(container.client("s3").put_object, Bucket=seeded.bucket, Key=key, Body=b"x")
    missing = seeded.client("s3").list_objects_v2(Bucket=seeded.bucket, Prefix=key)
    assert missing.get("KeyCount") == 0


@pytest.mark.parametrize(
    "tags",
    [[], [{"Key": "gpufleet-job", "Value": MINE}]],
    ids=["untagged", "no-team-tag"],
)
def test_the_job_role_is_opened_only_with_both_tags(
    seeded: Account, tags: list[dict[str, str]]
) -> None:
    message = _refused(
        seeded.client("sts").assume_role,
        RoleArn=JOB_ROLE_ARN,
        RoleSessionName="gpufleet-untagged",
        Tags=tags,
    )
    assert "trust policy" in message
