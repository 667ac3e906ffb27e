"""Services assembled from ports and settings: the same assembly for every runtime."""

from __future__ import annotations

from functools import partial

from gpufleet.domain.catalog import load_bundled
from gpufleet.domain.planning import plan_launch
from gpufleet.ports import Ports
from gpufleet.services.intake import IntakeService
from gpufleet.services.lifecycle import LifecycleService
from gpufleet.settings import Settings


def build_intake(ports: Ports) -> IntakeService:
    return IntakeService(ports)


def build_lifecycle(ports: Ports, settings: Settings) -> LifecycleService:
    planner = partial(
        plan_launch,
        catalog=load_bundled(),
        region=settings.region,
        max_launch_attempts=settings.max_launch_attempts,
        retry_wait_seconds=settings.retry_wait_seconds,
        boot_allowance_seconds=settings.boot_allowance_seconds,
        heartbeat_timeout_seconds=settings.node_heartbeat_timeout_seconds,
    )
    return LifecycleService(ports, planner)
