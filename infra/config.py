"""Typed reader for the CDK context of the gpufleet app.

Values come from `cdk.json` (defaults), from `cdk deploy -c key=value` (always strings) or from
`python infra/app.py -c key=value`. Everything is parsed and validated here, once, so the
constructs only see typed values; a key the app does not know (a typo: `-c subnet_id=...`) is
refused with the known ones named, rather than silently ignored. docs/deploy.md lists every key
(tests/infrastructure/test_stack.py checks that it does).
"""

from __future__ import annotations

import difflib
import re
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, fields
from typing import Any

from gpufleet import topology

_DEFAULT_IMAGES = {image.target: image for image in topology.BOOT_IMAGES}
# `-c ami_<target>=none` builds no launch template for that target (nothing it boots is chosen).
NO_IMAGE = "none"
# Placeholders so that synth works without an account (tests, `make synth`). A deploy with them
# fails on the security group; app.py warns when they are in use.
PLACEHOLDER_VPC_ID = "vpc-0123456789abcdef0"
PLACEHOLDER_SUBNET_IDS = ("subnet-0123456789abcdef0", "subnet-0fedcba9876543210")

# CloudWatch Logs accepts only these retention periods (days).
LOG_RETENTION_DAYS = (
    1, 3, 5, 7, 14, 30, 60, 90, 120, 150, 180, 365, 400, 545, 731, 1096, 1827, 2192, 2557,
    2922, 3288, 3653,
)  # fmt: skip

_VPC_ID = re.compile(r"^vpc-[0-9a-f]{8}([0-9a-f]{9})?$")
_SUBNET_ID = re.compile(r"^subnet-[0-9a-f]{8}([0-9a-f]{9})?$")
_BUS_NAME = re.compile(r"^[A-Za-z0-9._\-]{1,256}$")
_S3_URI = re.compile(r"^s3://(?P<bucket>[a-z0-9][a-z0-9.\-]{1,61}[a-z0-9])(?:/(?P<prefix>.*))?$")
_LOG_LEVELS = ("DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL")
_LAYER_VERSION_ARN = re.compile(
    r"^arn:aws[a-z-]*:lambda:[a-z0-9-]+:\d{12}:layer:[A-Za-z0-9_-]{1,140}:\d+$"
)


DEFAULT_STACK_NAME = "GpuFleetStack"
# CloudFormation stack names; the stack's names built on it must fit their own limits: the
# state machine's (80 characters) is the tightest.
_STACK_NAME = re.compile(r"^[A-Za-z][A-Za-z0-9-]*$")
MAX_STACK_NAME = 80 - 1 - max(len(m.construct_id) for m in topology.STATE_MACHINES)
# Context the CDK itself keeps (feature flags, the CLI's settings, cached lookups), not the app's.
_CDK_OWN_KEYS = frozenset({"acknowledged-issue-numbers", "cli-telemetry"})


class ConfigError(ValueError):
    """A context value that cannot be used."""


def _is_cdk_key(key: str) -> bool:
    return key.startswith("@") or ":" in key or key in _CDK_OWN_KEYS


def _to_int(key: str, value: Any, minimum: int, maximum: int) -> int:
    try:
        number = int(value)
    except (TypeError, ValueError):
        raise ConfigError(f"context {key!r} must be an integer, got {value!r}") from None
    if not minimum <= number <= maximum:
        raise ConfigError(f"context {key!r} must be in [{minimum}, {maximum}], got {number}")
    return number


def _to_bool(key: str, value: Any) -> bool:
    if isinstance(value, bool):
        return value
    text = str(value).strip().lower()
    if text in ("true", "1", "yes", "on"):
        return True
    if text in ("false", "0", "no", "off"):
        return False
    raise ConfigError(f"context {key!r} must be true or false, got {value!r}")


def _to_list(value: Any) -> tuple[str, ...]:
    if isinstance(value, list | tuple):
        items = [str(item) for item in value]
    else:
        items = str(value).split(",")
    return tuple(item.strip() for item in items if item.strip())


@dataclass(frozen=True)
class Checkpoints:
    """Where jobs keep checkpoints (`s3://bucket/prefix`), if outside the intake bucket."""

    bucket: str
    prefix: str


