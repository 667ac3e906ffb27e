"""Strict parsing: an accepted spec means exactly one thing wherever it is read. YAML is read as
a notation of JSON; values are taken as written (no coercion); only the documented field names
are accepted; every cap holds after the merges (stages, templates); the JSON Schema states the
rules."""

from __future__ import annotations

import json
import re
from typing import Any

import pytest
import yaml
from hypothesis import HealthCheck, given, settings

from gpufleet.domain.spec import (
    DURATION_PATTERN,
    MAX_ENV,
    JobSpec,
    Resources,
    SpecError,
    json_schema,
    parse_duration,
    parse_spec,
    spec_from_mapping,
)
from gpufleet.domain.templates import apply_template
from tests.spec_strategies import SPECS


class _Yaml12Dumper(yaml.SafeDumper):
    """PyYAML's writer, quoting what YAML 1.2 (and so the spec's loader) reads as a number but
    YAML 1.1 does not: an exponent without a dot ('0E0'), which PyYAML would write plain."""


_Yaml12Dumper.add_implicit_resolver(
    "tag:yaml.org,2002:float",
    re.compile(r"^-?(?:0|[1-9][0-9]*)[eE][-+]?[0-9]+$"),
    list("-0123456789"),
)


def _yaml(document: dict[str, Any], **options: Any) -> str:
    return yaml.dump(document, Dumper=_Yaml12Dumper, **options)


HEAD = "name: a\nteam: t\nimage: img\ncommand: [x]\n"
VALID: dict[str, Any] = {"name": "a", "team": "t", "image": "img", "command": ["x"]}


def refusal(raw: str) -> SpecError:
    with pytest.raises(SpecError) as caught:
        parse_spec(raw)
    return caught.value


@pytest.mark.parametrize(
    "line",
    [
        "resources: {gpus: '3'}",  # a string is no count
        "resources: {gpus: 1.0}",  # nor a fraction
        "resources: {gpus: true}",  # nor a boolean
        "resources: {gpus: 010}",  # octal in YAML 1.1, ten in 1.2: neither
        "resources: {gpus: 0x10}",
        "resources: {gpus: 1_0}",
        "max_retries: '2'",
        "retry_exit_codes: [1.0]",
        "retry_oom_with_more_memory: yes",  # a boolean in YAML 1.1 only
        "retry_oom_with_more_memory: 'true'",
        "resources: {gpu_memory_gib: '80'}",
        "resources: {gpu_memory_gib: .inf}",
        "timeout: 1:30",  # sexagesimal 90 in YAML 1.1
        "timeout: ' 90m'",
        "timeout: 0.5s",  # no rounding to whole seconds
        "timeout: true",
        "timeout_seconds: 600",  # the model's name, not the documented one
        "stages: [{name: s, timeout_seconds: 600}]",
        "<<: {spot: never}",  # no merge keys
    ],
)
def test_a_value_is_never_coerced_into_another(line: str) -> None:
    error = refusal(HEAD + line + "\n")
    assert error.fields, error.message


@pytest.mark.parametrize(
    ("raw", "message"),
    [
        (HEAD + "name: b\n", "the key 'name' twice"),
        ('{"name": "a", "name": "b"}', "the key 'name' twice"),
        (HEAD + "env: {A: 1, A: 2}\n", "twice"),
        (HEAD + "env: !!set {a, b}\n", "set"),
        (HEAD + "checkpoint: !!binary aW1n\n", "binary"),
        (HEAD + "env: {A: !!timestamp 2024-01-01}\n", "timestamp"),
        (HEAD + "resources: {gpus: !!int 0x10}\n", "non-decimal"),
        (HEAD + "env: {1: x}\n", "not a string"),
        ('{"name": NaN}', "NaN"),
        ("  \n", "empty"),
    ],
)
def test_yaml_is_read_as_json_and_duplicates_are_refused(raw: str, message: str) -> None:
    assert message in refusal(raw).message


@pytest.mark.parametrize("value", ["a\nb", "a\r", "\x00"])
def test_an_env_value_the_container_cannot_get_is_refused(value: str) -> None:
    with pytest.raises(SpecError) as caught:
        spec_from_mapping({**VALID, "env": {"A": value}})
    assert [f.field for f in caught.value.fields] == ["env.A"]


