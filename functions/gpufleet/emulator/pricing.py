"""The Price List API (pricing GetProducts) for the embedded account: moto 5.2.5 has none.

Answered at the SDK edge (a `before-call` hook, as `account_baseline` answers what moto lacks of
Lambda) from the bundled catalog's on-demand prices, in the real response's shape: `PriceList`
as JSON strings of products with `product.attributes` and `terms.OnDemand.*.priceDimensions`,
paged by `MaxResults` (AWS's default and maximum: 100) with an opaque `NextToken`. Only
`TERM_MATCH` filters on the fields the catalog knows are honoured, as the API does; a filter on
any other field matches nothing here. Spot prices and specs come from moto's EC2.
"""

from __future__ import annotations

import json
import zlib
from collections.abc import Callable
from functools import cache
from typing import Any

from botocore.awsrequest import AWSResponse

from gpufleet.domain.catalog import load_bundled
from gpufleet.domain.catalog_refresh import PRICING_ENDPOINT_REGION
from gpufleet.errors import RefusedInput

_PAGE_SIZE = 100
# The attributes every catalog product carries (Linux, shared tenancy, no licensed software).
_ATTRIBUTES = {
    "operatingSystem": "Linux",
    "tenancy": "Shared",
    "preInstalledSw": "NA",
    "capacitystatus": "Used",
    "marketoption": "OnDemand",
    "operation": "RunInstances",
}


class PricingRefused(RefusedInput):
    """A request the Price List API refuses (its InvalidParameterException)."""


def hooks() -> list[tuple[str, Callable[..., Any]]]:
    return [("before-call.pricing.GetProducts", get_products)]


@cache
def _products() -> tuple[dict[str, Any], ...]:
    """One product per (instance type, region) the bundled catalog prices on demand."""
    seen: dict[tuple[str, str], float] = {}
    catalog = load_bundled()
    for region in catalog.regions():
        for offering in catalog.offerings(region):
            if offering.capacity_type == "on-demand":
                seen[(offering.instance_type.name, region)] = offering.hourly_usd
    return tuple(_product(name, region, usd) for (name, region), usd in sorted(seen.items()))


def _product(instance_type: str, region: str, usd: float) -> dict[str, Any]:
    sku = f"EMU{zlib.crc32(f'{instance_type}|{region}'.encode()):010d}"
    return {
        "product": {
            "productFamily": "Compute Instance",
            "sku": sku,
            "attributes": {**_ATTRIBUTES, "instanceType": instance_type, "regionCode": region},
        },
        "serviceCode": "AmazonEC2",
        "terms": {
            "OnDemand": {
                f"{sku}.JRTCKXETXF": {
                    "sku": sku,
                    "priceDimensions": {
                        f"{sku}.JRTCKXETXF.6YS6EN2CT7": {
                            "unit": "Hrs",
                            "pricePerUnit": {"USD": f"{usd:.6f}"},
                            "description": f"${usd} per On Demand Linux {instance_type}",
                        }
                    },
                }
            }
        },
    }


def _matches(product: dict[str, Any], filters: list[dict[str, str]]) -> bool:
    attributes = product["product"]["attributes"]
    return all(attributes.get(f["Field"]) == f["Value"] for f in filters)


def answer(params: dict[str, Any]) -> dict[str, Any]:
    """GetProducts' response to `params` (the request's body), or PricingRefused."""
    if params.get("ServiceCode") != "AmazonEC2":
        raise PricingRefused(f"unknown service code {params.get('ServiceCode')!r}")
    filters = params.get("Filters", [])
    if any(f.get("Type") != "TERM_MATCH" for f in filters):
        raise PricingRefused("the emulator answers TERM_MATCH filters only")
    size = int(params.get("MaxResults", _PAGE_SIZE))
    if not 1 <= size <= _PAGE_SIZE:
        raise PricingRefused(f"MaxResults must be 1..{_PAGE_SIZE}")
    matching = [p for p in _products() if _matches(p, filters)]
    try:
        start = int(params.get("NextToken") or 0)
    except ValueError:
        raise PricingRefused("invalid NextToken") from None
    page = matching[start : start + size]
    response: dict[str, Any] = {
        "FormatVersion": params.get("FormatVersion", "aws_v1"),
        "PriceList": [json.dumps(p) for p in page],
    }
    if start + size < len(matching):
        response["NextToken"] = str(start + size)
    return response


def get_products(params: dict[str, Any], **_: Any) -> tuple[AWSResponse, dict[str, Any]]:
    url = f"https://api.pricing.{PRICING_ENDPOINT_REGION}.amazonaws.com/"
    try:
        parsed = {**answer(json.loads(params["body"])), "ResponseMetadata": {"HTTPStatusCode": 200}}
        return AWSResponse(url, 200, {}, None), parsed
    except PricingRefused as exc:
        error = {
            "Error": {"Code": "InvalidParameterException", "Message": str(exc)},
            "ResponseMetadata": {"HTTPStatusCode": 400},
        }
        return AWSResponse(url, 400, {}, None), error
