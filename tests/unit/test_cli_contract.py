"""The output contract (docs/cli.md, "Output, errors and exit codes"), for every command: each
takes --json and --debug; under --json an error is one JSON object on stderr of one shape;
exit 2 for what the user can fix, 1 for the unexpected, never a traceback without --debug.

`FAILURES` holds one way to make each command fail without AWS: a command the parser knows and
this table does not fails the test, so a new command is held to the contract too."""

from __future__ import annotations

import argparse
import json
import re
from typing import Any

import pytest

from gpufleet import topology
from gpufleet.cli import build_parser, main, version
from gpufleet.cli.output import ErrorCode
from gpufleet.cli.queue import booking_document
from gpufleet.domain.queueing import Booking

NOT_HERE = "/nonexistent/gpufleet-test"
NEEDS_TARGET = ("--config", f"{NOT_HERE}/gpufleet.yaml")  # the defaults: no config file
# command -> (argv that makes it fail, the error code it must report)
FAILURES: dict[str, tuple[list[str], ErrorCode]] = {
    "schema": (["schema", "--no-such-flag"], ErrorCode.INVALID_ARGUMENTS),
    "plan": (["plan", "--gpus", "1", "--limit", "0"], ErrorCode.INVALID_ARGUMENTS),
    "templates": (["templates", "--config", f"{NOT_HERE}.yaml"], ErrorCode.NOT_FOUND),
    "submit": (["submit", f"{NOT_HERE}.yaml"], ErrorCode.NOT_FOUND),
    "status": (["status", "j-0", *NEEDS_TARGET], ErrorCode.NO_TARGET),
    "list": (["list", *NEEDS_TARGET], ErrorCode.NO_TARGET),
    "run": (["run", f"{NOT_HERE}.yaml"], ErrorCode.NOT_FOUND),
    "logs": (["logs", "j-0", *NEEDS_TARGET], ErrorCode.NO_TARGET),
    "cost": (["cost", *NEEDS_TARGET], ErrorCode.NO_TARGET),
    "report": (["report", "j-0", *NEEDS_TARGET], ErrorCode.NO_TARGET),
    "review": (["review", "--since", "soon"], ErrorCode.INVALID_ARGUMENTS),
    "catalog show": (["catalog", "show", "--price-region", "xx-none-1"], ErrorCode.NOT_FOUND),
    "catalog refresh": (
        ["catalog", "refresh", "--region", "us-east-1-atl-1"],
        ErrorCode.INVALID_ARGUMENTS,
    ),
    "queue": (["queue", *NEEDS_TARGET], ErrorCode.NO_TARGET),
    "cancel": (["cancel", "j-0", *NEEDS_TARGET], ErrorCode.NO_TARGET),
    "resize": (["resize", "j-0", "--gpus", "2", *NEEDS_TARGET], ErrorCode.NO_TARGET),
    "book": (
        ["book", "--team", "t", "--gpus", "1", "--from", "soon", "--to", "later"],
        ErrorCode.INVALID_ARGUMENTS,
    ),
    "simulate": (["simulate", "--format", "itp", "--data", NOT_HERE], ErrorCode.DATA_MISSING),
    "demo": (["demo", "--scenario", "no-such-scenario"], ErrorCode.INVALID_ARGUMENTS),
    # chaos.py checks --jobs itself, in plain text (another module's): its usage errors here.
    "chaos": (["chaos", "--jobs", "many"], ErrorCode.INVALID_ARGUMENTS),
    "emulator": (["emulator", "--scenario", f"{NOT_HERE}.json"], ErrorCode.NOT_FOUND),
    "doctor": (["doctor", "--smoke-timeout", "0"], ErrorCode.INVALID_ARGUMENTS),
}


def leaf_commands(
    parser: argparse.ArgumentParser, prefix: str = ""
) -> dict[str, argparse.ArgumentParser]:
    """Every command a user can run ("catalog show" included), with its parser."""
    found: dict[str, argparse.ArgumentParser] = {}
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                found.update(leaf_commands(sub, f"{prefix} {name}".strip()))
    return found or {prefix: parser}


