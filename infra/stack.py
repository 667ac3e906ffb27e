"""The gpufleet stack: composes the constructs, owns no resources of its own."""

from __future__ import annotations

from typing import Any

from aws_cdk import Annotations, CfnOutput, Stack

from constructs import Construct
from gpufleet import topology
from gpufleet.domain.config import FleetConfig
from gpufleet.domain.notify import notified_teams
from infra.config import DEFAULT_STACK_NAME, GpuFleetConfig
from infra.constructs.code import CodeSource, code_asset
from infra.constructs.fleet import Fleet
from infra.constructs.functions import Functions
from infra.constructs.intake import Intake
from infra.constructs.job_store import JobStore
from infra.constructs.notifications import Notifications
from infra.constructs.operations import Operations
from infra.constructs.schedules import Schedules
from infra.constructs.submitters import Submitters
from infra.constructs.workflow import Workflow, executions_arn, state_machine_arn

STACK_NAME = DEFAULT_STACK_NAME  # the default: -c stack_name=... names another


class GpuFleetStack(Stack):
    def __init__(
        self,
        scope: Construct,
        construct_id: str,
        *,
        config: GpuFleetConfig,
        fleet_config: FleetConfig,
        code: CodeSource,
        **kwargs: Any,
    ) -> None:
        super().__init__(scope, construct_id, **kwargs)
        if config.uses_placeholder_network:
            Annotations.of(self).add_warning_v2(
                "gpufleet:placeholder-network",
                "vpc_id/subnet_ids are placeholders: deploy with -c vpc_id=vpc-... "
                "-c subnet_ids=subnet-...,subnet-...",
            )

        job_store = JobStore(self, "JobStore")
        notifications = Notifications(self, "Notifications", teams=fleet_config.teams)
        intake = Intake(self, "Intake", config=config)
        # One zip of the package: the functions run it and the node agent downloads it.
        code_zip = code_asset(self, "Code", code)
        fleet = Fleet(
            self,
            "Fleet",
            config=config,
            fleet_config=fleet_config,
            bus=intake.bus,
            bucket=intake.bucket,
            agent_code=code_zip,
        )
        functions = Functions(
            self,
            "Functions",
            config=config,
            fleet_config=fleet_config,
            code=code_zip,
            job_store=job_store,
            bus=intake.bus,
            bucket=intake.bucket,
            fleet=fleet,
            alerts=notifications,
        )
        workflow = Workflow(
            self,
            "Workflow",
            config=config,
            functions=functions.by_id(),
            environment={
                **functions.environment,
                topology.ENV_SUBNETS: ",".join(fleet.subnet_ids),
            },
        )
        lifecycle = topology.JOB_LIFECYCLE
        functions.connect_workflow(
            state_machine_arn(self, lifecycle), executions_arn(self, lifecycle)
        )
        intake.connect(functions.by_id(), topology.rules(notified_teams(fleet_config.teams)))
        submitters = Submitters(
            self, "Submitters", fleet_config=fleet_config, bucket=intake.bucket, bus=intake.bus
        )
        schedules = Schedules(
            self, "Schedules", functions=functions.by_id(), fleet_config=fleet_config
        )

        operations = Operations(
            self,
            "Operations",
            config=config,
            fleet_config=fleet_config,
            alerts=notifications.topic,
            dead_letter_queues={
                **{f"{cid}Function": q for cid, q in functions.dead_letter_queues.items()},
                **{f"{rid}Target": q for rid, q in intake.rule_dead_letter_queues.items()},
                "Schedules": schedules.dead_letter_queue,
            },
            functions=functions.by_id(),
            state_machines=workflow.state_machines,
        )

        self.job_store = job_store
        self.intake = intake
        self.submitters = submitters
        self.fleet = fleet
        self.functions = functions
        self.workflow = workflow
        self.schedules = schedules
        self.operations = operations

        CfnOutput(self, "IntakeBucketName", value=intake.bucket.bucket_name)
        CfnOutput(self, "EventBusName", value=intake.bus.event_bus_name)
        CfnOutput(self, "AlertsTopicArn", value=notifications.topic.topic_arn)
        for table_spec in topology.TABLES:
            CfnOutput(
                self,
                f"{table_spec.construct_id}Name",
                value=job_store.tables[table_spec.construct_id].table_name,
            )
        for sm_spec in topology.STATE_MACHINES:
            CfnOutput(
                self,
                f"{sm_spec.construct_id}Arn",
                value=workflow.state_machines[sm_spec.construct_id].state_machine_arn,
            )
        # The launch templates by key: what the deployment boots (`gpufleet plan --stack`).
        CfnOutput(self, "LaunchTemplates", value=fleet.launch_templates_value())
        # The subnets the nodes launch into: `gpufleet doctor` checks their routes.
        CfnOutput(self, "SubnetIds", value=",".join(fleet.subnet_ids))
        CfnOutput(self, "AgentLogGroupName", value=fleet.agent_log_group.log_group_name)
        CfnOutput(self, "DashboardName", value=operations.dashboard.dashboard_name)
        CfnOutput(self, "DashboardUrl", value=operations.dashboard_url)
