"""The bundled catalog: shape, provenance, corrections, and the loader's validation."""

from __future__ import annotations

import copy
import json
import re
import subprocess
import sys
from importlib import resources
from pathlib import Path
from typing import Any

import pytest

from gpufleet.domain.catalog import (
    Catalog,
    CatalogError,
    InstanceType,
    Offering,
    load_bundled,
    normalize_model,
    offering_key,
)

REPO = Path(__file__).resolve().parents[2]
DATA = REPO.parent / "shared" / "data"
CATALOG_JSON = REPO / "functions" / "gpufleet" / "catalog" / "catalog.json"


@pytest.fixture(scope="module")
def catalog() -> Catalog:
    return load_bundled()


@pytest.fixture(scope="module")
def document() -> dict[str, Any]:
    text = resources.files("gpufleet").joinpath("catalog/catalog.json").read_text("utf-8")
    return dict(json.loads(text))


def small_document() -> dict[str, Any]:
    return {
        "generated": "2025-01-01",
        "sources": [{"file": "x.csv", "origin": "test", "date": "2025-01-01"}],
        "instance_types": [
            {
                "name": "g9.xlarge",
                "accelerator": "nvidia",
                "gpu_model": "L4",
                "gpus": 1,
                "gpu_memory_gib": 24,
                "vcpus": 4,
                "memory_gib": 16,
                "arch": "x86_64",
                "efa": False,
            },
            {
                "name": "c9.large",
                "accelerator": "none",
                "gpu_model": None,
                "gpus": 0,
                "gpu_memory_gib": 0,
                "vcpus": 2,
                "memory_gib": 4,
                "arch": "arm64",
                "efa": False,
            },
        ],
        "offerings": [
            {
                "instance_type": "g9.xlarge",
                "region": "r-1",
                "zone": "r1-az1",
                "on_demand_usd_per_hour": 1.0,
                "spot_usd_per_hour": 0.4,
                "interruption_bucket": 2,
            },
            {
                "instance_type": "g9.xlarge",
                "region": "r-2",
                "zone": None,
                "on_demand_usd_per_hour": 1.1,
                "spot_usd_per_hour": None,
                "interruption_bucket": None,
            },
            {
                "instance_type": "c9.large",
                "region": "r-1",
                "zone": None,
                "on_demand_usd_per_hour": 0.1,
                "spot_usd_per_hour": 0.03,
                "interruption_bucket": None,
            },
        ],
    }


# --- the bundled snapshot ---------------------------------------------------------------------


def test_bundled_is_cached_and_small(catalog: Catalog) -> None:
    assert load_bundled() is catalog
    assert CATALOG_JSON.stat().st_size < 3 * 1024 * 1024
    assert "us-east-1" in catalog.regions()
    assert "us-west-2" in catalog.regions()
    assert catalog.regions() == sorted(catalog.regions())


def test_document_has_provenance_and_corrections(document: dict[str, Any]) -> None:
    assert document["generated"] == "2025-11-30"
    files = {s["file"] for s in document["sources"]}
    assert any("vantage" in f for f in files)
    assert any("spot-advisor" in f for f in files)
    assert any("cpu-instances" in f for f in files)
    for source in document["sources"]:
        assert source["origin"]
        assert "date" in source
    corrected = {c["instance_type"] for c in document["corrections"]}
    assert {"trn1.32xlarge", "trn1n.32xlarge", "p2.16xlarge", "g6f.large"} <= corrected
    assert all(c["reason"] for c in document["corrections"])


def test_known_specs(catalog: Catalog) -> None:
    p5 = catalog.instance_type("p5.48xlarge")
    assert (p5.accelerator, p5.gpu_model, p5.gpus, p5.gpu_memory_gib) == ("nvidia", "H100", 8, 80)
    assert (p5.vcpus, p5.memory_gib, p5.arch, p5.efa) == (192, 2048, "x86_64", True)
    g5 = catalog.instance_type("g5.xlarge")
    assert (g5.gpu_model, g5.gpus, g5.gpu_memory_gib, g5.efa) == ("A10G", 1, 24, False)
    assert catalog.instance_type("g5g.xlarge").arch == "arm64"
    assert catalog.instance_type("c7g.large").arch == "arm64"


