"""`gpufleet plan`: flags and spec files in, a ranked table or JSON out, exit 2 on no match."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from gpufleet.cli import main
from gpufleet.domain.catalog import load_bundled
from gpufleet.domain.duration import estimate_duration
from gpufleet.domain.launch import CapacityType
from gpufleet.domain.planning import plan_launch, rank_offerings
from gpufleet.domain.spec import SpotPolicy, parse_spec


def run(argv: list[str]) -> int:
    return main(["plan", *argv])


SPEC = """\
name: llm-finetune
team: research
image: public.ecr.aws/acme/train:1.0
command: [python, train.py]
resources:
  gpus: 8
  gpu_memory_gib: 80
  gpu_models: [H100]
  nodes: 2
spot: never
expected_duration: 4h
checkpoint: s3://acme-ckpt/llm/
checkpoint_interval: 1h
"""


def test_table_output(capsys: pytest.CaptureFixture[str]) -> None:
    assert run(["--gpus", "8", "--gpu-memory-gib", "80"]) == 0
    out = capsys.readouterr().out
    lines = out.splitlines()
    assert "8x GPU" in lines[0]
    assert "us-east-1" in lines[0]
    header = next(line for line in lines if line.startswith(" #") or line.startswith("#"))
    for column in ("INSTANCE TYPE", "ZONE", "CAPACITY", "$/HOUR", "EXPECTED $", "REASON"):
        assert column in header
    rows = [line for line in lines if line.strip()[:2].strip().isdigit()]
    assert len(rows) == 10
    # aligned: every row has the instance type column at the same offset as the header
    start = header.index("INSTANCE TYPE")
    assert all(row[start] != " " and row[start - 1] == " " for row in rows)
    assert "spot" in out
    assert "interruptions" in out


def test_json_output_best_first(capsys: pytest.CaptureFixture[str]) -> None:
    argv = ["--gpus", "8", "--gpu-memory-gib", "80", "--gpu-model", "H100", "--json"]
    assert run([*argv, "--gpu-model", "H200", "--limit", "5"]) == 0
    doc = json.loads(capsys.readouterr().out)
    offerings = doc["offerings"]
    assert 1 <= len(offerings) <= 5
    assert set(offerings[0]) == {
        "instance_type",
        "zone",
        "capacity_type",
        "hourly_usd",
        "expected_cost_usd",
        "gpus",
        "gpu_model",
        "gpu_memory_gib",
    }
    assert {o["gpu_model"] for o in offerings} <= {"H100", "H200"}
    costs = [o["expected_cost_usd"] for o in offerings]
    assert costs == sorted(costs)


def test_spot_never_nodes_hours_region(capsys: pytest.CaptureFixture[str]) -> None:
    argv = ["--gpus", "1", "--nodes", "2", "--spot", "never", "--price-region", "us-west-2"]
    assert run([*argv, "--hours", "10", "--json"]) == 0
    offerings = json.loads(capsys.readouterr().out)["offerings"]
    assert {o["capacity_type"] for o in offerings} == {"on-demand"}
    best = offerings[0]
    assert best["expected_cost_usd"] == pytest.approx(2 * 10 * best["hourly_usd"], rel=1e-6)


def test_cpu_only(capsys: pytest.CaptureFixture[str]) -> None:
    assert run(["--gpus", "0", "--vcpus", "4", "--json"]) == 0
    offerings = json.loads(capsys.readouterr().out)["offerings"]
    assert all(o["gpus"] == 0 and o["gpu_model"] is None for o in offerings)


def test_spec_file(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    spec = tmp_path / "job.yaml"
    spec.write_text(SPEC)
    assert run([str(spec)]) == 0
    out = capsys.readouterr().out
    assert "x 2 nodes" in out
    assert "spot never" in out
    assert "4 h expected" in out
    assert "checkpoint every 1 h" in out
    assert "p5.48xlarge" in out
    assert "on-demand" in out
    assert run([str(spec), "--json", "--spot", "auto"]) == 0
    offerings = json.loads(capsys.readouterr().out)["offerings"]
    assert offerings[0]["capacity_type"] == "spot"


def test_bad_spec_file(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    spec = tmp_path / "job.yaml"
    spec.write_text(SPEC.replace("gpus: 8", "gpus: -1"))
    assert run([str(spec), "--json"]) == 2
    captured = capsys.readouterr()
    assert captured.out == ""
    error = json.loads(captured.err)
    assert error["error"] == "InvalidJobSpec"
    assert any(f["field"] == "resources.gpus" for f in error["details"]["fields"])
    assert run([str(spec)]) == 2
    assert "  resources.gpus: " in capsys.readouterr().err


def test_no_match_is_exit_2_with_reason(capsys: pytest.CaptureFixture[str]) -> None:
    assert run(["--gpus", "8", "--gpu-memory-gib", "500"]) == 2
    captured = capsys.readouterr()
    assert captured.out == ""
    assert "8 GPUs with >= 500 GiB" in captured.err
    assert "the largest is" in captured.err


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        ([], "give a spec FILE or at least --gpus"),
        (["job.yaml", "--gpus", "1"], "not both"),
        (["/nonexistent/job.yaml"], "cannot read"),
        (["--gpus", "99"], "--gpus"),
        (["--gpus", "1", "--price-region", "mars-north-1"], "mars-north-1"),
        (["--gpus", "1", "--limit", "0"], "--limit"),
    ],
)
def test_usage_errors(argv: list[str], message: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert run(argv) == 2
    assert message in capsys.readouterr().err


def test_bad_hours_is_a_usage_error(capsys: pytest.CaptureFixture[str]) -> None:
    assert run(["--gpus", "1", "--hours", "0"]) == 2
    assert "--hours" in capsys.readouterr().err


@pytest.mark.parametrize(
    ("extra", "spec_line", "seconds", "source"),
    [
        ([], "expected_duration: 90m\n", 5400, "spec"),
        ([], "", 3600, "default"),
        (["--hours", "2"], "expected_duration: 90m\n", 7200, "flag"),
    ],
)
def test_the_expected_duration_and_its_source_are_shown(
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    extra: list[str],
    spec_line: str,
    seconds: int,
    source: str,
) -> None:
    path = tmp_path / "job.yaml"
    path.write_text("name: a\nteam: t\nimage: i\ncommand: [x]\n" + spec_line)
    assert run([str(path), "--json", *extra]) == 0
    document = json.loads(capsys.readouterr().out)
    assert document["expected_duration"] == {"seconds": seconds, "source": source}
    assert run([str(path), *extra]) == 0
    assert "expected run time" in capsys.readouterr().out


def test_a_refreshed_catalog_file_can_be_planned_against(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from gpufleet.domain.catalog import bundled_document

    document = bundled_document()
    # Keep one type only: the plan must come from this file, not the bundled catalog.
    document["offerings"] = [o for o in document["offerings"] if o["instance_type"] == "g5.xlarge"]
    path = tmp_path / "catalog.json"
    path.write_text(json.dumps(document))
    assert run(["--gpus", "1", "--catalog", str(path), "--json"]) == 0
    types = {o["instance_type"] for o in json.loads(capsys.readouterr().out)["offerings"]}
    assert types == {"g5.xlarge"}
    assert run(["--gpus", "1", "--catalog", str(tmp_path / "missing.json")]) == 2


@pytest.mark.parametrize("interval", ["", "checkpoint_interval: 30m\n"])
def test_plan_ranks_as_a_launch_does_with_the_specs_checkpoint_interval(
    interval: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The checkpoint interval a ranking weighs is the spec's (none: a spot interruption costs
    the whole run), in `gpufleet plan` as in the plan a launch is made from."""
    text = SPEC.replace("checkpoint_interval: 1h\n", interval).replace("spot: never", "spot: auto")
    spec_file = tmp_path / "job.yaml"
    spec_file.write_text(text)
    assert run([str(spec_file), "--json", "--limit", "50"]) == 0
    shown = json.loads(capsys.readouterr().out)["offerings"]
    spec = parse_spec(text)
    launch_plan = plan_launch(
        spec,
        load_bundled(),
        "us-east-1",
        max_launch_attempts=3,
        retry_wait_seconds=60,
        boot_allowance_seconds=600,
        heartbeat_timeout_seconds=600,
        expected=estimate_duration(spec, []),
    )
    spot = launch_plan.steps[0]
    assert spot.capacity_type is CapacityType.SPOT
    best = spot.overrides[0]
    first_spot = next(o for o in shown if o["capacity_type"] == "spot")
    assert (first_spot["instance_type"], first_spot["zone"]) == (best.instance_type, best.zone)
    ranked = rank_offerings(
        spec.resources,
        SpotPolicy.REQUIRED,
        load_bundled(),
        "us-east-1",
        expected=estimate_duration(spec, []),
        checkpoint_interval_seconds=spec.checkpoint_interval_seconds,
    )
    assert first_spot["expected_cost_usd"] == round(ranked.best.expected_cost_usd, 4)


