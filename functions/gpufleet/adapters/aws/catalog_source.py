"""Reads what `gpufleet catalog refresh` needs from the AWS APIs, as raw response pages.

Per region: DescribeAvailabilityZones, DescribeInstanceTypes (kept: accelerated types and the
CPU families the catalog carries), DescribeSpotPriceHistory (Linux/UNIX, the price in effect
at `at`) and pricing GetProducts (Linux on-demand). The Price List API is served only from
us-east-1, ap-south-1 and eu-central-1; the pricing client should be a us-east-1 one
(`PRICING_ENDPOINT_REGION`), which answers for every region. Parsing is in
`gpufleet.domain.catalog_refresh`.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from datetime import datetime
from typing import Any

from gpufleet.domain.catalog_refresh import (
    PRICING_ENDPOINT_REGION,
    SPOT_PRODUCT_DESCRIPTION,
    RegionPages,
    is_catalog_type,
    pricing_filters,
)

# DescribeSpotPriceHistory gets the instance types in batches of this many.
_SPOT_TYPES_PER_CALL = 100


def _pages(client: Any, operation: str, **params: Any) -> Iterator[dict[str, Any]]:
    for page in client.get_paginator(operation).paginate(**params):
        yield {k: v for k, v in page.items() if k != "ResponseMetadata"}


class CatalogSource:
    """`ec2_client(region)` gives an EC2 client for a region; `pricing` is a pricing client."""

    def __init__(self, ec2_client: Callable[[str], Any], pricing: Any) -> None:
        self._ec2_client = ec2_client
        self._pricing = pricing

    def fetch(self, regions: Sequence[str], *, at: datetime) -> list[RegionPages]:
        return [self.fetch_region(region, at=at) for region in regions]

    def fetch_region(self, region: str, *, at: datetime) -> RegionPages:
        ec2 = self._ec2_client(region)
        zones = ec2.describe_availability_zones()
        zones.pop("ResponseMetadata", None)
        type_pages = [
            {"InstanceTypes": [t for t in page.get("InstanceTypes", []) if is_catalog_type(t)]}
            for page in _pages(ec2, "describe_instance_types")
        ]
        names = sorted({t["InstanceType"] for p in type_pages for t in p["InstanceTypes"]})
        spot_pages: list[dict[str, Any]] = []
        for i in range(0, len(names), _SPOT_TYPES_PER_CALL):
            # Start = end = `at`: the price in effect then, per type and zone (not 90 days).
            spot_pages.extend(
                _pages(
                    ec2,
                    "describe_spot_price_history",
                    InstanceTypes=names[i : i + _SPOT_TYPES_PER_CALL],
                    ProductDescriptions=[SPOT_PRODUCT_DESCRIPTION],
                    StartTime=at,
                    EndTime=at,
                )
            )
        products = list(
            _pages(
                self._pricing,
                "get_products",
                ServiceCode="AmazonEC2",
                FormatVersion="aws_v1",
                Filters=pricing_filters(region),
            )
        )
        return RegionPages(
            region=region,
            instance_types=type_pages,
            availability_zones=[zones],
            spot_price_history=spot_pages,
            products=products,
        )


def fetch_with_default_clients(regions: Sequence[str], at: datetime) -> list[RegionPages]:
    """Read the APIs with the runtime's clients (default credentials; the Price List from
    its us-east-1 endpoint, which answers for every region)."""
    from gpufleet.adapters.aws.runtime import client

    source = CatalogSource(lambda r: client("ec2", r), client("pricing", PRICING_ENDPOINT_REGION))
    return source.fetch(regions, at=at)
