"""What `gpufleet doctor` reads of a deployed stack is in the synthesized template, and the
emulator's published stack reads the same SSM parameters."""

from __future__ import annotations

from tests.infrastructure.conftest import Synth

from gpufleet import topology
from gpufleet.emulator.account_baseline import stack_parameters

SSM_TYPE = "AWS::SSM::Parameter::Value<"


def _ssm_parameters(parameters: dict[str, dict[str, str]]) -> set[tuple[str, str]]:
    return {
        (p["Type"], p["Default"]) for p in parameters.values() if p["Type"].startswith(SSM_TYPE)
    }


def test_every_output_the_cli_reads_is_in_the_template(synth: Synth) -> None:
    assert set(topology.STACK_OUTPUTS) <= set(synth.doc["Outputs"])
    subnets = synth.doc["Outputs"]["SubnetIds"]["Value"]
    launch = synth.function_env(topology.LAUNCH.construct_id)
    assert subnets == launch[topology.ENV_SUBNETS]


def test_the_emulator_publishes_the_ssm_parameters_the_stack_resolves(synth: Synth) -> None:
    assert _ssm_parameters(stack_parameters()) == _ssm_parameters(synth.doc["Parameters"])
