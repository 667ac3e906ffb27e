"""The state machines of `gpufleet.topology.STATE_MACHINES`, from their ASL files as they are."""

from __future__ import annotations

from collections.abc import Mapping

from aws_cdk import ArnFormat, Fn, RemovalPolicy, Stack
from aws_cdk import aws_iam as iam
from aws_cdk import aws_lambda as lambda_
from aws_cdk import aws_logs as logs
from aws_cdk import aws_stepfunctions as sfn

from constructs import Construct
from gpufleet import topology
from infra.config import GpuFleetConfig
from infra.constructs import nag
from infra.constructs.logs import retention


def substitutions(
    spec: topology.StateMachine,
    functions: Mapping[str, lambda_.IFunction],
    environment: Mapping[str, str],
) -> dict[str, str]:
    """Placeholder -> function ARN, and placeholder -> the value of an environment variable."""
    values: dict[str, str] = {}
    for placeholder, function_id in spec.function_substitutions.items():
        values[placeholder] = functions[function_id].function_arn
    for placeholder, variable in spec.value_substitutions.items():
        if variable not in environment:
            raise ValueError(f"{spec.construct_id}: no value for ${{{placeholder}}} ({variable})")
        values[placeholder] = environment[variable]
    return values


def state_machine_name(stack: Stack, spec: topology.StateMachine) -> str:
    return f"{stack.stack_name}-{spec.construct_id}"


def log_group_name(stack: Stack, spec: topology.StateMachine) -> str:
    """Under /aws/vendedlogs/, which keeps Step Functions off the size limit of the account's
    CloudWatch Logs resource policy; and unique to this stack instance (the id CloudFormation
    gives a stack at creation): the group is retained, and a stack created again after a
    rollback or a destroy must not find its name taken."""
    instance = Fn.select(2, Fn.split("/", stack.stack_id))
    return f"/aws/vendedlogs/states/{stack.stack_name}-{spec.construct_id}-{instance}"


def state_machine_arn(stack: Stack, spec: topology.StateMachine) -> str:
    """The ARN built from the name, not a reference to the resource.

    A function that the state machine invokes and that also completes its tasks (AwaitNode)
    would otherwise make a cycle: function -> role policy -> state machine -> function.
    """
    arn: str = stack.format_arn(
        service="states",
        resource="stateMachine",
        resource_name=state_machine_name(stack, spec),
        arn_format=ArnFormat.COLON_RESOURCE_NAME,
    )
    return arn


def executions_arn(stack: Stack, spec: topology.StateMachine) -> str:
    """The ARN pattern of the state machine's executions (one per job, named after it)."""
    arn: str = stack.format_arn(
        service="states",
        resource="execution",
        resource_name=f"{state_machine_name(stack, spec)}:*",
        arn_format=ArnFormat.COLON_RESOURCE_NAME,
    )
    return arn


class Workflow(Construct):
    def __init__(
        self,
        scope: Construct,
        construct_id: str,
        *,
        config: GpuFleetConfig,
        functions: Mapping[str, lambda_.IFunction],
        environment: Mapping[str, str],
    ) -> None:
        super().__init__(scope, construct_id)
        stack = Stack.of(self)
        self.state_machines: dict[str, sfn.StateMachine] = {}
        for spec in topology.STATE_MACHINES:
            invoked = sorted(set(spec.function_substitutions.values()))
            role = iam.Role(
                self,
                f"{spec.construct_id}Role",
                assumed_by=iam.ServicePrincipal("states.amazonaws.com"),
                description=f"gpufleet {spec.construct_id}: invoke its tasks",
            )
            role.add_to_policy(
                iam.PolicyStatement(
                    sid="InvokeTasks",
                    actions=["lambda:InvokeFunction"],
                    resources=[functions[cid].function_arn for cid in invoked],
                )
            )
            log_group = logs.LogGroup(
                self,
                f"{spec.construct_id}Logs",
                log_group_name=log_group_name(stack, spec),
                retention=retention(config.log_retention_days),
                removal_policy=RemovalPolicy.RETAIN,
            )
            machine = sfn.StateMachine(
                self,
                spec.construct_id,
                state_machine_name=state_machine_name(stack, spec),
                definition_body=sfn.DefinitionBody.from_string(spec.definition()),
                definition_substitutions=substitutions(spec, functions, environment),
                state_machine_type=sfn.StateMachineType.STANDARD,
                role=role,
                tracing_enabled=True,
                logs=sfn.LogOptions(
                    destination=log_group,
                    level=sfn.LogLevel.ALL,
                    include_execution_data=True,
                ),
            )
            self.state_machines[spec.construct_id] = machine
            policy = role.node.try_find_child("DefaultPolicy")
            assert policy is not None
            nag.acknowledge_all(
                policy,
                nag.wildcard_resources("*"),
                "Resource * only where AWS requires it: CloudWatch Logs delivery APIs "
                "(logs:CreateLogDelivery and friends) and X-Ray (xray:PutTraceSegments, "
                "GetSamplingRules, ...) have no resource-level permissions.",
            )