@pytest.mark.parametrize(
    ("name", "disks", "gb", "nvme"),
    [
        ("p4d.24xlarge", 8, 8000, True),  # DescribeInstanceTypes, as moto 5.2.5 bundles it
        ("p5.48xlarge", 8, 30400, True),
        ("g5.xlarge", 1, 250, True),
        ("trn2.48xlarge", 4, 7600, True),  # vantage has no storage record; the API has
        ("g4ad.16xlarge", 2, 2400, True),  # not in moto's snapshot: vantage's storage record
        ("p3.2xlarge", 0, 0, False),  # EBS only
        ("c5.xlarge", 0, 0, False),
    ],
)
def test_instance_store_disks(catalog: Catalog, name: str, disks: int, gb: int, nvme: bool) -> None:
    it = catalog.instance_type(name)
    assert (it.instance_store_disks, it.instance_store_gb, it.instance_store_nvme) == (
        disks,
        gb,
        nvme,
    )
    assert it.has_nvme_instance_store is nvme


def test_source_errors_are_corrected(catalog: Catalog) -> None:
    for name in ("trn1.2xlarge", "trn1.32xlarge", "trn1n.32xlarge", "trn2.48xlarge"):
        assert catalog.instance_type(name).accelerator == "trainium"
    assert catalog.instance_type("trn2.48xlarge").gpu_memory_gib == 96
    for name in ("inf1.xlarge", "inf2.48xlarge"):
        assert catalog.instance_type(name).accelerator == "inferentia"
    assert catalog.instance_type("g4ad.xlarge").accelerator == "amd"
    assert catalog.instance_type("dl2q.24xlarge").accelerator == "qualcomm"
    p2 = catalog.instance_type("p2.16xlarge")
    assert (p2.gpus, p2.gpu_memory_gib) == (16, 12)
    g6f = catalog.instance_type("g6f.large")
    assert (g6f.gpus, g6f.gpu_fraction, g6f.gpu_memory_gib) == (0, 0.125, 3)
    gb200 = catalog.instance_type("p6e-gb200.36xlarge")
    assert (gb200.gpus, gb200.arch) == (4, "arm64")


def test_cpu_types_are_included(catalog: Catalog) -> None:
    cpu = [t for t in catalog.instance_types() if t.is_cpu_only]
    assert len(cpu) == 105
    assert all(t.gpus == 0 and t.gpu_model is None for t in cpu)
    assert any(o.instance_type.is_cpu_only for o in catalog.offerings("us-east-1"))


def test_offerings_are_sane(catalog: Catalog) -> None:
    total = 0
    for region in catalog.regions():
        offerings = catalog.offerings(region)
        assert offerings
        keys = [o.key for o in offerings]
        assert len(keys) == len(set(keys))
        for o in offerings:
            total += 1
            assert o.region == region
            assert o.hourly_usd > 0
            assert o.capacity_type in ("spot", "on-demand")
            if o.capacity_type == "on-demand":
                assert o.interruption_bucket is None
            elif o.interruption_bucket is not None:
                assert 0 <= o.interruption_bucket <= 4
            # standard regions and AZ IDs only: no local or Wavelength zones
            assert re.fullmatch(r"[a-z]{2}(-gov)?-[a-z]+-\d", o.region)
            assert o.zone is None or re.fullmatch(r"[a-z]+\d-az\d+", o.zone)
    assert total == len(catalog)
    spot = [o for r in catalog.regions() for o in catalog.offerings(r) if o.capacity_type == "spot"]
    assert sum(o.interruption_bucket is not None for o in spot) / len(spot) > 0.9


def test_spot_never_above_on_demand(catalog: Catalog) -> None:
    for region in catalog.regions():
        od: dict[tuple[str, str], float] = {}
        for o in catalog.offerings(region):
            if o.capacity_type == "on-demand":
                od[(o.instance_type.name, o.location)] = o.hourly_usd
        for o in catalog.offerings(region):
            if o.capacity_type == "spot" and (o.instance_type.name, o.location) in od:
                assert o.hourly_usd <= od[(o.instance_type.name, o.location)]


def test_lookups(catalog: Catalog) -> None:
    assert catalog.offerings("mars-north-1") == []
    with pytest.raises(KeyError, match="unknown instance type"):
        catalog.instance_type("x99.huge")
    east = catalog.offerings("us-east-1")
    east.clear()  # callers get a copy
    assert catalog.offerings("us-east-1")


