"""Objects in the intake bucket: submitted specs, error reports and run manifests."""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from botocore.exceptions import ClientError

from gpufleet.ports import ObjectMissing, ObjectTooLarge


class S3ObjectStore:
    def __init__(self, client: Any, bucket: str) -> None:
        self._client = client
        self._bucket = bucket

    def put_json(self, key: str, document: Mapping[str, Any]) -> None:
        self._client.put_object(
            Bucket=self._bucket,
            Key=key,
            Body=json.dumps(document, indent=2, sort_keys=True).encode("utf-8"),
            ContentType="application/json",
        )

    def get_bytes(self, key: str, max_bytes: int, version_id: str | None = None) -> bytes:
        # Ask for one byte past the limit so an oversized object is refused without reading it.
        # A version id reads that upload (s3:GetObjectVersion), not whatever is latest now.
        request: dict[str, Any] = {
            "Bucket": self._bucket,
            "Key": key,
            "Range": f"bytes=0-{max_bytes}",
        }
        if version_id is not None:
            request["VersionId"] = version_id
        try:
            response = self._client.get_object(**request)
        except ClientError as exc:
            code = exc.response.get("Error", {}).get("Code")
            if code == "InvalidRange":
                return b""  # S3's answer to a range over an empty object
            if code in ("NoSuchKey", "NoSuchVersion"):
                raise ObjectMissing(key, version_id) from None
            raise
        body: bytes = response["Body"].read(max_bytes + 1)
        if len(body) > max_bytes:
            total = int(str(response.get("ContentRange", "/0")).rsplit("/", 1)[-1] or 0)
            raise ObjectTooLarge(key, max(total, len(body)), max_bytes)
        return body
