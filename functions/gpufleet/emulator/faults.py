"""Capacity errors for the emulator: moto's CreateFleet never runs out of capacity.

A `before-call` hook answers CreateFleet with the real error shape (HTTP 200, no instances,
`Errors[]` with `InsufficientInstanceCapacity`) for the jobs and capacity types a scenario names.
"""

from __future__ import annotations

import json
import re
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import botocore.handlers
from botocore.awsrequest import AWSResponse

from gpufleet.topology import RUNS_PREFIX

_JOB_ID = re.compile(r"^j-[0-9a-f]{20}$")


def _job_name(bucket: str, job_id: str) -> str:
    """The job's name from its run manifest, read from the backend (not an API call)."""
    from moto.s3.models import s3_backends

    from gpufleet.emulator.account import ACCOUNT_ID

    backend = s3_backends[ACCOUNT_ID]["global"]
    key = backend.get_object(bucket, f"{RUNS_PREFIX}{job_id}/run.json")
    return str(json.loads(key.value).get("name", "")) if key else ""


class CapacityFaults:
    """Fail spot CreateFleet calls for chosen jobs; counts what it injected."""

    def __init__(self, bucket: str, should_fail: Callable[[str, str], bool]) -> None:
        self._bucket = bucket
        self._should_fail = should_fail
        self._lock = threading.Lock()
        self.injected = 0

    def __call__(
        self, params: dict[str, Any], **_: Any
    ) -> tuple[AWSResponse, dict[str, Any]] | None:
        body = params.get("body", {})
        if not isinstance(body, dict) or body.get("Action") != "CreateFleet":
            return None
        capacity_type = str(body.get("TargetCapacitySpecification.DefaultTargetCapacityType", ""))
        job_ids = [v for v in body.values() if isinstance(v, str) and _JOB_ID.match(v)]
        if not job_ids or not self._should_fail(_job_name(self._bucket, job_ids[0]), capacity_type):
            return None
        with self._lock:
            self.injected += 1
        overrides = {
            "InstanceType": body.get("LaunchTemplateConfigs.1.Overrides.1.InstanceType", ""),
            "SubnetId": body.get("LaunchTemplateConfigs.1.Overrides.1.SubnetId", ""),
        }
        parsed = {
            "FleetId": "fleet-00000000-0000-0000-0000-000000000000",
            "Instances": [],
            "Errors": [
                {
                    "LaunchTemplateAndOverrides": {"Overrides": overrides},
                    "Lifecycle": capacity_type,
                    "ErrorCode": "InsufficientInstanceCapacity",
                    "ErrorMessage": "We currently do not have sufficient capacity in the "
                    "Availability Zone you requested.",
                }
            ],
            "ResponseMetadata": {"HTTPStatusCode": 200},
        }
        http = AWSResponse("https://ec2.us-east-1.amazonaws.com/", 200, {}, None)
        return http, parsed


@contextmanager
def injected(faults: CapacityFaults) -> Iterator[CapacityFaults]:
    """Active for clients created inside the block (handlers create theirs at cold start)."""
    entry = ("before-call.ec2.CreateFleet", faults)
    botocore.handlers.BUILTIN_HANDLERS.append(entry)
    try:
        yield faults
    finally:
        botocore.handlers.BUILTIN_HANDLERS.remove(entry)
