"""`gpufleet templates`: each template of a config file with the instance it would get now."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from gpufleet.cli import main
from gpufleet.domain.catalog import load_bundled
from gpufleet.domain.selection import select
from gpufleet.domain.spec import Resources

REPO_CONFIG = Path(__file__).resolve().parents[2] / "gpufleet.yaml"


def test_json_lists_every_template_with_the_plans_first_choice(
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert main(["templates", "--config", str(REPO_CONFIG), "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["price_region"] == "us-east-1"
    assert doc["prices_as_of"]["date"] == load_bundled().generated
    by_name = {t["name"]: t for t in doc["templates"]}
    assert list(by_name) == ["cpu-preprocess", "gpu-train", "gpu-train-large", "tune-small"]
    for entry in doc["templates"]:
        resources = Resources.model_validate(entry["resources"])
        best = select(resources, "auto", load_bundled(), "us-east-1").best.offering
        instance = entry["instance"]
        assert (instance["instance_type"], instance["capacity_type"], instance["zone"]) == (
            best.instance_type.name,
            best.capacity_type,
            best.zone,
        )
        assert instance["hourly_usd"] == best.hourly_usd
    cpu = by_name["cpu-preprocess"]
    assert cpu["resources"]["gpus"] == 0
    assert cpu["instance"]["gpus"] == 0 and cpu["instance"]["gpu_model"] is None
    assert by_name["gpu-train-large"]["resources"]["nodes"] == 2
    assert by_name["gpu-train"]["instance"]["gpus"] == 8


def test_a_template_nothing_fits_is_listed_with_the_reason(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    config = tmp_path / "fleet.yaml"
    config.write_text("templates:\n  cpu: {gpus: 0}\n  huge: {gpus: 1, gpu_memory_gib: 1000}\n")
    # CPU-only types are priced in us-east-1 and us-west-2 only.
    assert (
        main(["templates", "--config", str(config), "--price-region", "eu-west-1", "--json"]) == 0
    )
    doc = json.loads(capsys.readouterr().out)
    assert [t["instance"] for t in doc["templates"]] == [None, None]
    cpu, huge = doc["templates"]
    assert "no CPU-only instance type is priced in eu-west-1" in cpu["no_instance"]
    assert ">= 1000 GiB" in huge["no_instance"]

    assert main(["templates", "--config", str(config), "--price-region", "eu-west-1"]) == 0
    out = capsys.readouterr().out
    assert "no instance for huge:" in out


def test_table_output(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["templates", "--config", str(REPO_CONFIG)]) == 0
    lines = capsys.readouterr().out.splitlines()
    # "INSTANCE NOW" is at the catalog's prices, and the first line says of which day.
    assert f"prices: catalog of {load_bundled().generated} (" in lines[0]
    header = next(line for line in lines if line.startswith("TEMPLATE"))
    start = header.index("INSTANCE NOW")
    rows = {line.split()[0]: line for line in lines[lines.index(header) + 1 :]}
    assert set(rows) == {"cpu-preprocess", "gpu-train", "gpu-train-large", "tune-small"}
    assert "2 nodes" in rows["gpu-train-large"]
    assert "CPU, >=32 vCPU, >=64 GiB" in rows["cpu-preprocess"]
    assert all(row[start] != " " and row[start - 1] == " " for row in rows.values())


@pytest.mark.parametrize(
    ("content", "message"),
    [(None, "cannot read"), ("templates:\n  t: {gpus: -1}\n", "invalid gpufleet config")],
)
def test_an_unreadable_or_invalid_config_exits_2(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], content: str | None, message: str
) -> None:
    config = tmp_path / "fleet.yaml"
    if content is not None:
        config.write_text(content)
    assert main(["templates", "--config", str(config)]) == 2
    assert message in capsys.readouterr().err


def test_a_config_without_templates_says_so(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    config = tmp_path / "fleet.yaml"
    config.write_text("reservations: []\n")
    assert main(["templates", "--config", str(config)]) == 0
    assert "defines no templates" in capsys.readouterr().out
