"""Resource templates: resolution and overrides, the config that holds them, and intake."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, cast

import pytest
from pydantic import ValidationError

from gpufleet.adapters.aws.job_store import item_to_job, job_to_item
from gpufleet.adapters.local.memory import InMemoryObjects, RecordingPublisher
from gpufleet.domain.catalog import load_bundled
from gpufleet.domain.config import (
    MAX_CONFIG_JSON_BYTES,
    ConfigFileError,
    config_from_env,
    config_from_yaml,
    config_to_env,
)
from gpufleet.domain.selection import select
from gpufleet.domain.spec import Resources, SpecError, parse_spec
from gpufleet.domain.templates import UnknownTemplate, apply_template, resolve_resources
from gpufleet.topology import DETAIL_JOB_REJECTED
from tests.helpers import intake_for, local_ports, make_settings, plan_of, sent_as

REPO_CONFIG = config_from_yaml(
    (Path(__file__).resolve().parents[2] / "gpufleet.yaml").read_text(encoding="utf-8")
)
TEMPLATES = {
    "gpu-train": Resources(gpus=8, gpu_memory_gib=40, gpu_models=["A100", "H100"], vcpus=64),
    "gpu-train-large": Resources(gpus=8, gpu_memory_gib=40, gpu_models=["A100"], nodes=2),
    "cpu-preprocess": Resources(gpus=0, vcpus=32, memory_gib=64),
}

SPEC_HEAD = """\
name: llm-finetune
team: nlp
image: public.ecr.aws/acme/train:1.0
command: [python, train.py]
"""


# --- resolve_resources -------------------------------------------------------------------------


def test_without_a_template_the_overrides_are_the_resources() -> None:
    assert resolve_resources(None, {"gpus": 2, "vcpus": 8}, TEMPLATES) == Resources(gpus=2, vcpus=8)


def test_a_template_alone_gives_its_resources() -> None:
    assert resolve_resources("gpu-train", {}, TEMPLATES) == TEMPLATES["gpu-train"]


def test_overrides_replace_only_the_fields_they_name() -> None:
    resolved = resolve_resources("gpu-train", {"nodes": 2, "gpu_models": ["H100"]}, TEMPLATES)
    assert resolved == Resources(gpus=8, gpu_memory_gib=40, gpu_models=["H100"], vcpus=64, nodes=2)


def test_an_unknown_template_names_the_known_ones() -> None:
    with pytest.raises(UnknownTemplate) as raised:
        resolve_resources("gpu-trian", {}, TEMPLATES)
    assert str(raised.value) == (
        "unknown template 'gpu-trian'; known templates: cpu-preprocess, gpu-train, gpu-train-large"
    )
    with pytest.raises(UnknownTemplate, match="the fleet config defines no templates"):
        resolve_resources("gpu-train", {}, {})


def test_an_override_that_breaks_the_template_is_refused() -> None:
    with pytest.raises(ValidationError, match="multi-node jobs need GPUs"):
        resolve_resources("gpu-train-large", {"gpus": 0}, TEMPLATES)


# --- apply_template on a validated spec -------------------------------------------------------


def test_a_spec_without_a_template_is_left_as_it_is() -> None:
    spec = parse_spec(SPEC_HEAD + "resources: {gpus: 2}\n")
    assert apply_template(spec, TEMPLATES) is spec


def test_a_spec_gets_the_template_with_its_own_resource_fields_on_top() -> None:
    spec = parse_spec(SPEC_HEAD + "template: gpu-train\nresources: {memory_gib: 900}\n")
    resolved = apply_template(spec, TEMPLATES)
    assert resolved.template == "gpu-train"
    assert resolved.resources == TEMPLATES["gpu-train"].model_copy(update={"memory_gib": 900})
    assert resolved.name == spec.name and resolved.command == spec.command


def test_a_template_without_resources_takes_every_field_from_the_template() -> None:
    spec = parse_spec(SPEC_HEAD + "template: cpu-preprocess\n")
    assert apply_template(spec, TEMPLATES).resources == TEMPLATES["cpu-preprocess"]


def test_an_unknown_template_is_a_spec_error_on_the_template_field() -> None:
    spec = parse_spec(SPEC_HEAD + "template: gpu-xl\n")
    with pytest.raises(SpecError) as raised:
        apply_template(spec, TEMPLATES)
    [field] = raised.value.fields
    assert field.field == "template"
    assert "known templates: cpu-preprocess, gpu-train, gpu-train-large" in field.message


def test_overrides_that_make_the_resolved_resources_invalid_are_a_spec_error() -> None:
    spec = parse_spec(SPEC_HEAD + "template: gpu-train-large\nresources: {gpus: 0}\n")
    with pytest.raises(SpecError) as raised:
        apply_template(spec, TEMPLATES)
    assert [f.field for f in raised.value.fields] == ["resources"]
    assert "multi-node jobs need GPUs" in raised.value.fields[0].message


# --- the config ----------------------------------------------------------------------------------


def test_the_repository_config_has_the_four_templates_and_fits_the_environment() -> None:
    assert set(REPO_CONFIG.templates) == {
        "cpu-preprocess",
        "gpu-train",
        "gpu-train-large",
        "tune-small",
    }
    text = config_to_env(REPO_CONFIG)
    assert len(text.encode()) <= MAX_CONFIG_JSON_BYTES
    assert config_from_env(text).templates == REPO_CONFIG.templates


def test_every_repository_template_gets_an_instance_and_cpu_work_gets_no_gpu() -> None:
    catalog = load_bundled()
    for name, resources in REPO_CONFIG.templates.items():
        ranked = select(resources, "auto", catalog, "us-east-1", limit=1000).ranked
        assert ranked, name
        if resources.gpus == 0:
            assert all(r.offering.instance_type.is_cpu_only for r in ranked)
        else:
            assert all(r.offering.instance_type.gpus >= resources.gpus for r in ranked)


def test_a_config_with_an_impossible_template_is_refused() -> None:
    with pytest.raises(ConfigFileError, match="multi-node jobs need GPUs"):
        config_from_yaml("templates:\n  bad: {gpus: 0, nodes: 2}\n")
    with pytest.raises(ConfigFileError, match=r"templates\.Bad\.\[key\]"):
        config_from_yaml("templates:\n  Bad: {gpus: 1}\n")


def test_a_spec_is_held_to_the_same_multi_node_rule_on_its_resources() -> None:
    with pytest.raises(SpecError) as raised:
        parse_spec(SPEC_HEAD + "resources: {gpus: 0, nodes: 2}\n")
    assert [f.field for f in raised.value.fields] == ["resources"]
    assert "multi-node jobs need GPUs" in raised.value.fields[0].message


# --- intake --------------------------------------------------------------------------------------


def _intake_with_repo_templates() -> tuple[Any, Any]:
    ports = local_ports()
    return ports, intake_for(ports, make_settings(config=REPO_CONFIG))


def test_intake_stores_a_templated_spec_with_the_resolved_resources() -> None:
    ports, intake = _intake_with_repo_templates()
    key = "jobs/nlp/finetune.yaml"
    body = SPEC_HEAD + "template: gpu-train-large\nresources: {gpu_models: [H100]}\n"
    cast(InMemoryObjects, ports.objects).objects[key] = body.encode()
    outcome = intake.submit_object(key, f"s3://bucket/{key}#etag", f"s3://bucket/{key}")
    assert outcome.accepted
    stored = ports.jobs.get(outcome.job_id)
    expected = REPO_CONFIG.templates["gpu-train-large"].model_copy(update={"gpu_models": ["H100"]})
    assert stored.spec.template == "gpu-train-large"
    assert stored.spec.resources == expected
    # Its launch is planned for the resolved resources: two nodes with H100s.
    plan = plan_of(ports, outcome.job_id)
    assert plan.nodes == 2
    assert all(
        load_bundled().instance_type(o.instance_type).gpu_model == "H100"
        for step in plan.steps
        for o in step.overrides
    )
    # What DynamoDB holds reads back the same: the template is not applied a second time.
    reloaded = item_to_job(job_to_item(stored))
    assert reloaded.spec.resources == expected
    assert reloaded.spec.template == "gpu-train-large"


def test_intake_resolves_templates_in_event_documents_too() -> None:
    ports, intake = _intake_with_repo_templates()
    document: dict[str, Any] = {
        "name": "prep",
        "team": "nlp",
        "image": "public.ecr.aws/acme/prep:1",
        "command": ["python", "prep.py"],
        "template": "cpu-preprocess",
    }
    outcome = intake.submit_document(document, "event:1", "event:1", sent_as("nlp"))
    assert outcome.accepted
    assert ports.jobs.get(outcome.job_id).spec.resources == REPO_CONFIG.templates["cpu-preprocess"]


def test_intake_refuses_an_unknown_template_with_the_known_names() -> None:
    ports, intake = _intake_with_repo_templates()
    key = "jobs/nlp/typo.yaml"
    cast(InMemoryObjects, ports.objects).objects[key] = (
        SPEC_HEAD + "template: gpu-trian\n"
    ).encode()
    outcome = intake.submit_object(key, key, key)
    assert not outcome.accepted
    assert ports.jobs.list_jobs() == []
    report = json.loads(cast(InMemoryObjects, ports.objects).objects[key + ".error.json"])
    assert report["fields"] == [
        {
            "field": "template",
            "message": "unknown template 'gpu-trian'; known templates: cpu-preprocess, "
            "gpu-train, gpu-train-large, tune-small",
        }
    ]
    assert cast(RecordingPublisher, ports.events).of_type(DETAIL_JOB_REJECTED)