def test_plain_scalars_json_would_not_read_as_values_are_strings() -> None:
    spec = parse_spec(HEAD.replace("command: [x]", "command: [yes, 010, 1:30, 2024-01-01, .inf]"))
    assert spec.command == ["yes", "010", "1:30", "2024-01-01", ".inf"]


@settings(
    max_examples=100, derandomize=True, deadline=None, suppress_health_check=[HealthCheck.too_slow]
)
@given(document=SPECS)
def test_a_spec_means_the_same_in_yaml_json_and_its_stored_form(document: dict[str, Any]) -> None:
    try:
        spec = spec_from_mapping(document)
    except SpecError:
        return
    notations = [
        json.dumps(document),
        _yaml(document),
        _yaml(document, default_flow_style=True),  # starts with "{", and is no JSON
        spec.stored_form(),
    ]
    # PyYAML writes YAML's own line breaks raw when allowed unicode, where YAML folds them.
    if not any(char in json.dumps(document) for char in ("\\u0085", "\\u2028", "\\u2029")):
        notations.append(_yaml(document, allow_unicode=True))
    for notation in notations:
        assert parse_spec(notation) == spec
    assert JobSpec.model_validate(json.loads(spec.stored_form())) == spec


def test_a_spec_too_large_as_stored_names_the_field_to_make_smaller() -> None:
    # 192 KB of YAML: each "\x01" (4 bytes) is stored as "\u0001" (6).
    values = {f"V{i}": "\x01" * 8000 for i in range(6)}
    raw = HEAD + "env:\n" + "".join(f'  {k}: "' + "\\x01" * 8000 + '"\n' for k in values)
    assert len(raw.encode()) < 200 * 1024
    error = refusal(raw)
    assert "as stored" in error.message
    assert [f.field for f in error.fields] == ["env"]


@pytest.mark.parametrize(
    ("value", "seconds"), [(3600, 3600), (7200.0, 7200), ("1.5d", 129600), ("0.5m", 30)]
)
def test_a_duration_is_whole_seconds(value: object, seconds: int) -> None:
    assert parse_duration(value) == seconds


@pytest.mark.parametrize("value", [10**400, "9" * 400, 1e300])
def test_a_duration_too_large_for_a_float_is_a_duration_too_long(value: object) -> None:
    with pytest.raises(SpecError) as caught:
        spec_from_mapping({**VALID, "timeout": value})
    assert [f.field for f in caught.value.fields] == ["timeout"]


def test_a_stage_runs_with_at_most_the_env_cap_after_its_env_is_laid_over_the_jobs() -> None:
    job_env = {f"J{i}": "x" for i in range(MAX_ENV)}
    shared = {**VALID, "env": job_env, "stages": [{"name": "s", "env": {"J0": "y"}}]}
    assert spec_from_mapping(shared).for_stage(0).env["J0"] == "y"  # an override adds nothing
    with pytest.raises(SpecError) as caught:
        spec_from_mapping({**shared, "stages": [{"name": "s", "env": {"S0": "y"}}]})
    assert [f.field for f in caught.value.fields] == ["stages"]
    assert f"{MAX_ENV + 1} environment variables" in caught.value.fields[0].message


def test_scale_on_needs_an_elastic_range_once_the_template_is_resolved() -> None:
    document = {**VALID, "template": "gpu", "scale_on": {"metric": "tput", "below": 1}}
    with pytest.raises(SpecError) as caught:
        apply_template(spec_from_mapping(document), {"gpu": Resources(gpus=8)})
    assert [f.field for f in caught.value.fields] == ["scale_on"]
    elastic = {"gpu": Resources(gpus=8, nodes=2, elastic={"max_nodes": 4})}
    assert apply_template(spec_from_mapping(document), elastic).resources.elastic is not None


def test_the_schema_states_the_rules() -> None:
    schema = json_schema()
    assert "notation of JSON" in schema["description"]
    assert "duplicate keys" in schema["description"]
    timeout = schema["properties"]["timeout"]["anyOf"]
    assert {"type": "integer", "minimum": 60, "maximum": 14 * 86400} in timeout
    assert {"type": "string", "pattern": DURATION_PATTERN} in timeout
    gpus = schema["$defs"]["Resources"]["properties"]["gpus"]
    assert gpus["type"] == "integer"