@dataclass(frozen=True)
class GpuFleetConfig:
    # One stack per trust domain (SECURITY.md): each its own name, and its own everything.
    stack_name: str = DEFAULT_STACK_NAME
    bus_name: str = "gpufleet"
    # A folder to zip as the code instead of the bundle synth builds (infra/constructs/code.py).
    lambda_asset: str = ""
    # A Powertools layer version ARN instead of the one the public SSM parameter names at deploy.
    powertools_layer_arn: str = ""
    log_level: str = "INFO"
    log_retention_days: int = 30
    vpc_id: str = PLACEHOLDER_VPC_ID
    subnet_ids: tuple[str, ...] = PLACEHOLDER_SUBNET_IDS
    # The image of each boot target (topology.BOOT_IMAGES): a public or private SSM parameter
    # naming an AMI, or `none`; and its root device (/dev/sda1 on the Ubuntu DLAMIs, /dev/xvda
    # on Amazon Linux), which the template sizes.
    ami_x86_64_nvidia: str = _DEFAULT_IMAGES["x86_64-nvidia"].ssm_parameter
    ami_arm64_nvidia: str = _DEFAULT_IMAGES["arm64-nvidia"].ssm_parameter
    ami_x86_64_neuron: str = _DEFAULT_IMAGES["x86_64-neuron"].ssm_parameter
    ami_x86_64_cpu: str = _DEFAULT_IMAGES["x86_64-cpu"].ssm_parameter
    ami_arm64_cpu: str = _DEFAULT_IMAGES["arm64-cpu"].ssm_parameter
    root_device_x86_64_nvidia: str = _DEFAULT_IMAGES["x86_64-nvidia"].root_device
    root_device_arm64_nvidia: str = _DEFAULT_IMAGES["arm64-nvidia"].root_device
    root_device_x86_64_neuron: str = _DEFAULT_IMAGES["x86_64-neuron"].root_device
    root_device_x86_64_cpu: str = _DEFAULT_IMAGES["x86_64-cpu"].root_device
    root_device_arm64_cpu: str = _DEFAULT_IMAGES["arm64-cpu"].root_device
    root_volume_gib: int = 200
    checkpoint_uri: str = ""
    # Multi-node jobs (NCCL, EFA) need all traffic between the job's own instances.
    intra_fleet_traffic: bool = True
    noncurrent_version_days: int = 30
    access_log_days: int = 365
    event_retry_attempts: int = 4
    event_max_age_hours: int = 6
    # The node agent imports gpufleet.agent and gpufleet.topology only: boto3 is all it needs.
    agent_pip_packages: str = "boto3"
    # The policy config (reservations, ...), relative to the repository root.
    config_file: str = "gpufleet.yaml"
    # Alarm thresholds (docs/deploy.md, "Dashboard and alarms"); the GPU temperature limit is
    # the config file's metrics.hot_temperature_celsius.
    wait_slo_seconds: int = 1800  # p95 of the queue wait over 15 minutes
    launch_failures_per_5min: int = 5

    @property
    def uses_placeholder_network(self) -> bool:
        return (
            self.vpc_id == PLACEHOLDER_VPC_ID
            or set(self.subnet_ids) & set(PLACEHOLDER_SUBNET_IDS) != set()
        )

    def boot_images(self) -> list[topology.BootImage]:
        """The images this deployment boots, one per boot target it has one for."""
        images = []
        for target in _DEFAULT_IMAGES:
            field_name = target.replace("-", "_")
            parameter = getattr(self, f"ami_{field_name}")
            if parameter != NO_IMAGE:
                root_device = getattr(self, f"root_device_{field_name}")
                images.append(topology.BootImage(target, parameter, root_device))
        return images

    @property
    def checkpoints(self) -> Checkpoints | None:
        if not self.checkpoint_uri:
            return None
        match = _S3_URI.match(self.checkpoint_uri)
        if match is None:  # checked in from_context; kept for the type checker
            raise ConfigError(f"bad checkpoint_uri {self.checkpoint_uri!r}")
        prefix = (match.group("prefix") or "").strip("/")
        return Checkpoints(bucket=match.group("bucket"), prefix=prefix)

    @classmethod
    def from_context(cls, get: Callable[[str], Any] | Mapping[str, Any]) -> GpuFleetConfig:
        """Read every known key; `get` is `node.try_get_context` or a plain mapping."""
        lookup: Callable[[str], Any] = get.get if isinstance(get, Mapping) else get
        raw = {f.name: lookup(f.name) for f in fields(cls)}
        values: dict[str, Any] = {k: v for k, v in raw.items() if v is not None and v != ""}
        config = cls()
        parsed: dict[str, Any] = {}
        for key, value in values.items():
            default = getattr(config, key)
            if isinstance(default, bool):
                parsed[key] = _to_bool(key, value)
            elif isinstance(default, int):
                parsed[key] = _to_int(key, value, 0, 100_000)
            elif isinstance(default, tuple):
                parsed[key] = _to_list(value)
            else:
                parsed[key] = str(value).strip()
        result = cls(**{**{f.name: getattr(config, f.name) for f in fields(cls)}, **parsed})
        result.validate()
        return result

    @classmethod
    def check_keys(cls, keys: Iterable[str]) -> None:
        """Refuse a context key that is neither the app's nor the CDK's, naming the closest."""
        known = [f.name for f in fields(cls)]
        for key in sorted(keys):
            if key in known or _is_cdk_key(key):
                continue
            close = difflib.get_close_matches(key, known, n=1)
            hint = f" (did you mean {close[0]!r}?)" if close else ""
            raise ConfigError(
                f"unknown context key {key!r}{hint}; the keys are {', '.join(known)} "
                "(docs/deploy.md)"
            )

    @staticmethod
    def check_stack_name(name: str) -> None:
        """A name CloudFormation takes."""
        if not _STACK_NAME.match(name) or len(name) > MAX_STACK_NAME:
            raise ConfigError(
                f"stack_name {name!r} must start with a letter, hold only letters, digits and "
                f"hyphens, and be at most {MAX_STACK_NAME} characters"
            )

    def validate(self) -> None:
        self.check_stack_name(self.stack_name)
        if not _BUS_NAME.match(self.bus_name) or self.bus_name == "default":
            raise ConfigError(f"bus_name {self.bus_name!r} is not a valid custom bus name")
        if self.powertools_layer_arn and not _LAYER_VERSION_ARN.match(self.powertools_layer_arn):
            raise ConfigError(
                f"powertools_layer_arn {self.powertools_layer_arn!r} is not a layer version ARN "
                "(arn:aws:lambda:REGION:ACCOUNT:layer:NAME:VERSION)"
            )
        if self.log_level.upper() not in _LOG_LEVELS:
            raise ConfigError(f"log_level must be one of {_LOG_LEVELS}, got {self.log_level!r}")
        if self.log_retention_days not in LOG_RETENTION_DAYS:
            raise ConfigError(
                f"log_retention_days must be one of {LOG_RETENTION_DAYS}, "
                f"got {self.log_retention_days}"
            )
        if not _VPC_ID.match(self.vpc_id):
            raise ConfigError(f"vpc_id {self.vpc_id!r} is not a VPC id")
        if not self.subnet_ids:
            raise ConfigError("subnet_ids needs at least one subnet id")
        for subnet in self.subnet_ids:
            if not _SUBNET_ID.match(subnet):
                raise ConfigError(f"subnet id {subnet!r} in subnet_ids is not a subnet id")
        for target in _DEFAULT_IMAGES:
            field_name = target.replace("-", "_")
            parameter = getattr(self, f"ami_{field_name}")
            if parameter != NO_IMAGE and not parameter.startswith("/"):
                raise ConfigError(
                    f"ami_{field_name} must be an SSM parameter path starting with / or "
                    f"{NO_IMAGE!r}, got {parameter!r}"
                )
            if not getattr(self, f"root_device_{field_name}").startswith("/dev/"):
                raise ConfigError(
                    f"root_device_{field_name} must be a device path such as /dev/sda1"
                )
        if not self.boot_images():
            raise ConfigError("every ami_* is 'none': the stack would boot no instance type")
        if not 8 <= self.root_volume_gib <= 16_384:
            raise ConfigError("root_volume_gib must be in [8, 16384]")
        if self.checkpoint_uri and not _S3_URI.match(self.checkpoint_uri):
            raise ConfigError(f"checkpoint_uri {self.checkpoint_uri!r} is not s3://bucket/prefix")
        if not 0 <= self.event_retry_attempts <= 185:
            raise ConfigError("event_retry_attempts must be in [0, 185]")
        if not 1 <= self.event_max_age_hours <= 24:
            raise ConfigError("event_max_age_hours must be in [1, 24]")
        if not 60 <= self.wait_slo_seconds <= 86_400:
            raise ConfigError("wait_slo_seconds must be in [60, 86400]")
        if self.launch_failures_per_5min < 1:
            raise ConfigError("launch_failures_per_5min must be at least 1")
