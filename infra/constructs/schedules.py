"""EventBridge Scheduler: the dispatcher's regular pass, and a pass at every time-window edge
in gpufleet.yaml so a window opens and its reserve is reclaimed on time."""

from __future__ import annotations

from collections.abc import Mapping

from aws_cdk import aws_iam as iam
from aws_cdk import aws_lambda as lambda_
from aws_cdk import aws_scheduler as scheduler

from constructs import Construct
from gpufleet import topology
from gpufleet.domain.config import FleetConfig
from infra.constructs import nag
from infra.constructs.intake import dead_letter_queue


def window_edges(config: FleetConfig) -> list[tuple[str, str]]:
    """(name, cron expression) for the start and end of every time window (UTC)."""
    edges = []
    for window in config.queue.windows:
        for edge, hhmm in (("Start", window.start), ("End", window.end)):
            hours, minutes = hhmm.split(":")
            edges.append((f"{window.name}-{edge}", f"cron({int(minutes)} {int(hours)} * * ? *)"))
    return edges


class Schedules(Construct):
    def __init__(
        self,
        scope: Construct,
        construct_id: str,
        *,
        functions: Mapping[str, lambda_.IFunction],
        fleet_config: FleetConfig,
    ) -> None:
        super().__init__(scope, construct_id)
        role = iam.Role(
            self,
            "InvokeRole",
            assumed_by=iam.ServicePrincipal("scheduler.amazonaws.com"),
            description="gpufleet schedules: invoke their target functions",
        )
        dead_letters = dead_letter_queue(self, "DeadLetters")
        self.dead_letter_queue = dead_letters
        dead_letters.grant_send_messages(role)
        nag.acknowledge(
            dead_letters,
            "AwsSolutions-SQS3",
            "This queue is itself the dead-letter queue of the schedules.",
        )
        targets: list[tuple[str, str, str]] = [
            (s.construct_id, s.expression, s.target_function) for s in topology.SCHEDULES
        ]
        targets += [
            (f"Window{name}", expression, topology.DISPATCH.construct_id)
            for name, expression in window_edges(fleet_config)
        ]
        self.schedules: dict[str, scheduler.CfnSchedule] = {}
        for schedule_id, expression, function_id in targets:
            function = functions[function_id]
            # The function itself, not `arn:*` (versions and aliases) as grant_invoke would.
            role.add_to_policy(
                iam.PolicyStatement(
                    actions=["lambda:InvokeFunction"], resources=[function.function_arn]
                )
            )
            self.schedules[schedule_id] = scheduler.CfnSchedule(
                self,
                schedule_id,
                schedule_expression=expression,
                schedule_expression_timezone="UTC",
                flexible_time_window=scheduler.CfnSchedule.FlexibleTimeWindowProperty(mode="OFF"),
                target=scheduler.CfnSchedule.TargetProperty(
                    arn=function.function_arn,
                    role_arn=role.role_arn,
                    retry_policy=scheduler.CfnSchedule.RetryPolicyProperty(
                        maximum_retry_attempts=2, maximum_event_age_in_seconds=300
                    ),
                    dead_letter_config=scheduler.CfnSchedule.DeadLetterConfigProperty(
                        arn=dead_letters.queue_arn
                    ),
                ),
            )
