"""Each run's usage, as the node agents wrote it: `runs/<job>/usage/<instance>.json` in the
intake bucket (layout: domain/usage_layout.py)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar

from gpufleet.domain.usage_layout import NodeSummary, NodeUsage, UsageLayoutError, usage_prefix
from gpufleet.topology import RUNS_PREFIX

# A document of MAX_SAMPLES samples of 8 GPUs is about 1 MB; past this it is not one of ours.
MAX_USAGE_BYTES = 8 * 1024 * 1024

Read = TypeVar("Read", NodeUsage, NodeSummary)


class S3UsageReader:
    def __init__(self, client: Any, bucket: str) -> None:
        self._client = client
        self._bucket = bucket

    def of_job(self, job_id: str) -> list[NodeUsage]:
        return self._read(job_id, NodeUsage.from_json)

    def summaries_of_job(self, job_id: str) -> list[NodeSummary]:
        return self._read(job_id, NodeSummary.from_json)

    def _read(self, job_id: str, parse: Callable[[bytes], Read]) -> list[Read]:
        """Every node's usage document of the job, by instance id; a document that is too large
        or not in the layout is left out (a node writes only its own)."""
        found: list[Read] = []
        paginator = self._client.get_paginator("list_objects_v2")
        pages = paginator.paginate(Bucket=self._bucket, Prefix=usage_prefix(RUNS_PREFIX, job_id))
        for page in pages:
            for item in page.get("Contents", []):
                if item["Size"] > MAX_USAGE_BYTES:
                    continue
                body = self._client.get_object(Bucket=self._bucket, Key=item["Key"])["Body"]
                try:
                    found.append(parse(body.read()))
                except UsageLayoutError:
                    continue
        return sorted(found, key=lambda usage: usage.instance_id)
