"""The fleet's policy configuration: one YAML file (`gpufleet.yaml`), validated here.

It is read at deploy time (CDK validates it and hands it to the functions as compact JSON in
`GPUFLEET_CONFIG`) and by the emulator from the same file, so a bad config fails `cdk synth`,
not a job.
"""

from __future__ import annotations

import json
import re
from datetime import datetime
from enum import StrEnum
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from gpufleet.domain.notify import TeamNotify
from gpufleet.domain.queueing import QueuePolicy
from gpufleet.domain.spec import (
    FILE_SYSTEM_ID_PATTERN,
    Name,
    Resources,
    split_s3_uri,
)
from gpufleet.domain.submitters import TeamSubmitters
from gpufleet.errors import RefusedInput
from gpufleet.topology import AGENT_PERIOD_SECONDS

# Lambda environment variables hold at most 4 KiB in all.
MAX_CONFIG_JSON_BYTES = 3072

# A Metrics Insights alarm (the stack's GpuTemperature) queries the last 3 hours only.
METRICS_INSIGHTS_WINDOW_SECONDS = 3 * 3600


def alarm_window_seconds(period_seconds: int) -> int:
    """The longest time an alarm may evaluate (`Period` x `EvaluationPeriods`): CloudWatch
    refuses more than a day for periods under an hour, more than a week otherwise."""
    return 86_400 if period_seconds < 3600 else 7 * 86_400


def most_alarm_periods(period_seconds: int, window_seconds: int | None = None) -> int:
    """The most periods of this length an alarm may evaluate (within `window_seconds`, when
    shorter than CloudWatch's own window)."""
    window = alarm_window_seconds(period_seconds)
    return min(window, window_seconds or window) // period_seconds


class ReservationKind(StrEnum):
    ODCR = "odcr"  # an open On-Demand Capacity Reservation
    CAPACITY_BLOCK = "capacity-block"  # an EC2 Capacity Block for ML (fixed window)


class Reservation(BaseModel):
    """Capacity the account already pays for, used or not: launched into first, and a run on
    it costed at its price (`domain/reserved.py`)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    id: str = Field(pattern=r"^cr-[0-9a-f]{8,17}$")
    kind: ReservationKind
    instance_type: str = Field(pattern=r"^[a-z0-9-]+\.[a-z0-9-]+$")
    zone: str = Field(pattern=r"^[a-z0-9-]+$")
    count: int = Field(ge=1, le=1000, description="Instances the reservation holds")
    start: datetime | None = None
    end: datetime | None = None
    hourly_usd: float | None = Field(
        default=None,
        ge=0,
        description="What one instance-hour on it costs: a Capacity Block's upfront fee over "
        "its hours and instances (needed: the catalog has no Capacity Block prices); an ODCR "
        "defaults to the catalog's on-demand price, which AWS bills it at",
    )

    @model_validator(mode="after")
    def _window(self) -> Reservation:
        if self.kind is ReservationKind.CAPACITY_BLOCK and (self.start is None or self.end is None):
            raise ValueError("a capacity block needs its start and end")
        if self.kind is ReservationKind.CAPACITY_BLOCK and self.hourly_usd is None:
            raise ValueError(
                "a capacity block needs its hourly_usd (its upfront fee / hours / instances)"
            )
        if self.start and self.end and self.end <= self.start:
            raise ValueError("end must be after start")
        return self

    def active_at(self, epoch_seconds: float) -> bool:
        if self.start and epoch_seconds < self.start.timestamp():
            return False
        return not (self.end and epoch_seconds >= self.end.timestamp())


class MetricPolicy(BaseModel):
    """When a job's metrics call for an action, each over `period_seconds` periods in a row:
    idle (mean utilization below `low_utilization_percent` for `low_utilization_periods`), busy
    (above `high_utilization_percent` for `high_utilization_periods`: elastic jobs scale out by
    `scale_step_nodes`), hot, and leaking (GPU memory used growing by more than
    `memory_leak_growth_mib` in each of `memory_leak_periods` periods). docs/fleet.md."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    enabled: bool = True
    period_seconds: int = Field(default=60, ge=10)
    low_utilization_percent: float = Field(default=30.0, gt=0, lt=100)
    low_utilization_periods: int = Field(default=30, ge=1, le=1440)
    hot_temperature_celsius: float = Field(default=85.0, gt=0, lt=150)
    hot_periods: int = Field(default=3, ge=1, le=1440)
    high_utilization_percent: float = Field(default=85.0, gt=0, lt=100)
    high_utilization_periods: int = Field(default=15, ge=1, le=1440)
    scale_step_nodes: int = Field(default=1, ge=1, le=16)
    memory_leak_growth_mib: float = Field(default=1.0, ge=0)
    memory_leak_periods: int = Field(default=15, ge=1, le=1440)

    @model_validator(mode="after")
    def _cloudwatch_periods(self) -> MetricPolicy:
        if self.period_seconds not in (10, 20, 30) and self.period_seconds % 60:
            raise ValueError("period_seconds is 10, 20, 30 or a multiple of 60 (CloudWatch)")
        return self

    @model_validator(mode="after")
    def _cloudwatch_windows(self) -> MetricPolicy:
        most = most_alarm_periods(self.period_seconds)
        window = alarm_window_seconds(self.period_seconds)
        for field in ("low_utilization_periods", "high_utilization_periods", "memory_leak_periods"):
            if getattr(self, field) > most:
                raise ValueError(
                    f"{field} x period_seconds is at most {window} s (CloudWatch): "
                    f"at most {most} periods of {self.period_seconds} s"
                )
        # The stack's GpuTemperature alarm reads the agent's samples with Metrics Insights.
        gpu_period = max(AGENT_PERIOD_SECONDS, self.period_seconds)
        most_hot = most_alarm_periods(gpu_period, METRICS_INSIGHTS_WINDOW_SECONDS)
        if self.hot_periods > most_hot:
            raise ValueError(
                f"hot_periods x {gpu_period} s is at most {METRICS_INSIGHTS_WINDOW_SECONDS} s "
                f"(a Metrics Insights alarm looks back 3 hours): at most {most_hot} periods"
            )
        return self

    @model_validator(mode="after")
    def _busy_above_idle(self) -> MetricPolicy:
        if self.high_utilization_percent <= self.low_utilization_percent:
            raise ValueError("high_utilization_percent must be above low_utilization_percent")
        return self


