"""Who may submit for each team: one managed policy per team, which gives its holders the team's
folder of the intake bucket and the team's event source, and nothing of another team.

Intake takes a submission's team from where it was uploaded (`jobs/<team>/...`) or the source of
its event (`gpufleet.team.<team>`) and refuses a spec claiming another (domain/submitters.py),
so a team's policy is what lets a principal submit as the team. The stack attaches it to the
roles gpufleet.yaml's `submitters:` names for the team (roles of the deploying account), and
lets the accounts it names put the team's events on the bus, with that source only (their
principals need `events:PutEvents` on the bus in their own account's IAM too). Grant the
policy to the team's people and pipelines in IAM.
IAM condition keys of EventBridge: https://docs.aws.amazon.com/eventbridge/latest/userguide/eb-use-conditions.html
"""

from __future__ import annotations

from aws_cdk import Stack
from aws_cdk import aws_events as events
from aws_cdk import aws_iam as iam
from aws_cdk import aws_s3 as s3

from constructs import Construct
from gpufleet import topology
from gpufleet.domain.config import FleetConfig
from gpufleet.domain.submitters import team_source, upload_key
from infra.constructs import nag


def submitting_teams(fleet_config: FleetConfig) -> list[str]:
    """The teams the stack makes a submit policy for: those the config names (their quotas,
    their submitters)."""
    return sorted(set(fleet_config.queue.teams) | set(fleet_config.submitters))


def submit_statements(bucket_arn: str, bus_arn: str, team: str) -> list[iam.PolicyStatement]:
    """What team `team`'s submit policy grants: its folder's specs (and their error reports),
    and `Job Submitted` events from its source."""
    return [
        iam.PolicyStatement(
            sid="UploadTheTeamsSpecsAndReadTheirReports",
            actions=["s3:PutObject", "s3:GetObjectVersion"],
            resources=[f"{bucket_arn}/{upload_key(team, '*')}"],
        ),
        iam.PolicyStatement(
            sid="SubmitAsTheTeam",
            actions=["events:PutEvents"],
            resources=[bus_arn],
            conditions=_as_team(team),
        ),
    ]


def _as_team(team: str) -> dict[str, dict[str, str]]:
    """The condition of a team's submission events: its source, `Job Submitted`."""
    return {
        "StringEquals": {
            "events:source": team_source(team),
            "events:detail-type": topology.DETAIL_JOB_SUBMITTED,
        }
    }


class Submitters(Construct):
    def __init__(
        self,
        scope: Construct,
        construct_id: str,
        *,
        fleet_config: FleetConfig,
        bucket: s3.IBucket,
        bus: events.EventBus,
    ) -> None:
        super().__init__(scope, construct_id)
        stack = Stack.of(self)
        self.policies: dict[str, iam.ManagedPolicy] = {}
        for index, team in enumerate(submitting_teams(fleet_config)):
            grant = fleet_config.submitters.get(team)
            roles = [
                iam.Role.from_role_arn(self, f"Team{index}Role{at}", arn)
                for at, arn in enumerate(grant.roles if grant else ())
            ]
            policy = iam.ManagedPolicy(
                self,
                f"Team{index}",
                managed_policy_name=f"{stack.stack_name}-submit-{team}"[:128],
                description=f"gpufleet: submit jobs as team {team}",
                statements=submit_statements(bucket.bucket_arn, bus.event_bus_arn, team),
                roles=roles,
            )
            nag.acknowledge(
                policy,
                nag.wildcard_resources(f"{nag.arn_of(bucket)}/{upload_key(team, '*')}")[0],
                "A team's specs are objects it names under its own folder of the intake bucket.",
            )
            self.policies[team] = policy
            for account in grant.accounts if grant else ():
                bus.add_to_resource_policy(
                    iam.PolicyStatement(
                        sid=f"Team{index}From{account}",
                        principals=[iam.AccountPrincipal(account)],
                        actions=["events:PutEvents"],
                        resources=[bus.event_bus_arn],
                        conditions=_as_team(team),
                    )
                )
