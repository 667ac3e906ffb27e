"""What a run cost: every node's hourly price for every second it was held."""

from __future__ import annotations

from gpufleet.domain.job import Placement


def held_seconds(placement: Placement, released_at: float) -> float:
    return max(0.0, released_at - placement.launched_at)


def fleet_hourly_usd(placement: Placement) -> float:
    """Price per hour of all the job's nodes together."""
    return placement.hourly_usd * len(placement.instance_ids)


def run_cost_usd(placement: Placement, released_at: float) -> float:
    return fleet_hourly_usd(placement) * held_seconds(placement, released_at) / 3600.0
