"""Services assembled from ports and settings: the same assembly for every runtime."""

from __future__ import annotations

from collections.abc import Sequence
from functools import cache
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from gpufleet.domain.catalog import Catalog, InstanceType
    from gpufleet.domain.duration import DurationEstimate
    from gpufleet.domain.planning import LaunchPlan
    from gpufleet.domain.reserved import FreeReservation
    from gpufleet.domain.spec import JobSpec
    from gpufleet.ports import Ports
    from gpufleet.services.actions import MetricActions
    from gpufleet.services.backstop import BackstopService
    from gpufleet.services.dispatcher import DispatcherService
    from gpufleet.services.intake import IntakeService
    from gpufleet.services.lifecycle import LifecycleService
    from gpufleet.services.metric_watch import MetricWatch
    from gpufleet.services.notifications import StatusNotifications
    from gpufleet.services.reconciler import ReconcilerService
    from gpufleet.settings import Settings

# Each builder imports its own service: a Lambda function builds one or two of them, and imports
# (compiles, on Lambda) no other's code.


def build_intake(ports: Ports, settings: Settings, lifecycle: LifecycleService) -> IntakeService:
    from gpufleet.services.intake import IntakeService

    return IntakeService(
        ports,
        lifecycle,
        settings.config,
        account=settings.account_id,
        region=settings.region,
        checkpoint_uri=settings.checkpoint_uri,
    )


def build_status_notifications(ports: Ports, settings: Settings) -> StatusNotifications:
    from gpufleet.services.notifications import StatusNotifications

    return StatusNotifications(ports.notifier, settings.config.teams, settings.team_topics)


def build_dispatcher(
    ports: Ports, settings: Settings, lifecycle: LifecycleService
) -> DispatcherService:
    from gpufleet.services.dispatcher import DispatcherService

    return DispatcherService(ports, lifecycle, settings.config.queue)


def build_reconciler(
    ports: Ports, settings: Settings, lifecycle: LifecycleService
) -> ReconcilerService:
    from gpufleet.services.reconciler import ReconcilerService

    return ReconcilerService(
        ports,
        lifecycle,
        grace_seconds=settings.reconcile_grace_seconds,
        boot_allowance_seconds=settings.boot_allowance_seconds,
        abandoned_after_seconds=settings.abandoned_after_seconds,
        warm_pool=settings.config.warm_pool,
    )


def build_backstop(ports: Ports, lifecycle: LifecycleService) -> BackstopService:
    from gpufleet.services.backstop import BackstopService

    return BackstopService(ports, lifecycle)


def build_actions(ports: Ports, settings: Settings, lifecycle: LifecycleService) -> MetricActions:
    from gpufleet.services.actions import MetricActions

    return MetricActions(ports, lifecycle, settings.config.metrics)


def build_metric_watch(
    ports: Ports, settings: Settings, lifecycle: LifecycleService
) -> MetricWatch:
    from gpufleet.services.metric_watch import MetricWatch

    policy = settings.config.metrics
    return MetricWatch(ports, build_actions(ports, settings, lifecycle), policy)


def build_lifecycle(ports: Ports, settings: Settings) -> LifecycleService:
    from gpufleet.domain.catalog import load_bundled
    from gpufleet.domain.planning import plan_launch
    from gpufleet.services.catalog import current_catalog
    from gpufleet.services.lifecycle import LifecycleService
    from gpufleet.services.lifecycle_base import LifecyclePolicy

    bundled = load_bundled()

    @cache
    def catalog() -> Catalog:
        # Read when first planned with, not at cold start: most events plan nothing.
        return current_catalog(
            ports.objects,
            ports.clock,
            region=settings.region,
            max_age_days=settings.catalog_max_age_days,
        ).catalog

    bootable = settings.bootable

    def planner(
        spec: JobSpec,
        *,
        unavailable: frozenset[str],
        expected: DurationEstimate,
        free_reservations: Sequence[FreeReservation],
        observed_hazard: float,
    ) -> LaunchPlan:
        return plan_launch(
            spec,
            catalog(),
            settings.region,
            max_launch_attempts=settings.max_launch_attempts,
            retry_wait_seconds=settings.retry_wait_seconds,
            boot_allowance_seconds=settings.boot_allowance_seconds,
            heartbeat_timeout_seconds=settings.node_heartbeat_timeout_seconds,
            expected=expected,
            unavailable=unavailable,
            free_reservations=free_reservations,
            bootable=bootable,
            observed_hazard=observed_hazard,
        )

    def instance_type_of(name: str) -> InstanceType:
        # Specs do not move with prices: the bundled snapshot answers for the types it knows,
        # so settling a run never reads the bucket; a type only a refresh added is looked up
        # in the catalog it was planned from.
        try:
            return bundled.instance_type(name)
        except KeyError:
            return catalog().instance_type(name)

    policy = LifecyclePolicy(
        region=settings.region,
        capacity_memory_seconds=settings.capacity_memory_seconds,
        reservations=tuple(settings.config.reservations),
        max_interruptions=settings.max_interruptions,
        gpu_memory_of=lambda name: instance_type_of(name).gpu_memory_gib,
        instance_type_of=instance_type_of,
        data_bucket=settings.intake_bucket,
        data_sources=settings.config.data,
        metrics=settings.config.metrics,
        cost=settings.config.cost,
        root_volume_gib=settings.root_volume_gib,
        node_heartbeat_timeout_seconds=settings.node_heartbeat_timeout_seconds,
        boot_allowance_seconds=settings.boot_allowance_seconds,
        queue=settings.config.queue,
    )
    return LifecycleService(ports, planner, policy)
