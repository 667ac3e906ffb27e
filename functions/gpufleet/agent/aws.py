"""The agent's view of AWS on a real instance: IMDSv2, S3 and EventBridge."""

from __future__ import annotations

import json
import subprocess
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Mapping
from typing import Any

from gpufleet.agent.prepare import decode_ecr_token
from gpufleet.errors import TransientError
from gpufleet.topology import JOB_DIMENSION, METRICS_NAMESPACE

_IMDS = "http://169.254.169.254/latest"


# IMDSv2 tokens last at most six hours; after that every request with one answers 401.
TOKEN_TTL_SECONDS = 21600
# A token is replaced this long before it expires, so no request goes out with a stale one.
TOKEN_RENEWAL_MARGIN_SECONDS = 300
_UNAUTHORIZED = 401


class Imds:
    """Instance identity from the metadata service (IMDSv2; tags must be enabled). The session
    token is renewed before it expires (the agent outlives it: a job, or a warm instance's
    wait, can last days), and once more when the service no longer takes it."""

    def __init__(
        self,
        urlopen: Callable[..., Any] = urllib.request.urlopen,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._urlopen = urlopen
        self._clock = clock
        self._token, self._renew_at = self._new_token()

    def _new_token(self) -> tuple[str, float]:
        """A fresh token, and when to replace it (on the clock, read before it was asked)."""
        asked_at = self._clock()
        request = urllib.request.Request(  # noqa: S310 - fixed link-local URL
            f"{_IMDS}/api/token",
            method="PUT",
            headers={"X-aws-ec2-metadata-token-ttl-seconds": str(TOKEN_TTL_SECONDS)},
        )
        with self._urlopen(request, timeout=2) as response:
            token = str(response.read().decode())
        return token, asked_at + TOKEN_TTL_SECONDS - TOKEN_RENEWAL_MARGIN_SECONDS

    def _get(self, path: str) -> str:
        if self._clock() >= self._renew_at:
            self._token, self._renew_at = self._new_token()
        try:
            return self._get_with_token(path)
        except urllib.error.HTTPError as exc:
            if exc.code != _UNAUTHORIZED:
                raise
        self._token, self._renew_at = self._new_token()
        return self._get_with_token(path)

    def _get_with_token(self, path: str) -> str:
        request = urllib.request.Request(  # noqa: S310 - fixed link-local URL
            f"{_IMDS}/meta-data/{path}", headers={"X-aws-ec2-metadata-token": self._token}
        )
        with self._urlopen(request, timeout=2) as response:
            return str(response.read().decode())

    def instance_id(self) -> str:
        return self._get("instance-id")

    def interruption_notice(self) -> str | None:
        try:
            return self._get("spot/instance-action")
        except urllib.error.HTTPError as exc:
            if exc.code == 404:  # no notice: the normal case
                return None
            raise

    def tags(self) -> Mapping[str, str]:
        return {
            name: self._get(f"tags/instance/{name}") for name in self._get("tags/instance").split()
        }


class S3Manifests:
    """The job's objects under runs/: the node reads its manifest and control object, and
    writes its usage (the instance role may write only runs/*/usage/* and runs/*/stages/*)."""

    def __init__(self, client: Any, bucket: str) -> None:
        self._client = client
        self._bucket = bucket

    def fetch(self, key: str) -> bytes:
        body: bytes = self._client.get_object(Bucket=self._bucket, Key=key)["Body"].read()
        return body

    def store(self, key: str, body: bytes) -> None:
        self._client.put_object(
            Bucket=self._bucket, Key=key, Body=body, ContentType="application/json"
        )


class ReportNotSent(TransientError):
    """EventBridge took the request but not the entry (PutEvents answers 200 with the entry's
    error): the report did not leave, and the agent must not carry on as if it had."""


class EventBridgeReporter:
    def __init__(self, client: Any, bus_name: str) -> None:
        self._client = client
        self._bus = bus_name

    def report(self, source: str, detail_type: str, detail: Mapping[str, Any]) -> None:
        response = self._client.put_events(
            Entries=[
                {
                    "EventBusName": self._bus,
                    "Source": source,
                    "DetailType": detail_type,
                    "Detail": json.dumps(dict(detail)),
                }
            ]
        )
        if response.get("FailedEntryCount"):
            [entry] = response.get("Entries") or [{}]
            raise ReportNotSent(
                f"{detail_type}: {entry.get('ErrorCode', 'unknown')}: "
                f"{entry.get('ErrorMessage', '')}"
            )


class CloudWatchMetrics:
    def __init__(self, client: Any) -> None:
        self._client = client

    def put(self, job_id: str, name: str, value: float, unit: str) -> None:
        self._client.put_metric_data(
            Namespace=METRICS_NAMESPACE,
            MetricData=[
                {
                    "MetricName": name,
                    "Dimensions": [{"Name": JOB_DIMENSION, "Value": job_id}],
                    "Value": value,
                    "Unit": unit,
                }
            ],
        )


class NvidiaSmi:
    """GPU utilization, temperature and memory used from nvidia-smi (the DLAMI has the
    driver)."""

    def utilization_percent(self) -> float | None:
        values = self._query("utilization.gpu")
        return sum(values) / len(values) if values else None

    def temperature_celsius(self) -> float | None:
        values = self._query("temperature.gpu")
        return max(values) if values else None

    def memory_used_mib(self) -> float | None:
        values = self._query("memory.used")  # MiB per GPU, with nounits
        return sum(values) if values else None

    @staticmethod
    def _query(field: str) -> list[float]:
        argv = ["nvidia-smi", f"--query-gpu={field}", "--format=csv,noheader,nounits"]
        completed = subprocess.run(  # noqa: S603 - fixed argv, no shell
            argv, capture_output=True, text=True, check=False, timeout=10
        )
        return [float(v) for v in completed.stdout.split() if v.strip()]


class AwsNodeSecrets:
    """The preparation's lookups (agent/prepare.py NodeSecrets) with the instance role: Secrets
    Manager, Parameter Store, ECR. Clients are made on first use, one per service and region."""

    def __init__(self, client: Callable[..., Any]) -> None:
        self._client = client  # (service, region_name=None) -> a boto3 client
        self._clients: dict[tuple[str, str | None], Any] = {}

    def _of(self, service: str, region: str | None = None) -> Any:
        key = (service, region)
        if key not in self._clients:
            self._clients[key] = (
                self._client(service, region_name=region) if region else self._client(service)
            )
        return self._clients[key]

    def secret_string(self, secret_id: str) -> str:
        response = self._of("secretsmanager").get_secret_value(SecretId=secret_id)
        if "SecretString" not in response:
            raise ValueError(f"{secret_id} holds binary data, not a string")
        return str(response["SecretString"])

    def parameter(self, name: str) -> str:
        response = self._of("ssm").get_parameter(Name=name, WithDecryption=True)
        return str(response["Parameter"]["Value"])

    def ecr_password(self, account: str, region: str) -> str:
        response = self._of("ecr", region).get_authorization_token(registryIds=[account])
        [data] = response["authorizationData"]
        return decode_ecr_token(str(data["authorizationToken"]))