TEMPLATES = """\
templates:
  big-train: {gpus: 8, gpu_memory_gib: 80, gpu_models: [H100]}
"""


def plan_of_template(tmp_path: Path, template: str, *flags: str) -> int:
    """`gpufleet plan` of a spec naming `template`, with a config holding TEMPLATES."""
    config = tmp_path / "gpufleet.yaml"
    config.write_text(TEMPLATES)
    spec = tmp_path / "job.yaml"
    spec.write_text(f"name: j\nteam: t\nimage: img\ncommand: [x]\ntemplate: {template}\n")
    return run([str(spec), "--config", str(config), *flags])


def test_a_spec_naming_a_template_is_planned_as_intake_reads_it(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert plan_of_template(tmp_path, "big-train", "--json") == 0
    offerings = json.loads(capsys.readouterr().out)["offerings"]
    assert offerings and all(
        o["gpus"] == 8 and o["gpu_model"] == "H100" and o["gpu_memory_gib"] >= 80 for o in offerings
    )


def test_a_template_the_config_lacks_is_refused_with_the_known_ones(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert plan_of_template(tmp_path, "nope") == 2
    assert "known templates: big-train" in capsys.readouterr().err


@pytest.mark.parametrize("checkpoint", [[], ["--checkpoint-hours", "1"]])
def test_plan_ranks_capacity_types_as_the_launch_plan_orders_them(
    checkpoint: list[str], capsys: pytest.CaptureFixture[str]
) -> None:
    """16 one-GPU nodes for two weeks: without checkpoints the rework makes spot dearer, and
    both `gpufleet plan` and the launch plan put on-demand first; with hourly checkpoints, spot."""
    argv = ["--gpus", "1", "--nodes", "16", "--hours", "336", "--json", *checkpoint]
    assert run(argv) == 0
    ranked = json.loads(capsys.readouterr().out)["offerings"]
    spec = parse_spec(
        "name: a\nteam: t\nimage: i\ncommand: [x]\nresources: {gpus: 1, nodes: 16}\n"
        + ("checkpoint: s3://acme-ckpt/a/\ncheckpoint_interval: 1h\n" if checkpoint else "")
    )
    plan = plan_launch(
        spec,
        load_bundled(),
        "us-east-1",
        max_launch_attempts=1,
        retry_wait_seconds=1,
        boot_allowance_seconds=1,
        heartbeat_timeout_seconds=1,
        expected=estimate_duration(
            spec.model_copy(update={"expected_duration_seconds": 336 * 3600}), []
        ),
    )
    first = plan.steps[0]
    assert ranked[0]["capacity_type"] == first.capacity_type.value
    assert ranked[0]["instance_type"] == first.overrides[0].instance_type
    assert first.capacity_type is (CapacityType.SPOT if checkpoint else CapacityType.ON_DEMAND)


def test_a_spec_mounting_the_instance_store_is_planned_as_intake_plans_it(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # One V100: p3.2xlarge (EBS only) is the cheapest, p3dn.24xlarge has NVMe disks.
    body = (
        "name: t\nteam: a\nimage: img:1\ncommand: [python]\n"
        "resources: {gpus: 1, gpu_models: [V100]}\nspot: never\n"
    )
    spec = tmp_path / "job.yaml"
    spec.write_text(body)
    assert run([str(spec), "--json"]) == 0
    plain = {o["instance_type"] for o in json.loads(capsys.readouterr().out)["offerings"]}
    spec.write_text(body + "volumes: [{instance_store: scratch, mount: /scratch}]\n")
    assert run([str(spec), "--json"]) == 0
    scratch = {o["instance_type"] for o in json.loads(capsys.readouterr().out)["offerings"]}
    assert "p3.2xlarge" in plain
    assert scratch == {"p3dn.24xlarge"}
