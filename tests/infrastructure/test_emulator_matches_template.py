"""The embedded account and the synthesized stack are built from one topology; this checks the
result, so that what the demo and the tests exercise is what `cdk deploy` creates."""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from typing import Any

import pytest
from tests.infrastructure.conftest import Synth

from gpufleet import topology
from gpufleet.adapters.aws.fleet import Ec2Fleet
from gpufleet.domain.launch import CapacityType, LaunchOverride, LaunchRequest
from gpufleet.emulator.account import AMI_BY_ARCH, Account, embedded_account
from gpufleet.settings import Settings


@pytest.fixture(scope="module")
def account() -> Iterator[Account]:
    with embedded_account() as created:
        yield created


def _keys(schema: list[dict[str, str]]) -> list[tuple[str, str]]:
    return [(k["AttributeName"], k["KeyType"]) for k in schema]


def _template_table(synth: Synth, table: topology.Table) -> dict[str, Any]:
    env = synth.function_env(topology.ENQUEUE.construct_id)
    return synth.props(env[table.env_var]["Ref"])


@pytest.mark.parametrize("table", topology.TABLES, ids=lambda t: t.construct_id)
def test_tables_keys_and_indexes_match(
    synth: Synth, account: Account, table: topology.Table
) -> None:
    template = _template_table(synth, table)
    live = account.client("dynamodb").describe_table(
        TableName=account.table_names[table.construct_id]
    )["Table"]
    assert _keys(live["KeySchema"]) == _keys(template["KeySchema"])
    assert sorted(map(json.dumps, live["AttributeDefinitions"])) == sorted(
        map(json.dumps, template["AttributeDefinitions"])
    )
    live_indexes = {
        i["IndexName"]: _keys(i["KeySchema"]) for i in live.get("GlobalSecondaryIndexes", [])
    }
    template_indexes = {
        i["IndexName"]: _keys(i["KeySchema"]) for i in template.get("GlobalSecondaryIndexes", [])
    }
    assert live_indexes == template_indexes
    ttl = account.client("dynamodb").describe_time_to_live(
        TableName=account.table_names[table.construct_id]
    )["TimeToLiveDescription"]
    template_ttl = template.get("TimeToLiveSpecification", {}).get("AttributeName")
    assert ttl.get("AttributeName") == template_ttl


def _rule_in_template(synth: Synth, rule: topology.Rule) -> dict[str, Any]:
    [props] = [
        r["Properties"]
        for r in synth.of_type("AWS::Events::Rule").values()
        if r["Properties"].get("EventPattern") == rule.pattern
    ]
    return props


@pytest.mark.parametrize("rule", topology.RULES, ids=lambda r: r.construct_id)
def test_rules_match_pattern_and_target(
    synth: Synth, account: Account, rule: topology.Rule
) -> None:
    template = _rule_in_template(synth, rule)
    events = account.client("events")
    bus = "default" if rule.on_default_bus else account.bus
    live = events.describe_rule(Name=rule.construct_id, EventBusName=bus)
    assert json.loads(live["EventPattern"]) == template["EventPattern"]
    [target] = events.list_targets_by_rule(Rule=rule.construct_id, EventBusName=bus)["Targets"]
    live_handler = account.client("lambda").get_function_configuration(FunctionName=target["Arn"])[
        "Handler"
    ]
    [template_target] = template["Targets"]
    target_id = template_target["Arn"]["Fn::GetAtt"][0]
    assert synth.props(target_id)["Handler"] == live_handler


def test_functions_match_handlers_and_deployment_variables(synth: Synth, account: Account) -> None:
    lambda_client = account.client("lambda")
    deployment_vars = set(topology.COMMON_ENV) | {
        name for names in topology.EXTRA_ENV.values() for name in names
    }
    for function in topology.FUNCTIONS:
        live = lambda_client.get_function_configuration(
            FunctionName=account.function_arns[function.construct_id]
        )
        template_env = synth.function_env(function.construct_id)
        assert live["Handler"] == synth.props(synth.function_id(function.construct_id))["Handler"]
        assert set(live["Environment"]["Variables"]) == set(template_env) & deployment_vars
        # What the template gives a function is enough for its handler's settings.
        settings = Settings.from_env(
            {
                **dict.fromkeys(template_env, "x"),
                topology.ENV_CONFIG: "{}",
                topology.ENV_ROOT_VOLUME: template_env.get(topology.ENV_ROOT_VOLUME, "200"),
                topology.ENV_LAUNCH_TEMPLATES: "x86_64-nvidia=lt-0",
                topology.ENV_TEAM_TOPICS: "vision=arn:aws:sns:us-east-1:123456789012:t",
            }
        )
        if topology.ENV_STATE_MACHINE in topology.environment_of(function):
            assert settings.job_state_machine_arn
        assert settings.bootable  # every function plans only what the templates boot
        if topology.ENV_SUBNETS in topology.environment_of(function):
            assert settings.subnet_ids


