"""`gpufleet catalog refresh` against moto, and recorded Price List responses.

moto 5.2.5 answers DescribeInstanceTypes (real GpuInfo/NeuronInfo data, every type in every
region, one page), DescribeAvailabilityZones and DescribeSpotPriceHistory (one page, a constant
0.00001 for every type and zone the type is offered in, described as "Linux/UNIX (Amazon VPC)",
StartTime/ProductDescriptions ignored). It has no Price List (pricing) service: GetProducts is
answered by a `before-call` hook from the real-shaped pages in tests/fixtures/pricing/.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from datetime import UTC, date, datetime
from pathlib import Path
from typing import Any

import boto3
import botocore.handlers
import pytest
from botocore.awsrequest import AWSResponse
from moto import mock_aws

from gpufleet.adapters.aws.catalog_source import CatalogSource
from gpufleet.cli import catalog as catalog_cli
from gpufleet.cli import main
from gpufleet.domain.catalog import Catalog
from gpufleet.domain.catalog_refresh import (
    PRICING_ENDPOINT_REGION,
    RegionPages,
    build_document,
)
from gpufleet.domain.selection import select
from gpufleet.domain.spec import Resources, SpotPolicy

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "pricing"
AT = datetime(2025, 12, 1, 12, 0, tzinfo=UTC)
MOTO_SPOT = 0.00001
FIXTURE_ON_DEMAND = {
    "g5.xlarge": 1.006,
    "p4d.24xlarge": 21.957642,
    "p5.48xlarge": 55.04,
    "trn1.32xlarge": 21.5,
    "m7i.2xlarge": 0.4032,
}

ENV = {
    "AWS_ACCESS_KEY_ID": "testing",
    "AWS_SECRET_ACCESS_KEY": "testing",
    "AWS_SECURITY_TOKEN": "testing",
    "AWS_SESSION_TOKEN": "testing",
    "AWS_DEFAULT_REGION": "us-east-1",
    "AWS_ACCOUNT_ID_ENDPOINT_MODE": "disabled",
}


class RecordedPricing:
    """Answers pricing GetProducts from recorded pages, following NextToken like the API."""

    def __init__(self) -> None:
        self.pages: dict[str, list[dict[str, Any]]] = {}
        for path in sorted(FIXTURES.glob("get_products.*.page*.json")):
            region = path.name.split(".page")[0].removeprefix("get_products.")
            self.pages.setdefault(region, []).append(json.loads(path.read_text()))
        self.requests: list[dict[str, Any]] = []

    def __call__(
        self, params: dict[str, Any], **_: Any
    ) -> tuple[AWSResponse, dict[str, Any]] | None:
        body = json.loads(params["body"])
        self.requests.append(body)
        filters = {f["Field"]: f["Value"] for f in body.get("Filters", [])}
        pages = self.pages.get(filters.get("regionCode", ""), [{"FormatVersion": "aws_v1"}])
        index = 0
        if body.get("NextToken"):
            index = 1 + [p.get("NextToken") for p in pages].index(body["NextToken"])
        page = {"PriceList": [], **pages[index], "ResponseMetadata": {"HTTPStatusCode": 200}}
        url = f"https://api.pricing.{PRICING_ENDPOINT_REGION}.amazonaws.com/"
        return AWSResponse(url, 200, {}, None), page


@pytest.fixture(scope="module")
def aws() -> Iterator[None]:
    with pytest.MonkeyPatch.context() as mp:
        for key, value in ENV.items():
            mp.setenv(key, value)
        with mock_aws():
            yield


@pytest.fixture(scope="module")
def recorded(aws: None) -> tuple[list[RegionPages], RecordedPricing]:
    pricing_api = RecordedPricing()
    pricing = boto3.client("pricing", region_name=PRICING_ENDPOINT_REGION)
    pricing.meta.events.register("before-call.pricing.GetProducts", pricing_api)
    source = CatalogSource(lambda r: boto3.client("ec2", region_name=r), pricing)
    return source.fetch(["us-east-1"], at=AT), pricing_api


@pytest.fixture(scope="module")
def document(recorded: tuple[list[RegionPages], RecordedPricing]) -> dict[str, Any]:
    return build_document(
        recorded[0], fetched=date(2025, 12, 1), previous=catalog_cli.bundled_document()
    )


@pytest.fixture(scope="module")
def refreshed(document: dict[str, Any]) -> Catalog:
    return Catalog.from_document(document)


def test_adapter_keeps_catalog_types_and_pages_pricing(
    recorded: tuple[list[RegionPages], RecordedPricing],
) -> None:
    pages, pricing_api = recorded
    (region,) = pages
    names = {t["InstanceType"] for p in region.instance_types for t in p["InstanceTypes"]}
    assert {"g5.xlarge", "p5.48xlarge", "trn1.32xlarge", "inf2.xlarge", "m7i.2xlarge"} <= names
    assert not names & {"t3.micro", "vt1.3xlarge", "i4i.large", "mac2.metal"}
    assert region.spot_price_history and region.availability_zones
    # Two GetProducts pages, followed by NextToken, with the Linux/shared/Used filters.
    assert len(pricing_api.requests) == 2 and len(region.products) == 2
    first, second = pricing_api.requests
    assert "NextToken" not in first and second["NextToken"]
    filters = {f["Field"]: f["Value"] for f in first["Filters"]}
    assert filters == {
        "operatingSystem": "Linux",
        "tenancy": "Shared",
        "preInstalledSw": "NA",
        "capacitystatus": "Used",
        "regionCode": "us-east-1",
    }
    assert first["ServiceCode"] == "AmazonEC2"


def test_refreshed_document_loads_like_the_bundled_one(
    document: dict[str, Any], refreshed: Catalog
) -> None:
    assert list(document) == list(catalog_cli.bundled_document())
    assert refreshed.regions() == ["us-east-1"]
    assert refreshed.generated == "2025-12-01"
    assert len(refreshed.instance_types()) > 150


def test_accelerators_from_describe_instance_types(refreshed: Catalog) -> None:
    g5 = refreshed.instance_type("g5.xlarge")
    assert (g5.accelerator, g5.gpu_model, g5.gpus, g5.gpu_memory_gib) == ("nvidia", "A10G", 1, 24)
    for name in ("trn1.32xlarge", "trn1.2xlarge", "trn2.48xlarge"):
        trn = refreshed.instance_type(name)
        assert trn.accelerator == "trainium", name
        assert trn.gpu_model and trn.gpu_model.startswith("Trainium")
    assert refreshed.instance_type("trn1.32xlarge").gpus == 16
    assert refreshed.instance_type("inf2.48xlarge").accelerator == "inferentia"
    p5 = refreshed.instance_type("p5.48xlarge")
    assert (p5.gpu_model, p5.gpus, p5.gpu_memory_gib, p5.efa) == ("H100", 8, 80, True)
    assert refreshed.instance_type("g6f.large").gpus == 0


def test_instance_store_from_describe_instance_types(refreshed: Catalog) -> None:
    p4d = refreshed.instance_type("p4d.24xlarge")
    assert (p4d.instance_store_disks, p4d.instance_store_gb, p4d.instance_store_nvme) == (
        8,
        8000,
        True,
    )
    assert refreshed.instance_type("g5.xlarge").has_nvme_instance_store
    assert not refreshed.instance_type("g5g.xlarge").has_nvme_instance_store
    assert not refreshed.instance_type("c5.xlarge").has_nvme_instance_store


def test_prices_come_from_the_responses(refreshed: Catalog) -> None:
    on_demand = {
        o.instance_type.name: o.hourly_usd
        for o in refreshed.offerings("us-east-1")
        if o.capacity_type == "on-demand"
    }
    assert on_demand == FIXTURE_ON_DEMAND
    spot = [o for o in refreshed.offerings("us-east-1") if o.capacity_type == "spot"]
    assert spot and {o.hourly_usd for o in spot} == {MOTO_SPOT}
    g5_zones = {o.zone for o in spot if o.instance_type.name == "g5.xlarge"}
    # moto offers g5.xlarge in us-east-1a..d and f; zones are recorded by ID.
    assert len(g5_zones) == 5 and all(z and z.startswith("use1-az") for z in g5_zones)


def test_interruption_buckets_are_carried_over(document: dict[str, Any]) -> None:
    bundled = catalog_cli.bundled_document()
    before = {
        (o["instance_type"], o["region"]): o["interruption_bucket"]
        for o in bundled["offerings"]
        if o["interruption_bucket"] is not None
    }
    spot_rows = [o for o in document["offerings"] if o["spot_usd_per_hour"] is not None]
    for o in spot_rows:
        assert o["interruption_bucket"] == before.get((o["instance_type"], o["region"]))
    rows = {(o["instance_type"], o["zone"]): o for o in document["offerings"]}
    assert rows[("p5.48xlarge", "use1-az1")]["interruption_bucket"] == 1
    trn1 = [o for o in document["offerings"] if o["instance_type"] == "trn1.32xlarge"]
    assert trn1 and {o["interruption_bucket"] for o in trn1} == {0}
    carried = next(s for s in document["sources"] if s.get("file") == "previous catalog")
    assert carried["date"] == bundled["generated"] and carried["carried_rows"] > 0


def test_selection_works_on_the_refreshed_catalog(refreshed: Catalog) -> None:
    on_demand = select(
        Resources(gpus=8, gpu_memory_gib=80, gpu_models=["H100"]),
        SpotPolicy.NEVER,
        refreshed,
        "us-east-1",
    )
    top = on_demand.ranked[0].offering
    assert (top.instance_type.name, top.capacity_type, top.hourly_usd) == (
        "p5.48xlarge",
        "on-demand",
        55.04,
    )
    spot = select(Resources(gpus=1, gpu_memory_gib=24), SpotPolicy.AUTO, refreshed, "us-east-1")
    assert spot.ranked[0].offering.capacity_type == "spot"
    assert spot.ranked[0].offering.instance_type.accelerator == "nvidia"


def test_cli_refresh_writes_a_loadable_catalog(
    aws: None, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "refreshed" / "catalog.json"
    argv = ["catalog", "refresh", "--region", "us-east-1", "--out", str(out), "--json"]
    entry = ("before-call.pricing.GetProducts", RecordedPricing())
    botocore.handlers.BUILTIN_HANDLERS.append(entry)  # clients the CLI creates get the hook
    try:
        assert main(argv) == 0
    finally:
        botocore.handlers.BUILTIN_HANDLERS.remove(entry)
    summary = json.loads(capsys.readouterr().out)
    assert summary["out"] == str(out)
    assert summary["regions"]["us-east-1"]["on_demand"] > 0
    written = Catalog.from_document(json.loads(out.read_text()))
    assert written.instance_type("trn1.32xlarge").accelerator == "trainium"
    assert written.generated == summary["generated"]


def test_cli_rejects_a_local_zone_region(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["catalog", "refresh", "--region", "us-east-1-atl-1"]) == 2
    assert "not a standard AWS region" in capsys.readouterr().err


def test_cli_show(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["catalog", "show", "--price-region", "us-east-1", "--json"]) == 0
    shown = json.loads(capsys.readouterr().out)
    assert list(shown["regions"]) == ["us-east-1"]
    assert any(d["instance_type"] == "p5.48xlarge" for d in shown["detail"])
    assert shown["prices_as_of"]["date"] == shown["generated"]
    assert main(["catalog", "show"]) == 0
    text = capsys.readouterr().out
    assert "instance types" in text and "sources:" in text
    assert f"prices: catalog of {shown['generated']} (" in text  # prices show their date
    assert main(["catalog", "show", "--price-region", "xx-nowhere-1"]) == 2
