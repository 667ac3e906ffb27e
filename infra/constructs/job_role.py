"""The role a job's container runs with: one role, scoped per job and team by session tags.

The node agent on the host assumes it with the instance role, tagging the session with the job
and its team (domain/tenancy.py), and serves the session's keys at the container credentials
endpoint (agent/credentials.py). Its policies read the tags back as `${aws:PrincipalTag/...}`:
a session of job J of team T reaches `runs/J/stages/` (what its stages hand each other) and
`<checkpoint prefix>/T/` (its team's checkpoints), and nothing else: no run manifest, no other
job's stage data, no other team's checkpoint, no bus, no metrics. IAM: session tags and ABAC,
https://docs.aws.amazon.com/IAM/latest/UserGuide/id_session-tags.html; policy variables,
https://docs.aws.amazon.com/IAM/latest/UserGuide/reference_policies_variables.html.
"""

from __future__ import annotations

from aws_cdk import Duration, Stack
from aws_cdk import aws_iam as iam
from aws_cdk import aws_s3 as s3

from constructs import Construct
from gpufleet import topology
from gpufleet.domain.tenancy import (
    JOB_TAG,
    SESSION_TAG_KEYS,
    TEAM_TAG,
    job_session_statements,
    principal_tag,
    team_checkpoint_prefix,
)
from infra.config import Checkpoints
from infra.constructs import nag

# The shortest a role session may last (STS: 900 seconds); the agent renews it before it ends.
SESSION_SECONDS = 3600


class JobRole(Construct):
    def __init__(
        self,
        scope: Construct,
        construct_id: str,
        *,
        instance_role: iam.IRole,
        bucket: s3.IBucket,
        checkpoints: Checkpoints | None,
    ) -> None:
        super().__init__(scope, construct_id)
        # Only the instance role, and only with both tags set and no others: an untagged
        # session, which would read `${aws:PrincipalTag/...}` as nothing, is refused.
        trusted = iam.ArnPrincipal(instance_role.role_arn).with_conditions(
            {
                "StringLike": {f"aws:RequestTag/{key}": "?*" for key in SESSION_TAG_KEYS},
                "ForAllValues:StringEquals": {"aws:TagKeys": list(SESSION_TAG_KEYS)},
            }
        )
        self.role = iam.Role(
            self,
            "Role",
            assumed_by=iam.SessionTagsPrincipal(trusted),
            description="gpufleet job containers: their job's stage data, their team's checkpoints",
            max_session_duration=Duration.seconds(SESSION_SECONDS),
        )
        checkpoint_bucket_arn = (
            None
            if checkpoints is None
            else f"arn:{Stack.of(self).partition}:s3:::{checkpoints.bucket}"
        )
        for statement in job_session_statements(
            bucket.bucket_arn,
            checkpoint_bucket_arn,
            checkpoints.prefix if checkpoints is not None else "",
        ):
            self.role.add_to_policy(iam.PolicyStatement.from_json(statement))
        stage_prefix = f"{topology.RUNS_PREFIX}{principal_tag(JOB_TAG)}/stages/"
        policy = self.role.node.try_find_child("DefaultPolicy")
        assert policy is not None
        nag.acknowledge_all(
            policy,
            nag.wildcard_resources(
                nag.with_policy_variables(f"{nag.arn_of(bucket)}/{stage_prefix}*")
            ),
            "A session reaches only its own job's stage data: the prefix names the job by the "
            "session's gpufleet-job tag, which only the node agent sets.",
        )
        if checkpoints is not None:
            prefix = team_checkpoint_prefix(checkpoints.prefix, principal_tag(TEAM_TAG))
            nag.acknowledge_all(
                policy,
                nag.wildcard_resources(
                    nag.with_policy_variables(
                        f"arn:<AWS::Partition>:s3:::{checkpoints.bucket}/{prefix}*"
                    )
                ),
                "Checkpoints are objects the job names under its team's folder of the "
                "configured prefix, read from the session's gpufleet-team tag.",
            )

    def grant_assume(self, instance_role: iam.IRole) -> None:
        """The node agent's right to open a job's session, with its tags."""
        instance_role.add_to_principal_policy(
            iam.PolicyStatement(
                sid="JobSessions",
                actions=["sts:AssumeRole", "sts:TagSession"],
                resources=[self.role.role_arn],
            )
        )
