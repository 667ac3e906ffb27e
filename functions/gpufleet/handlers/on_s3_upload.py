"""S3 ObjectCreated under jobs/ -> intake."""

from __future__ import annotations

from typing import Any

from aws_lambda_powertools.utilities.parser import parse
from aws_lambda_powertools.utilities.typing import LambdaContext

from gpufleet.domain.job import s3_delivery_key
from gpufleet.handlers.common import (
    IDEMPOTENCY,
    count_submission,
    intake,
    logger,
    metrics,
    once_per_delivery,
    settings,
    tracer,
)
from gpufleet.handlers.models import Delivery, S3Notification
from gpufleet.services.intake import describe
from gpufleet.topology import INTAKE_PREFIX


@once_per_delivery
def submit(delivery: Delivery) -> dict[str, Any]:
    assert delivery.object_key is not None
    outcome = intake().submit_object(
        delivery.object_key, delivery.delivery_key, delivery.source, delivery.version_id
    )
    if outcome.ignored is None:
        count_submission(outcome.accepted)
    return dict(describe(outcome))


@logger.inject_lambda_context(clear_state=True)
@tracer.capture_lambda_handler
@metrics.log_metrics
def handler(event: dict[str, Any], context: LambdaContext) -> dict[str, Any]:
    IDEMPOTENCY.register_lambda_context(context)
    notification = parse(event=event, model=S3Notification)
    results = []
    for record in notification.Records:
        bucket, obj = record.s3.bucket.name, record.s3.object
        key = obj.decoded_key
        # Only our bucket's intake prefix: a record naming anything else (a misrouted or
        # forged notification) is no upload of ours to read or to answer.
        if bucket != settings().intake_bucket or not key.startswith(INTAKE_PREFIX):
            logger.warning("record outside the intake prefix dropped", bucket=bucket, key=key)
            continue
        # A version id (versioned bucket) or sequencer names one upload; the ETag is the
        # fallback, so re-uploading identical bytes to the same key counts as the same delivery.
        marker = obj.versionId or obj.sequencer or obj.eTag or ""
        delivery = Delivery(
            delivery_key=s3_delivery_key(bucket, key, marker),
            source=f"s3://{bucket}/{key}",
            object_key=key,
            version_id=obj.versionId,
        )
        logger.append_keys(delivery=delivery.delivery_key)
        results.append(submit(delivery=delivery))
    return {"results": results}
