"""Honest output: what submitters and jobs wrote reaches the operator's terminal as text, never
as terminal commands (`--raw` prints it as it is), and a bad spec is an error, not a traceback."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from gpufleet.cli import main
from gpufleet.cli.logs import log_line
from gpufleet.cli.table import printable, render, render_fields

HOSTILE = {
    "\x1b[2J\x1b[H": "\\x1b[2J\\x1b[H",  # clear the screen
    "\x1b]0;pwned\x07": "\\x1b]0;pwned\\x07",  # set the window title
    "ok\rFAILED": "ok\\rFAILED",  # overwrite the line
    "a\nfake: line": "a\\nfake: line",
    "\x9b31m": "\\x9b31m",  # the one-byte CSI
    "\u202eevil": "\\u202eevil",  # right-to-left override
    "zero\u200bwidth": "zero\\u200bwidth",
}


@pytest.mark.parametrize(("text", "shown"), HOSTILE.items(), ids=repr)
def test_control_and_format_characters_are_escaped(text: str, shown: str) -> None:
    assert printable(text) == shown
    assert printable(text, raw=True) == text


def test_text_people_read_is_left_alone() -> None:
    for text in ["resnet-baseline", "训练 🚀 café", "s3://bucket/jobs/a b.yaml", "tab-free"]:
        assert printable(text) is text


def test_tables_and_fields_escape_every_value_and_key() -> None:
    rows = [{"id": "j-1", "name": "\x1b[31mred", "flags": ["\x07bell"]}]
    table = render(rows, [("id", "job"), ("name", "name"), ("flags", "flags")])
    assert "\x1b" not in table and "\x07" not in table
    assert "\\x1b[31mred" in table and "\\x07bell" in table
    fields = render_fields({"source\x1b": "s3://b/jobs/\x1b[2J.yaml"})
    assert fields == "source\\x1b: s3://b/jobs/\\x1b[2J.yaml"
    assert "\x1b[2J" in render_fields({"source": "s3://b/jobs/\x1b[2J.yaml"}, raw=True)


def test_a_log_line_is_printed_escaped_and_json_stays_json() -> None:
    event = {"logStreamName": "j-1/i-0abc", "timestamp": 0, "message": "\x1b[2Jdone\r\n"}
    assert log_line(event, as_json=False, raw=False).endswith("i-0abc  \\x1b[2Jdone")
    assert log_line(event, as_json=False, raw=True).endswith("\x1b[2Jdone")
    assert json.loads(log_line(event, as_json=True, raw=False))["message"] == "\x1b[2Jdone\r\n"


def test_plan_refuses_a_duration_too_large_for_a_float(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    spec = tmp_path / "forever.yaml"
    spec.write_text("name: x\nteam: t\nimage: i\ncommand: [x]\ntimeout: 1" + "0" * 400 + "\n")
    assert main(["plan", str(spec), "--json"]) == 2
    refusal = json.loads(capsys.readouterr().err)
    assert refusal["error"] == "InvalidJobSpec"
    assert [f["field"] for f in refusal["details"]["fields"]] == ["timeout"]
    assert main(["plan", str(spec)]) == 2
    assert "  timeout: " in capsys.readouterr().err