class WarmPool(BaseModel):
    """Idle instances of one shape kept running so that short jobs start in seconds. The pool is
    kept full while launches ask for its type; after `ttl_minutes` without one, its idle
    instances are released (docs/fleet.md, "Warm pool")."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    instance_type: str = Field(pattern=r"^[a-z0-9-]+\.[a-z0-9-]+$")
    count: int = Field(ge=1, le=20, description="Idle instances kept while in demand")
    ttl_minutes: int = Field(default=60, ge=5, le=7 * 24 * 60)
    # A warm instance is only handed to a launch of the same capacity type (and so price).
    capacity_type: Literal["spot", "on-demand"] = "spot"


class CostPolicy(BaseModel):
    """How runs are priced besides the instances' hourly price (docs/cost.md)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    # EBS gp3 list price in us-east-1, USD per GiB-month (AWS prorates by the second over a
    # 730-hour month); each node's root volume is billed while the node is held.
    ebs_usd_per_gib_month: float = Field(default=0.08, ge=0, le=10)
    # An estimate is price x expected hours x this, plus storage: spot prices move and runs
    # overrun their expected time.
    estimate_factor: float = Field(default=1.2, ge=1, le=10)


class FsxLustre(BaseModel):
    """An existing FSx for Lustre file system jobs may mount: its DNS name and mount name are
    what `mount -t lustre` needs (DescribeFileSystems gives both), so nodes need no FSx API."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    id: str = Field(pattern=FILE_SYSTEM_ID_PATTERN)
    dns_name: str = Field(pattern=r"^fs-[0-9a-f]{8,17}\.fsx\.[a-z0-9-]+\.amazonaws\.com(\.cn)?$")
    mount_name: str = Field(pattern=r"^[a-z0-9]{1,8}$")


class Efs(BaseModel):
    """An existing EFS file system jobs may mount (TLS, with the instance role: IAM
    authorization). `read_only`: the role may mount it but not write (no ClientWrite)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    id: str = Field(pattern=FILE_SYSTEM_ID_PATTERN)
    read_only: bool = False


