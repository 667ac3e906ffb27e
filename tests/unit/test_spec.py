from __future__ import annotations

import json

import pytest

from gpufleet.domain.spec import (
    MAX_SPEC_BYTES,
    JobSpec,
    SpecError,
    SpotPolicy,
    json_schema,
    parse_duration,
    parse_spec,
)

VALID_YAML = """
name: resnet
team: vision
image: public.ecr.aws/pytorch/pytorch:2.4.0
command: [python, train.py, --epochs, "3"]
env: {WANDB_MODE: offline}
resources: {gpus: 2, gpu_memory_gib: 24, gpu_models: [A10G, L4], vcpus: 8, memory_gib: 32}
spot: required
checkpoint: s3://ckpt-bucket/vision/resnet/
timeout: 90m
expected_duration: 1.5h
budget_usd: 12.5
"""


def errors_of(raw: str | bytes) -> dict[str, str]:
    with pytest.raises(SpecError) as caught:
        parse_spec(raw)
    return {f.field: f.message for f in caught.value.fields}


def test_a_full_yaml_spec_parses_with_every_field() -> None:
    spec = parse_spec(VALID_YAML)
    assert spec.command == ["python", "train.py", "--epochs", "3"]
    assert spec.resources.gpus == 2
    assert spec.resources.total_gpus == 2
    assert spec.spot is SpotPolicy.REQUIRED
    assert spec.timeout_seconds == 5400
    assert spec.expected_duration_seconds == 5400
    assert spec.max_retries == 3  # the default


def test_json_and_yaml_give_the_same_spec() -> None:
    from_yaml = parse_spec(VALID_YAML)
    from_json = parse_spec(json.dumps(from_yaml.to_document()), "json")
    assert from_json == from_yaml


def test_defaults_for_a_minimal_spec() -> None:
    spec = parse_spec("name: a\nteam: b\nimage: img\ncommand: [run]\n")
    assert spec.spot is SpotPolicy.AUTO
    assert spec.resources.nodes == 1
    assert spec.resources.arch.value == "x86_64"
    assert spec.timeout_seconds == 86400


def test_every_bad_field_is_named() -> None:
    errors = errors_of(
        """
name: Not Valid!
team: ok
image: "img; rm -rf /"
command: ["python"]
resources: {gpus: -1, nodes: 0, colour: blue}
spot: sometimes
max_retries: 99
"""
    )
    assert set(errors) == {
        "name",
        "image",
        "resources.gpus",
        "resources.nodes",
        "resources.colour",
        "spot",
        "max_retries",
    }


def test_a_shell_string_command_is_refused_with_a_helpful_message() -> None:
    errors = errors_of("name: a\nteam: b\nimage: img\ncommand: python train.py && curl x\n")
    assert "argv list" in errors["command"]


def test_missing_required_fields_are_listed() -> None:
    assert set(errors_of("team: b\n")) == {"name", "image", "command"}


@pytest.mark.parametrize(
    ("raw", "message"),
    [
        ("[1, 2]", "mapping"),
        ("name: [unclosed", "not valid"),
        (b"\xff\xfe name: x", "UTF-8"),
        ("a: &x [1]\nb: *x\n", "aliases"),
        ("x" * (MAX_SPEC_BYTES + 1), "limit"),
    ],
)
def test_malformed_documents_get_one_clear_error(raw: str | bytes, message: str) -> None:
    with pytest.raises(SpecError) as caught:
        parse_spec(raw)
    assert message in caught.value.message
    assert caught.value.to_dict()["error"] == "InvalidJobSpec"


def test_multi_node_jobs_need_gpus() -> None:
    with pytest.raises(SpecError):
        parse_spec("name: a\nteam: b\nimage: i\ncommand: [x]\nresources: {gpus: 0, nodes: 2}\n")


@pytest.mark.parametrize(
    ("value", "seconds"), [(60, 60), ("90m", 5400), ("4h", 14400), ("1.5d", 129600), ("30", 30)]
)
def test_durations(value: object, seconds: int) -> None:
    assert parse_duration(value) == seconds


@pytest.mark.parametrize("value", ["soon", -5, 0, True, None, "4 weeks"])
def test_bad_durations(value: object) -> None:
    with pytest.raises(ValueError, match="duration"):
        parse_duration(value)


def test_schema_describes_the_submitted_field_names() -> None:
    schema = json_schema()
    assert {"name", "team", "image", "command", "timeout", "resources", "spot"} <= set(
        schema["properties"]
    )
    assert set(schema["required"]) == {"name", "team", "image", "command"}


def test_specs_are_immutable() -> None:
    spec = parse_spec(VALID_YAML)
    with pytest.raises(Exception):  # noqa: B017, PT011 - pydantic's frozen error
        spec.name = "other"  # type: ignore[misc]
    assert isinstance(spec, JobSpec)
