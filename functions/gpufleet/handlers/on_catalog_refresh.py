"""Schedule (daily) -> rebuild the region's catalog from the AWS APIs into the stack's bucket."""

from __future__ import annotations

from dataclasses import asdict
from typing import TYPE_CHECKING, Any

from gpufleet.handlers.common import logger, metrics, ports, settings, tracer

if TYPE_CHECKING:
    from aws_lambda_powertools.utilities.typing import LambdaContext


@logger.inject_lambda_context(clear_state=True)
@tracer.capture_lambda_handler
@metrics.log_metrics
def handler(event: dict[str, Any], context: LambdaContext) -> dict[str, Any]:
    # The schedule's event carries nothing the refresh needs. The refresh's code (and the
    # catalog's models) comes with the first event.
    from gpufleet.adapters.aws.catalog_source import fetch_with_default_clients
    from gpufleet.services.catalog_refresh import CatalogRefreshService

    service = CatalogRefreshService(
        ports().objects, ports().clock, fetch_with_default_clients, settings().region
    )
    result = service.run()
    logger.info("catalog refreshed", extra=asdict(result))
    return asdict(result)