def test_p_family_prices_are_per_zone(catalog: Catalog) -> None:
    p5 = [o for o in catalog.offerings("us-east-1") if o.instance_type.name == "p5.48xlarge"]
    assert p5
    assert all(o.zone and o.zone.startswith("use1-az") for o in p5)


# --- the loader -------------------------------------------------------------------------------


def test_from_document_builds_offerings() -> None:
    cat = Catalog.from_document(small_document())
    assert cat.regions() == ["r-1", "r-2"]
    r1 = cat.offerings("r-1")
    assert {o.key for o in r1} == {
        "on-demand:g9.xlarge:r1-az1",
        "spot:g9.xlarge:r1-az1",
        "on-demand:c9.large:r-1",
        "spot:c9.large:r-1",
    }
    spot = next(o for o in r1 if o.key == "spot:g9.xlarge:r1-az1")
    assert spot.interruption_bucket == 2
    assert spot.hourly_usd == 0.4
    assert [o.capacity_type for o in cat.offerings("r-2")] == ["on-demand"]
    assert cat.generated == "2025-01-01"
    assert offering_key("spot", "g9.xlarge", "r1-az1") == spot.key
    index = cat.region_index("r-1")
    assert index is not None
    assert [t.name for t, _ in index.accelerated] == ["g9.xlarge"]
    assert [t.name for t, _ in index.cpu_only] == ["c9.large"]


@pytest.mark.parametrize(
    ("mutate", "message"),
    [
        (lambda d: d["offerings"][0].update(instance_type="nope.large"), "unknown instance type"),
        (lambda d: d["offerings"][0].update(interruption_bucket=7), "interruption_bucket"),
        (lambda d: d["offerings"][0].update(spot_usd_per_hour=-1), "positive"),
        (lambda d: d["instance_types"][0].update(accelerator="quantum"), "accelerator"),
        (lambda d: d["instance_types"][0].update(arch="sparc"), "arch"),
        (lambda d: d["instance_types"][0].pop("vcpus"), "missing 'vcpus'"),
        (lambda d: d["instance_types"].append(dict(d["instance_types"][0])), "twice"),
        (lambda d: d["offerings"].append(dict(d["offerings"][0])), "twice"),
        (lambda d: d.pop("offerings"), "missing 'offerings'"),
        (lambda d: d["instance_types"][0].update(instance_store_disks=2), "disagree"),
        (
            lambda d: d["instance_types"][0].update(instance_store_nvme=True),
            "NVMe instance store without disks",
        ),
    ],
)
def test_from_document_rejects_malformed(mutate: Any, message: str) -> None:
    doc = copy.deepcopy(small_document())
    mutate(doc)
    with pytest.raises(CatalogError, match=message):
        Catalog.from_document(doc)


def test_dataclasses_are_frozen() -> None:
    it = InstanceType("g9.xlarge", "nvidia", "NVIDIA L4", 1, 24, 4, 16, "x86_64", False)
    assert it.model_key == "l4"
    assert it.family == "g9"
    o = Offering(it, "r-1", None, "spot", 0.5, 1)
    with pytest.raises(AttributeError):
        o.hourly_usd = 1.0  # type: ignore[misc]
    assert o.key == "spot:g9.xlarge:r-1"


@pytest.mark.parametrize(
    ("a", "b", "equal"),
    [
        ("A100", "a100", True),
        ("NVIDIA A100", "a100", True),
        ("nvidia-h100", "H100", True),
        ("Tesla V100", "V100", True),
        ("A10", "A10G", False),
        ("L4", "L40S", False),
    ],
)
def test_normalize_model(a: str, b: str, equal: bool) -> None:
    assert (normalize_model(a) == normalize_model(b)) is equal


# --- the build script -------------------------------------------------------------------------


@pytest.mark.skipif(not DATA.is_dir(), reason="shared data not present")
def test_bundled_catalog_is_up_to_date_and_deterministic(tmp_path: Path) -> None:
    script = REPO / "scripts" / "build_catalog.py"
    out = tmp_path / "catalog.json"
    for _ in range(2):
        subprocess.run(
            [sys.executable, str(script), "--data", str(DATA), "--out", str(out)],
            check=True,
            capture_output=True,
        )
        assert out.read_bytes() == CATALOG_JSON.read_bytes()