@pytest.mark.parametrize("machine", topology.STATE_MACHINES, ids=lambda m: m.construct_id)
def test_state_machines_run_the_deployed_definition(
    synth: Synth, account: Account, machine: topology.StateMachine
) -> None:
    [template] = [
        r["Properties"]
        for r in synth.of_type("AWS::StepFunctions::StateMachine").values()
        if r["Properties"]["StateMachineName"].endswith(machine.construct_id)
    ]
    live = account.client("stepfunctions").describe_state_machine(
        stateMachineArn=account.state_machine_arns[machine.construct_id]
    )["definition"]
    # Put the placeholders back where the emulator substituted its function ARNs.
    for placeholder, function_id in machine.function_substitutions.items():
        live = live.replace(account.function_arns[function_id], "${" + placeholder + "}")
    assert live == template["DefinitionString"]
    assert set(re.findall(r"\$\{(\w+)\}", live)) == set(template["DefinitionSubstitutions"])


def test_intake_notification_matches(synth: Synth, account: Account) -> None:
    [notification] = [
        r["Properties"]["NotificationConfiguration"]
        for r in synth.resources.values()
        if r["Type"] == "Custom::S3BucketNotifications"
    ]
    [template_config] = notification["LambdaFunctionConfigurations"]
    live = account.client("s3").get_bucket_notification_configuration(Bucket=account.bucket)
    [live_config] = live["LambdaFunctionConfigurations"]
    assert live_config["Events"] == template_config["Events"]
    assert live_config["Filter"]["Key"]["FilterRules"] == [
        {"Name": rule["Name"].lower(), "Value": rule["Value"]}
        for rule in template_config["Filter"]["Key"]["FilterRules"]
    ]


_jobs = iter(range(1, 1_000_000))


def _template_tags(data: dict[str, Any]) -> list[tuple[str, list[Any]]]:
    return sorted((spec["ResourceType"], spec["Tags"]) for spec in data["TagSpecifications"])


@pytest.mark.parametrize("key", ["x86_64-nvidia", "x86_64-nvidia-efa4"])
def test_the_launch_templates_tag_alike_and_launch_every_capacity_type(
    synth: Synth, account: Account, key: str
) -> None:
    deployed = synth.props(synth.launch_template_ids()[key])["LaunchTemplateData"]
    ec2 = account.client("ec2")
    # EC2 fails a launch whose template tags what the launch does not create (spot requests on
    # an on-demand or reserved launch): the deployed tags must suit every capacity type.
    tagged_as_deployed = ec2.create_launch_template(
        LaunchTemplateName=f"deployed-tags-{key}",
        LaunchTemplateData={
            "ImageId": AMI_BY_ARCH["x86_64"],
            "TagSpecifications": deployed["TagSpecifications"],
        },
    )["LaunchTemplate"]["LaunchTemplateId"]
    fleet = Ec2Fleet(ec2, {"x86_64-nvidia": tagged_as_deployed}, account.subnet_ids)
    for capacity in CapacityType:
        result = fleet.launch(
            LaunchRequest(
                job_id=f"j-{next(_jobs):020x}",
                attempt=0,
                capacity_type=capacity,
                nodes=1,
                overrides=[LaunchOverride(instance_type="g5.xlarge", hourly_usd=1.0)],
            )
        )
        assert result.launched, result.errors
    # And the emulator's templates tag alike, so what the tests launch is what deploys.
    [live] = ec2.describe_launch_template_versions(LaunchTemplateId=account.launch_templates[key])[
        "LaunchTemplateVersions"
    ]
    assert _template_tags(live["LaunchTemplateData"]) == _template_tags(deployed)


def _interfaces(data: dict[str, Any]) -> list[tuple[int, int, str]]:
    return [
        (i["NetworkCardIndex"], i["DeviceIndex"], i["InterfaceType"])
        for i in data.get("NetworkInterfaces", [])
    ]


def test_the_emulator_has_the_stacks_launch_templates(synth: Synth, account: Account) -> None:
    deployed = synth.launch_template_ids()
    assert set(account.launch_templates) == set(deployed)
    ec2 = account.client("ec2")
    for key, logical_id in deployed.items():
        [live] = ec2.describe_launch_template_versions(
            LaunchTemplateId=account.launch_templates[key]
        )["LaunchTemplateVersions"]
        data = synth.props(logical_id)["LaunchTemplateData"]
        assert _interfaces(live["LaunchTemplateData"]) == _interfaces(data), key