@pytest.fixture
def no_target(monkeypatch: pytest.MonkeyPatch) -> None:
    """A shell that exported nothing of gpufleet's, with no AWS profile to fall back on."""
    for name in (*topology.COMMON_ENV, "AWS_ENDPOINT_URL", "AWS_PROFILE"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("AWS_CONFIG_FILE", f"{NOT_HERE}/config")
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", f"{NOT_HERE}/credentials")
    monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")


def run(capsys: pytest.CaptureFixture[str], argv: list[str]) -> tuple[int, str, str]:
    code = main(argv)
    out, err = capsys.readouterr()
    return code, out, err


def json_error(err: str) -> dict[str, Any]:
    """The one error line of a command run with --json, in the contract's shape."""
    error: dict[str, Any] = json.loads(err)
    assert set(error) == {"error", "message", "details"}
    assert error["error"] in {code.value for code in ErrorCode}
    assert isinstance(error["message"], str) and error["message"]
    assert isinstance(error["details"], dict)
    return error


def test_every_command_is_held_to_the_contract_and_takes_json_and_debug() -> None:
    commands = leaf_commands(build_parser())
    assert set(commands) == set(FAILURES)
    for name, parser in commands.items():
        flags = {flag for action in parser._actions for flag in action.option_strings}
        assert {"--json", "--debug"} <= flags, name


@pytest.mark.parametrize("command", sorted(FAILURES))
def test_an_error_is_one_json_object_on_stderr_or_one_line_for_people(
    command: str, no_target: None, capsys: pytest.CaptureFixture[str]
) -> None:
    argv, code = FAILURES[command]
    exit_code, out, err = run(capsys, [*argv, "--json"])
    assert (exit_code, out) == (2, "")
    assert json_error(err)["error"] == code.value
    exit_code, out, err = run(capsys, argv)
    assert (exit_code, out) == (2, "")
    assert err.startswith("gpufleet: ") and "Traceback" not in err


def test_an_unexpected_failure_is_exit_1_without_a_traceback_unless_debug(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    def broken(_args: argparse.Namespace) -> int:
        raise RuntimeError("a bug")

    monkeypatch.setattr("gpufleet.cli.schema.run", broken)
    code, out, err = run(capsys, ["schema", "--json"])
    error = json_error(err)
    assert (code, out, error["error"]) == (1, "", "Unexpected")
    assert "a bug" in error["message"] and "--debug" in error["message"]
    code, _, err = run(capsys, ["schema"])
    assert code == 1 and "Traceback" not in err
    with pytest.raises(RuntimeError, match="a bug"):
        main(["schema", "--debug"])


def test_version(capsys: pytest.CaptureFixture[str]) -> None:
    assert run(capsys, ["--version"]) == (0, f"gpufleet {version()}\n", "")
    assert re.fullmatch(r"\d+\.\d+\.\d+.*", version())


def test_plan_limit_is_honoured_alike_by_the_text_and_the_json(
    capsys: pytest.CaptureFixture[str],
) -> None:
    argv = ["plan", "--gpus", "1", "--limit", "3"]
    code, text, _ = run(capsys, argv)
    assert code == 0
    more = re.search(r"and (\d+) more feasible offerings", text)
    assert more is not None
    code, out, _ = run(capsys, [*argv, "--json"])
    document = json.loads(out)
    assert len(document["offerings"]) == 3
    assert document["more_feasible"] == int(more.group(1)) > 0
    assert document["price_region"] == "us-east-1"
    assert document["prices_as_of"]["date"] in text  # the prices say their date


def test_a_booking_prints_its_window_in_iso_8601() -> None:
    booking = Booking("b-1", "vision", 8, start=1_800_000_000.0, end=1_800_003_600.0)
    shown = booking_document(booking)
    assert (shown["start"], shown["end"]) == (
        "2027-01-15T08:00:00+00:00",
        "2027-01-15T09:00:00+00:00",
    )
