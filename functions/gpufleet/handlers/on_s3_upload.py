"""S3 ObjectCreated under jobs/ (a team's jobs/<team>/) -> intake."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from gpufleet.handlers.common import (
    count_submission,
    idempotency,
    intake,
    logger,
    metrics,
    once_per_delivery,
    settings,
    tracer,
)
from gpufleet.handlers.payloads import Delivery, S3Notification
from gpufleet.topology import INTAKE_PREFIX

if TYPE_CHECKING:
    from aws_lambda_powertools.utilities.typing import LambdaContext


@once_per_delivery
def submit(delivery: Delivery) -> dict[str, Any]:
    from gpufleet.services.intake import describe

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
    idempotency().register_lambda_context(context)
    # The domain's code comes with the first event, as the services that use it do.
    from gpufleet.domain.job import s3_delivery_key

    notification = S3Notification.model_validate(event)
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
