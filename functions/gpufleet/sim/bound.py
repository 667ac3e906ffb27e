"""The price the cost lower bound charges a job: the cheapest the region offers for one node.

Shared by the bound itself (`report.cost_lower_bound_usd`) and the engine's breakdown of what a
policy paid above it (`SimResult.price_above_cheapest_usd`), so both use one price per job.
"""

from __future__ import annotations

from gpufleet.domain.catalog import Catalog
from gpufleet.domain.selection import is_feasible
from gpufleet.domain.spec import Resources


def cheapest_hourly_usd(resources: Resources, catalog: Catalog, region: str) -> float:
    """The lowest hourly price in the region of an instance type that holds one node."""
    prices = [
        o.hourly_usd for o in catalog.offerings(region) if is_feasible(o.instance_type, resources)
    ]
    if not prices:
        raise ValueError(f"no offering in {region} holds a node of {resources}")
    return min(prices)
