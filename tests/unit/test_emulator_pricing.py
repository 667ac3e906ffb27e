"""The embedded account's Price List API (moto has none): GetProducts' shape, paging and
refusals, and that the refresh's parser reads its pages as the bundled on-demand prices."""

from __future__ import annotations

from typing import Any

import pytest

from gpufleet.domain.catalog import load_bundled
from gpufleet.domain.catalog_refresh import on_demand_prices, pricing_filters
from gpufleet.emulator.pricing import PricingRefused, answer


def _pages(params: dict[str, Any]) -> list[dict[str, Any]]:
    pages = [answer(params)]
    while "NextToken" in pages[-1]:
        pages.append(answer({**params, "NextToken": pages[-1]["NextToken"]}))
    return pages


def test_pages_hold_the_bundled_on_demand_prices_of_the_region() -> None:
    params = {"ServiceCode": "AmazonEC2", "Filters": pricing_filters("us-east-1")}
    pages = _pages(params)
    assert len(pages) > 1 and all(len(p["PriceList"]) <= 100 for p in pages)
    assert all(isinstance(item, str) for p in pages for item in p["PriceList"])
    expected = {
        o.instance_type.name: o.hourly_usd
        for o in load_bundled().offerings("us-east-1")
        if o.capacity_type == "on-demand"
    }
    notes: list[str] = []
    assert on_demand_prices(pages, "us-east-1", notes) == expected
    assert notes == []


def test_a_filter_on_another_value_matches_nothing() -> None:
    dedicated = {"Type": "TERM_MATCH", "Field": "tenancy", "Value": "Dedicated"}
    filters = [*pricing_filters("us-east-1"), dedicated]
    assert answer({"ServiceCode": "AmazonEC2", "Filters": filters})["PriceList"] == []


@pytest.mark.parametrize(
    "params",
    [
        {"ServiceCode": "AmazonS3"},
        {"ServiceCode": "AmazonEC2", "MaxResults": 101},
        {"ServiceCode": "AmazonEC2", "NextToken": "not-a-token"},
        {"ServiceCode": "AmazonEC2", "Filters": [{"Type": "ANY_OF", "Field": "x", "Value": "y"}]},
    ],
)
def test_what_the_api_refuses_is_refused(params: dict[str, Any]) -> None:
    with pytest.raises(PricingRefused):
        answer(params)
