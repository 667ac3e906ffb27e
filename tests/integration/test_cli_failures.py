"""The output contract where the network is involved: an endpoint nothing answers on, missing
region and credentials, and an emulator whose port is taken (tests/unit/test_cli_contract.py
holds the rest, for every command)."""

from __future__ import annotations

import socket

import pytest

from gpufleet import topology
from tests.unit.test_cli_contract import NEEDS_TARGET, json_error, no_target, run

__all__ = ["no_target"]  # the fixture, used by name

# What a stack's LAUNCH_TEMPLATES output looks like (topology.launch_templates_value).
DEPLOYED_TEMPLATES = topology.launch_templates_value({"x86_64-nvidia": "lt-0123456789abcdef0"})


def test_a_missing_region_missing_credentials_and_an_unreachable_endpoint_are_exit_2(
    no_target: None, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    for name in topology.COMMON_ENV:
        monkeypatch.setenv(name, "gpufleet-test")
    monkeypatch.setenv(topology.ENV_LAUNCH_TEMPLATES, DEPLOYED_TEMPLATES)
    for name in ("AWS_REGION", "AWS_DEFAULT_REGION", "AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY"):
        monkeypatch.delenv(name, raising=False)
    # `--endpoint-url` below is exported for the command's process (this one): put back after.
    monkeypatch.setenv("AWS_ENDPOINT_URL", "unset-after-the-test")
    monkeypatch.delenv("AWS_ENDPOINT_URL")
    argv = ["status", "j-0", *NEEDS_TARGET, "--json"]
    code, _, err = run(capsys, argv)
    assert code == 2 and "no AWS region" in json_error(err)["message"]
    monkeypatch.setenv("AWS_REGION", "us-east-1")
    code, _, err = run(capsys, argv)
    assert code == 2 and "no AWS credentials" in json_error(err)["message"]
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "testing")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "testing")
    with socket.socket() as closed:  # a port nothing listens on
        closed.bind(("127.0.0.1", 0))
        port = closed.getsockname()[1]
    code, _, err = run(capsys, [*argv, "--endpoint-url", f"http://127.0.0.1:{port}"])
    error = json_error(err)
    assert (code, error["error"]) == (2, "Unreachable")
    assert error["details"]["endpoint_url"].startswith(f"http://127.0.0.1:{port}")


def test_deployment_variables_no_deployment_writes_are_exit_2_before_any_call(
    no_target: None, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    for name in topology.COMMON_ENV:
        monkeypatch.setenv(name, "gpufleet-test")
    monkeypatch.setenv("AWS_REGION", "us-east-1")
    code, out, err = run(capsys, ["status", "j-0", *NEEDS_TARGET, "--json"])
    error = json_error(err)
    assert (code, out, error["error"]) == (2, "", "NoTarget")
    assert f"{topology.ENV_LAUNCH_TEMPLATES} must be KEY=VALUE" in error["message"]


def test_the_emulator_refuses_a_taken_port_at_once(
    capsys: pytest.CaptureFixture[str],
) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        code, out, err = run(capsys, ["emulator", "--port", str(port), "--json"])
    error = json_error(err)
    assert (code, out) == (2, "")
    assert f"127.0.0.1:{port} is already in use" in error["message"]
    assert "--port" in error["message"] and error["details"] == {"port": port}