class DataBucket(BaseModel):
    """An S3 location jobs may mount read-only: `s3://bucket` or `s3://bucket/prefix`."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    uri: str

    @model_validator(mode="after")
    def _an_s3_location(self) -> DataBucket:
        split_s3_uri(self.uri)  # ValueError: pydantic reports it on the field
        return self

    @property
    def bucket(self) -> str:
        return split_s3_uri(self.uri)[0]

    @property
    def prefix(self) -> str:
        """Empty (the whole bucket) or ending in `/`."""
        return split_s3_uri(self.uri)[1]


class DataSources(BaseModel):
    """What jobs may mount besides the instance's own disks (docs/data.md). The nodes' role is
    granted these and nothing else."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    fsx_lustre: list[FsxLustre] = Field(default_factory=list, max_length=20)
    efs: list[Efs] = Field(default_factory=list, max_length=20)
    s3: list[DataBucket] = Field(default_factory=list, max_length=20)

    def fsx(self, file_system_id: str) -> FsxLustre | None:
        return next((fs for fs in self.fsx_lustre if fs.id == file_system_id), None)

    def efs_file_system(self, file_system_id: str) -> Efs | None:
        return next((fs for fs in self.efs if fs.id == file_system_id), None)


# Secrets Manager names and SSM parameter paths (after the leading /) jobs may read.
SECRETS_PREFIX_PATTERN = r"^[A-Za-z0-9_.+=@-]+(/[A-Za-z0-9_.+=@-]+)*/$"
_ECR_REPOSITORY = r"^[a-z0-9]+(?:[._-][a-z0-9]+)*(?:/[a-z0-9]+(?:[._-][a-z0-9]+)*)*$"


class FleetConfig(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    reservations: list[Reservation] = Field(default_factory=list, max_length=50)
    queue: QueuePolicy = Field(default_factory=QueuePolicy)
    metrics: MetricPolicy = Field(default_factory=MetricPolicy)
    # Named resources a job spec can use with `template: NAME` (docs/templates.md).
    templates: dict[Name, Resources] = Field(default_factory=dict, max_length=32)
    warm_pool: WarmPool | None = None
    cost: CostPolicy = Field(default_factory=CostPolicy)
    data: DataSources = Field(default_factory=DataSources)
    # A spec's `secrets` and `registry_credentials` must name secrets under this prefix (SSM
    # parameters under /PREFIX): the nodes' role can read nothing else.
    secrets_prefix: str = Field(default="gpufleet/", pattern=SECRETS_PREFIX_PATTERN)
    # Customer managed KMS keys the secrets are encrypted with (none: AWS managed keys).
    secrets_kms_keys: list[str] = Field(default_factory=list, max_length=10)
    # The account's ECR repositories nodes may pull from (none listed: all of them).
    ecr_repositories: list[str] = Field(default_factory=list, max_length=50)
    # Who may submit for each team by event (domain/submitters.py); none named: the key prefix
    # and event source decide alone. Named: only these teams submit.
    submitters: dict[Name, TeamSubmitters] = Field(default_factory=dict, max_length=50)
    # Where each team's jobs' status changes go (docs/notifications.md).
    teams: dict[Name, TeamNotify] = Field(default_factory=dict, max_length=32)

    @model_validator(mode="after")
    def _named_resources(self) -> FleetConfig:
        for arn in self.secrets_kms_keys:
            if not re.fullmatch(r"arn:aws[a-z-]*:kms:[a-z0-9-]+:[0-9]{12}:key/[0-9a-f-]{36}", arn):
                raise ValueError(f"secrets_kms_keys: {arn!r} is no KMS key ARN")
        for repository in self.ecr_repositories:
            if len(repository) > 256 or not re.fullmatch(_ECR_REPOSITORY, repository):
                raise ValueError(f"ecr_repositories: {repository!r} is no ECR repository name")
        return self


class ConfigFileError(RefusedInput, ValueError):
    pass


def config_from_yaml(text: str) -> FleetConfig:
    # Only the CLI and synth read the YAML file; the functions get it as JSON (config_from_env)
    # and so do without PyYAML.
    import yaml

    try:
        document: Any = yaml.safe_load(text) or {}
        return FleetConfig.model_validate(document)
    except (yaml.YAMLError, ValidationError) as exc:
        raise ConfigFileError(f"invalid gpufleet config: {exc}") from None


def config_to_env(config: FleetConfig) -> str:
    """The compact JSON the functions receive; refuse what Lambda's environment cannot hold."""
    text = json.dumps(config.model_dump(mode="json", exclude_defaults=True), separators=(",", ":"))
    if len(text.encode()) > MAX_CONFIG_JSON_BYTES:
        raise ConfigFileError(
            f"the config is {len(text)} bytes as JSON; the limit is {MAX_CONFIG_JSON_BYTES}"
        )
    return text


def config_from_env(text: str | None) -> FleetConfig:
    return FleetConfig.model_validate_json(text) if text else FleetConfig()
