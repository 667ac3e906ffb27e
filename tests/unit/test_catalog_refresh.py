"""Refreshing the catalog from AWS API responses: the pure parsing (no network, no moto)."""

from __future__ import annotations

import copy
import json
import random
from datetime import UTC, date, datetime
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from gpufleet.cli.catalog import bundled_document, region_detail, render, summarize
from gpufleet.domain.catalog import Catalog
from gpufleet.domain.catalog_refresh import (
    RefreshError,
    RegionPages,
    build_document,
    clean_spot,
    dumps,
    is_catalog_type,
    latest_spot_prices,
    on_demand_prices,
    parse_instance_type,
    pricing_filters,
    zone_ids,
)
from gpufleet.domain.selection import select
from gpufleet.domain.spec import Resources, SpotPolicy

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "pricing"
FETCHED = date(2025, 12, 1)


def itype(
    name: str,
    *,
    vcpus: int = 4,
    mib: int = 16384,
    arch: str = "x86_64",
    efa: bool = False,
    **sections: Any,
) -> dict[str, Any]:
    """A DescribeInstanceTypes entry in the real shape (only the fields the refresh reads)."""
    return {
        "InstanceType": name,
        "VCpuInfo": {"DefaultVCpus": vcpus, "DefaultCores": vcpus // 2},
        "MemoryInfo": {"SizeInMiB": mib},
        "ProcessorInfo": {"SupportedArchitectures": [arch], "Manufacturer": "AMD"},
        "NetworkInfo": {"EfaSupported": efa, "MaximumNetworkInterfaces": 4},
        **sections,
    }


def gpu(name: str, count: int, mib: int, maker: str = "NVIDIA", **extra: Any) -> dict[str, Any]:
    device = {"Name": name, "Manufacturer": maker, "Count": count, "MemoryInfo": {"SizeInMiB": mib}}
    return {"GpuInfo": {"Gpus": [{**device, **extra}], "TotalGpuMemoryInMiB": count * mib}}


def neuron(name: str, count: int, mib: int) -> dict[str, Any]:
    device = {"Name": name, "Count": count, "MemoryInfo": {"SizeInMiB": mib}}
    return {
        "NeuronInfo": {
            "NeuronDevices": [{**device, "CoreInfo": {"Count": 2, "Version": 2}}],
            "TotalNeuronDeviceMemoryInMiB": count * mib,
        }
    }


def inference(name: str, maker: str, count: int, mib: int) -> dict[str, Any]:
    device = {"Name": name, "Manufacturer": maker, "Count": count, "MemoryInfo": {"SizeInMiB": mib}}
    return {
        "InferenceAcceleratorInfo": {
            "Accelerators": [device],
            "TotalInferenceMemoryInMiB": count * mib,
        }
    }


G5 = itype("g5.xlarge", **gpu("A10G", 1, 22888, GpuPartitionSize=1.0, LogicalGpuCount=1))
TRN1 = itype("trn1.32xlarge", vcpus=128, mib=524288, efa=True, **neuron("Trainium", 16, 32768))
TRN2 = itype("trn2.48xlarge", vcpus=192, mib=2097152, efa=True, **neuron("Trainium2", 16, 524288))
INF1 = itype(
    "inf1.xlarge", **neuron("Inferentia", 1, 8192), **inference("Inferentia", "AWS", 1, 8192)
)
DL2Q = itype("dl2q.24xlarge", vcpus=96, **inference("Qualcomm AI100", "Qualcomm", 8, 16000))
G6F = itype("g6f.large", vcpus=2, **gpu("L4", 0, 2861, GpuPartitionSize=0.125))
G5G = itype("g5g.xlarge", arch="arm64", mib=8192, **gpu("T4g", 1, 16384))
M7I = itype("m7i.48xlarge", vcpus=192, mib=786432, efa=True)
NEW = itype("g7.xlarge", **gpu("RTX PRO 4500", 1, 32768))


def spot(name: str, zone: str, usd: str, at: str, desc: str = "Linux/UNIX") -> dict[str, Any]:
    return {
        "AvailabilityZone": zone,
        "InstanceType": name,
        "ProductDescription": desc,
        "SpotPrice": usd,
        "Timestamp": at,
    }


ZONES = {
    "AvailabilityZones": [
        {"ZoneName": "us-east-1a", "ZoneId": "use1-az4", "ZoneType": "availability-zone"},
        {"ZoneName": "us-east-1b", "ZoneId": "use1-az6", "ZoneType": "availability-zone"},
        {"ZoneName": "us-east-1-atl-2a", "ZoneId": "use1-atl2-az1", "ZoneType": "local-zone"},
    ]
}


def product(name: str, usd: str, region: str = "us-east-1", **attrs: str) -> str:
    """One GetProducts PriceList item: a JSON string, as the API returns it."""
    base = {
        "instanceType": name,
        "regionCode": region,
        "operatingSystem": "Linux",
        "tenancy": "Shared",
        "preInstalledSw": "NA",
        "capacitystatus": "Used",
        "marketoption": "OnDemand",
        "operation": "RunInstances",
        "location": "US East (N. Virginia)",
    }
    sku = "SKU" + name.upper().replace(".", "")
    dims = {
        f"{sku}.JRTCKXETXF.6YS6EN2CT7": {"unit": "Hrs", "pricePerUnit": {"USD": usd}},
    }
    terms = {"OnDemand": {f"{sku}.JRTCKXETXF": {"priceDimensions": dims, "sku": sku}}}
    return json.dumps(
        {"product": {"attributes": {**base, **attrs}, "sku": sku}, "terms": terms},
    )


@pytest.fixture(scope="module")
def bundled() -> dict[str, Any]:
    return bundled_document()


def test_instance_types_come_from_the_api_sections() -> None:
    row, why = parse_instance_type(G5)
    assert why == "" and row is not None
    assert row == {
        "name": "g5.xlarge",
        "accelerator": "nvidia",
        "gpu_model": "A10G",
        "gpus": 1,
        "gpu_memory_gib": 22.352,
        "vcpus": 4,
        "memory_gib": 16.0,
        "arch": "x86_64",
        "efa": False,
        "network_cards": 1,
        "efa_interfaces": 0,
        "instance_store_disks": 0,
        "instance_store_gb": 0,
        "instance_store_nvme": False,
    }


@pytest.mark.parametrize(
    ("storage", "disks", "gb", "nvme"),
    [
        # p4d.24xlarge as DescribeInstanceTypes states it: 8 NVMe SSDs of 1000 GB.
        (
            {
                "Disks": [{"Count": 8, "SizeInGB": 1000, "Type": "ssd"}],
                "EncryptionSupport": "required",
                "NvmeSupport": "required",
                "TotalSizeInGB": 8000,
            },
            8,
            8000,
            True,
        ),
        # An older SSD instance store that is not NVMe (the agent cannot find it as scratch).
        (
            {
                "Disks": [{"Count": 2, "SizeInGB": 120, "Type": "ssd"}],
                "NvmeSupport": "unsupported",
                "TotalSizeInGB": 240,
            },
            2,
            240,
            False,
        ),
        (None, 0, 0, False),  # EBS only: no InstanceStorageInfo
    ],
)
def test_instance_store_comes_from_instance_storage_info(
    storage: dict[str, Any] | None, disks: int, gb: int, nvme: bool
) -> None:
    info = (
        itype("p4d.24xlarge")
        if storage is None
        else {
            **itype("p4d.24xlarge"),
            "InstanceStorageSupported": True,
            "InstanceStorageInfo": storage,
        }
    )
    row, _ = parse_instance_type(info)
    assert row is not None
    assert (row["instance_store_disks"], row["instance_store_gb"]) == (disks, gb)
    assert row["instance_store_nvme"] is nvme
    assert (
        Catalog.from_document({"instance_types": [row], "offerings": []})
        .instance_type("p4d.24xlarge")
        .has_nvme_instance_store
        is nvme
    )


def test_network_cards_and_efa_interfaces_come_from_network_info() -> None:
    network = {
        "EfaSupported": True,
        "MaximumNetworkCards": 17,
        "EfaInfo": {"MaximumEfaInterfaces": 16},
    }
    row, _ = parse_instance_type({**itype("p6-b300.48xlarge"), "NetworkInfo": network})
    assert row is not None
    assert (row["efa"], row["network_cards"], row["efa_interfaces"]) == (True, 17, 16)


@pytest.mark.parametrize(
    ("info", "kind", "model", "gpus"),
    [
        (TRN1, "trainium", "Trainium", 16),
        (TRN2, "trainium", "Trainium2", 16),
        (INF1, "inferentia", "Inferentia", 1),
        (DL2Q, "qualcomm", "Qualcomm AI100", 8),
        (G5G, "nvidia", "T4g", 1),
        (
            itype("g4ad.xlarge", **gpu("Radeon Pro V520", 1, 8192, "AMD")),
            "amd",
            "Radeon Pro V520",
            1,
        ),
        (
            itype("dl1.24xlarge", **gpu("Gaudi HL-205", 8, 32768, "Habana")),
            "gaudi",
            "Gaudi HL-205",
            8,
        ),
        # Even listed under GpuInfo by some API version, Trainium is never NVIDIA.
        (itype("trn1.2xlarge", **gpu("Trainium", 1, 32768, "AWS")), "trainium", "Trainium", 1),
    ],
)
def test_accelerator_kind(info: dict[str, Any], kind: str, model: str, gpus: int) -> None:
    row, _ = parse_instance_type(info)
    assert row is not None
    assert (row["accelerator"], row["gpu_model"], row["gpus"]) == (kind, model, gpus)


def test_fractional_gpu_is_zero_whole_gpus() -> None:
    row, _ = parse_instance_type(G6F)
    assert row is not None
    assert row["gpus"] == 0 and row["gpu_fraction"] == 0.125 and row["gpu_memory_gib"] == 2.794


@pytest.mark.parametrize(
    ("info", "why"),
    [
        (itype("mac2.metal", arch="arm64_mac", **gpu("M1", 1, 8192, "Apple")), "architecture"),
        (itype("x9.xlarge", **gpu("Mystery", 1, 8192, "Acme")), "unknown accelerator"),
        (
            {"InstanceType": "z.large", "ProcessorInfo": {"SupportedArchitectures": ["x86_64"]}},
            "VCpu",
        ),
    ],
)
def test_unusable_entries_are_skipped_with_a_reason(info: dict[str, Any], why: str) -> None:
    row, reason = parse_instance_type(info)
    assert row is None and why in reason


def test_only_accelerated_types_and_the_cpu_families_are_kept() -> None:
    assert is_catalog_type(G5) and is_catalog_type(TRN1) and is_catalog_type(DL2Q)
    assert is_catalog_type(itype("c7g.medium", arch="arm64"))
    assert not is_catalog_type(itype("t3.micro"))
    media = {"MediaAcceleratorInfo": {"Accelerators": [{"Name": "U30", "Count": 1}]}}
    assert not is_catalog_type(itype("vt1.3xlarge", **media))


def test_latest_linux_spot_price_per_type_and_zone() -> None:
    page1 = {
        "SpotPriceHistory": [
            spot("g5.xlarge", "us-east-1a", "0.4100", "2025-12-01T09:00:00.000Z"),
            spot("g5.xlarge", "us-east-1a", "0.3900", "2025-11-30T21:13:07.000Z"),
            spot("g5.xlarge", "us-east-1a", "2.1000", "2025-12-01T10:00:00.000Z", "Windows"),
            spot("g5.xlarge", "us-east-1b", "0.3700", "2025-12-01T01:00:00.000Z", "Linux/UNIX"),
        ],
        "NextToken": "abc",
    }
    page2 = {
        "SpotPriceHistory": [
            spot("g5.xlarge", "us-east-1b", "0.3600", "2025-11-29T01:00:00Z"),
            # moto's shape: the EC2-Classic era name and nine fractional digits.
            spot(
                "m7i.2xlarge",
                "us-east-1a",
                "0.1900",
                "2006-01-02T15:04:05.999999999Z",
                "Linux/UNIX (Amazon VPC)",
            ),
        ]
    }
    got = latest_spot_prices([page1, page2])
    assert got == {
        ("g5.xlarge", "us-east-1a"): 0.41,
        ("g5.xlarge", "us-east-1b"): 0.37,
        ("m7i.2xlarge", "us-east-1a"): 0.19,
    }
    # boto3 hands back datetimes; those work the same.
    as_datetimes = {
        "SpotPriceHistory": [
            {**r, "Timestamp": datetime.fromisoformat(r["Timestamp"].replace("Z", "+00:00"))}
            for r in page1["SpotPriceHistory"]
        ]
    }
    assert latest_spot_prices([as_datetimes])[("g5.xlarge", "us-east-1a")] == 0.41


@given(st.randoms(use_true_random=False))
def test_spot_order_does_not_matter(rnd: random.Random) -> None:
    records = [
        spot("g5.xlarge", z, f"0.{i:04d}", f"2025-12-01T{h:02d}:00:00Z")
        for i, (z, h) in enumerate(
            [("us-east-1a", 1), ("us-east-1a", 5), ("us-east-1b", 3), ("us-east-1b", 2)]
        )
    ]
    shuffled = records[:]
    rnd.shuffle(shuffled)
    assert latest_spot_prices([{"SpotPriceHistory": shuffled}]) == latest_spot_prices(
        [{"SpotPriceHistory": records}]
    )


def test_on_demand_prices_from_recorded_get_products_pages() -> None:
    pages = [json.loads(p.read_text()) for p in sorted(FIXTURES.glob("*.json"))]
    assert all(isinstance(item, str) for p in pages for item in p["PriceList"])
    notes: list[str] = []
    prices = on_demand_prices(pages, "us-east-1", notes)
    assert prices == {
        "g5.xlarge": 1.006,  # its Reserved term (0.634) is not an on-demand price
        "m7i.2xlarge": 0.4032,
        "p4d.24xlarge": 21.957642,
        "p5.48xlarge": 55.04,
        "trn1.32xlarge": 21.5,
    }
    assert notes == []


def test_on_demand_ignores_what_the_filters_should_have_kept_out() -> None:
    page = {
        "PriceList": [
            product("g5.xlarge", "1.0060000000"),
            product("g5.xlarge", "1.4080000000", operatingSystem="Windows"),
            product("g5.xlarge", "1.2000000000", tenancy="Dedicated"),
            product("g5.xlarge", "0.9000000000", region="us-west-2"),
            product("p5.48xlarge", "31.4640000000", marketoption="CapacityBlock"),
            product("p5.48xlarge", "0.0000000000"),
            product("m7i.2xlarge", "0.4032000000"),
            product("m7i.2xlarge", "0.4100000000"),
        ]
    }
    notes: list[str] = []
    assert on_demand_prices([page], "us-east-1", notes) == {
        "g5.xlarge": 1.006,
        "m7i.2xlarge": 0.4032,
    }
    assert notes and "m7i.2xlarge" in notes[0]


def test_pricing_filters() -> None:
    filters = {f["Field"]: f["Value"] for f in pricing_filters("eu-west-1")}
    assert filters == {
        "operatingSystem": "Linux",
        "tenancy": "Shared",
        "preInstalledSw": "NA",
        "capacitystatus": "Used",
        "regionCode": "eu-west-1",
    }
    assert all(f["Type"] == "TERM_MATCH" for f in pricing_filters("eu-west-1"))


def test_spot_clamp_is_shared_with_build_catalog() -> None:
    notes: list[str] = []
    assert clean_spot(1.0004, 1.0, "x", notes) == 1.0
    assert clean_spot(2.0, 1.0, "y", notes) is None
    assert clean_spot(0.5, None, "z", notes) == 0.5
    assert len(notes) == 2


def _pages(region: str = "us-east-1") -> RegionPages:
    types = {"InstanceTypes": [G5, TRN1, TRN2, INF1, DL2Q, G6F, G5G, M7I, NEW]}
    spots = {
        "SpotPriceHistory": [
            spot("g5.xlarge", "us-east-1a", "0.4100", "2025-12-01T09:00:00Z"),
            spot("g5.xlarge", "us-east-1b", "0.3700", "2025-12-01T09:00:00Z"),
            spot("g5.xlarge", "us-east-1-atl-2a", "0.5000", "2025-12-01T09:00:00Z"),
            spot("trn1.32xlarge", "us-east-1a", "21.5004", "2025-12-01T09:00:00Z"),
            spot("trn2.48xlarge", "us-east-1b", "9.1000", "2025-12-01T09:00:00Z"),
            spot("t3.micro", "us-east-1a", "0.0031", "2025-12-01T09:00:00Z"),
        ]
    }
    products = {
        "PriceList": [
            product("g5.xlarge", "1.0060000000"),
            product("trn1.32xlarge", "21.5000000000"),
            product("m7i.48xlarge", "9.6768000000"),
        ]
    }
    return RegionPages(
        region=region,
        instance_types=[types],
        availability_zones=[ZONES],
        spot_price_history=[spots],
        products=[products],
    )


def test_document_has_the_bundled_format_and_loads(bundled: dict[str, Any]) -> None:
    doc = build_document([_pages()], fetched=FETCHED, previous=bundled)
    assert list(doc) == list(bundled)
    assert doc["generated"] == "2025-12-01"
    assert doc["interruption_buckets"] == bundled["interruption_buckets"]
    catalog = Catalog.from_document(doc)
    assert catalog.regions() == ["us-east-1"]
    assert json.loads(dumps(doc)) == doc
    keys = set(bundled["instance_types"][0]) | {"gpu_fraction"}
    assert all(set(t) <= keys for t in doc["instance_types"])
    assert {tuple(o) for o in doc["offerings"]} == {tuple(bundled["offerings"][0])}


def test_offerings_prices_zones_and_buckets(bundled: dict[str, Any]) -> None:
    doc = build_document([_pages()], fetched=FETCHED, previous=bundled)
    rows = {(o["instance_type"], o["zone"]): o for o in doc["offerings"]}
    # Per-AZ spot rows, the zone as its ID; the regional on-demand price on each.
    assert rows[("g5.xlarge", "use1-az4")]["spot_usd_per_hour"] == 0.41
    assert rows[("g5.xlarge", "use1-az6")]["spot_usd_per_hour"] == 0.37
    assert rows[("g5.xlarge", "use1-az4")]["on_demand_usd_per_hour"] == 1.006
    # Interruption buckets are carried from the previous catalog for the same type and region.
    assert rows[("g5.xlarge", "use1-az4")]["interruption_bucket"] == 4
    assert rows[("trn1.32xlarge", "use1-az4")]["interruption_bucket"] == 0
    # The local zone is excluded, and said so.
    assert not any(o["zone"] == "use1-atl2-az1" for o in doc["offerings"])
    assert any("use1-atl2-az1" in c["reason"] for c in doc["corrections"])
    # Spot a hair above on-demand is clamped (the build's rule), with a note.
    assert rows[("trn1.32xlarge", "use1-az4")]["spot_usd_per_hour"] == 21.5
    assert any("trn1.32xlarge use1-az4" in c["reason"] for c in doc["corrections"])
    # Spot without an on-demand price (none in the price list) still makes an offering.
    assert rows[("trn2.48xlarge", "use1-az6")]["on_demand_usd_per_hour"] is None
    # On-demand without spot: one regional row, no bucket.
    assert rows[("m7i.48xlarge", None)] == {
        "instance_type": "m7i.48xlarge",
        "region": "us-east-1",
        "zone": None,
        "on_demand_usd_per_hour": 9.6768,
        "spot_usd_per_hour": None,
        "interruption_bucket": None,
    }
    # Types outside the catalog (t3) never appear.
    assert "t3.micro" not in {o["instance_type"] for o in doc["offerings"]}


def test_corrections_that_still_apply(bundled: dict[str, Any]) -> None:
    doc = build_document([_pages()], fetched=FETCHED, previous=bundled)
    types = {t["name"]: t for t in doc["instance_types"]}
    # Usable memory (22888 MiB) -> the nominal 24 GiB the previous catalog and job specs use.
    assert types["g5.xlarge"]["gpu_memory_gib"] == 24.0
    assert types["g6f.large"]["gpu_memory_gib"] == 3.0
    assert types["dl2q.24xlarge"]["gpu_memory_gib"] == 16.0
    # The build's trn2 correction still applies: the API's 512 GiB per chip is not right.
    assert types["trn2.48xlarge"]["gpu_memory_gib"] == 96.0
    # Model spellings follow the previous catalog (allow-lists match either way).
    assert types["g5g.xlarge"]["gpu_model"] == "T4G"
    assert types["dl2q.24xlarge"]["gpu_model"] == "Qualcomm AI 100"
    # CPU-only types stay efa=false; accelerated types take the API's EFA flag.
    assert types["m7i.48xlarge"]["efa"] is False
    assert types["trn1.32xlarge"]["efa"] is True
    # A type the previous catalog lacks keeps what the API says.
    assert types["g7.xlarge"]["gpu_model"] == "RTX PRO 4500"
    assert types["g7.xlarge"]["gpu_memory_gib"] == 32.0
    reasons = " | ".join(c["reason"] for c in doc["corrections"])
    assert "usable A10G memory" in reasons and "scripts/build_catalog.py" in reasons
    for c in doc["corrections"]:
        assert set(c) == {"instance_type", "fields", "reason"}


def test_sources_say_where_everything_came_from(bundled: dict[str, Any]) -> None:
    doc = build_document([_pages()], fetched=FETCHED, previous=bundled)
    by_name = {s.get("api") or s.get("file"): s for s in doc["sources"]}
    assert {
        "ec2:DescribeInstanceTypes",
        "ec2:DescribeAvailabilityZones",
        "ec2:DescribeSpotPriceHistory",
        "pricing:GetProducts",
        "previous catalog",
    } == set(by_name)
    assert by_name["pricing:GetProducts"]["endpoint"] == "us-east-1"
    assert by_name["ec2:DescribeSpotPriceHistory"]["date"] == "2025-12-01"
    carried = by_name["previous catalog"]
    assert carried["date"] == bundled["generated"]
    assert "no AWS API" in carried["origin"]
    assert carried["carried_rows"] == sum(
        1 for o in doc["offerings"] if o["interruption_bucket"] is not None
    )


def test_without_a_previous_catalog_buckets_are_unknown() -> None:
    doc = build_document([_pages()], fetched=FETCHED)
    assert all(o["interruption_bucket"] is None for o in doc["offerings"])
    types = {t["name"]: t for t in doc["instance_types"]}
    assert types["g5.xlarge"]["gpu_memory_gib"] == 22.352
    Catalog.from_document(doc)


def test_refresh_of_a_refresh_keeps_buckets(bundled: dict[str, Any]) -> None:
    first = build_document([_pages()], fetched=FETCHED, previous=bundled)
    second = build_document([_pages()], fetched=date(2025, 12, 2), previous=first)
    assert [o["interruption_bucket"] for o in second["offerings"]] == [
        o["interruption_bucket"] for o in first["offerings"]
    ]
    assert second["instance_types"] == first["instance_types"]


def test_selection_runs_on_a_refreshed_catalog(bundled: dict[str, Any]) -> None:
    catalog = Catalog.from_document(build_document([_pages()], fetched=FETCHED, previous=bundled))
    chosen = select(
        Resources(gpus=1, gpu_memory_gib=24), SpotPolicy.AUTO, catalog, "us-east-1", limit=3
    )
    best = chosen.ranked[0].offering
    assert (best.instance_type.name, best.zone, best.capacity_type) == (
        "g5.xlarge",
        "use1-az6",
        "spot",
    )
    trainium = select(
        Resources(gpus=16, gpu_models=["Trainium"]), SpotPolicy.NEVER, catalog, "us-east-1"
    )
    assert trainium.ranked[0].offering.instance_type.accelerator == "trainium"


def test_bad_input_is_a_refresh_error(bundled: dict[str, Any]) -> None:
    with pytest.raises(RefreshError, match="no regions"):
        build_document([], fetched=FETCHED, previous=bundled)
    with pytest.raises(RefreshError, match="standard AWS region"):
        build_document([_pages("us-east-1-atl-1")], fetched=FETCHED)
    with pytest.raises(RefreshError, match="twice"):
        build_document([_pages(), _pages()], fetched=FETCHED)
    with pytest.raises(RefreshError, match="no catalog instance types"):
        build_document([RegionPages("us-east-1")], fetched=FETCHED)


def test_previous_document_is_not_modified(bundled: dict[str, Any]) -> None:
    before = copy.deepcopy(bundled)
    build_document([_pages()], fetched=FETCHED, previous=bundled)
    assert bundled == before


def test_zone_ids() -> None:
    assert zone_ids([ZONES])["us-east-1b"] == "use1-az6"


def test_show_summary_of_the_bundled_catalog(bundled: dict[str, Any]) -> None:
    summary = summarize(bundled)
    assert summary["instance_types"] == len(bundled["instance_types"])
    assert summary["offering_rows"] == len(bundled["offerings"])
    assert len(summary["regions"]) == len({o["region"] for o in bundled["offerings"]})
    assert summary["priced_offerings"] == len(Catalog.from_document(bundled))
    text = render(summary)
    assert "2025-11-30" in text and "us-east-1" in text
    detail = region_detail(bundled, "us-east-1")
    g5 = next(d for d in detail if d["instance_type"] == "g5.xlarge")
    assert g5["on_demand_usd_per_hour"] == 1.006 and g5["gpu_model"] == "A10G"


def test_timestamps_without_zone_are_utc() -> None:
    got = latest_spot_prices(
        [
            {
                "SpotPriceHistory": [
                    spot("g5.xlarge", "us-east-1a", "0.5", "2025-12-01T09:00:00"),
                    {
                        **spot("g5.xlarge", "us-east-1a", "0.4", ""),
                        "Timestamp": datetime(2025, 12, 1, 10, tzinfo=UTC),
                    },
                ]
            }
        ]
    )
    assert got == {("g5.xlarge", "us-east-1a"): 0.4}
