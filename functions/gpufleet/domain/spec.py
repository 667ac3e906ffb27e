"""The job specification: what a submitter asks gpufleet to run.

A spec arrives as YAML or JSON (an S3 object, an EventBridge event's detail, or the CLI). It is
validated here and nowhere else; everything downstream works with a `JobSpec` it can trust.
"""

from __future__ import annotations

import json
import re
from enum import StrEnum
from typing import Annotated, Any, Literal

import yaml
from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    StringConstraints,
    ValidationError,
    field_validator,
    model_validator,
)

# Upper bound on a spec document. Real specs are a few KiB; anything near this is abuse.
MAX_SPEC_BYTES = 256 * 1024

_DURATION_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400}
_DURATION_RE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([smhd]?)\s*$")

Name = Annotated[str, StringConstraints(pattern=r"^[a-z0-9][a-z0-9._-]{0,62}$")]
EnvName = Annotated[str, StringConstraints(pattern=r"^[A-Za-z_][A-Za-z0-9_]{0,127}$")]
# An OCI image reference: registry/repo[:tag][@digest]; no whitespace, no shell syntax.
ImageRef = Annotated[
    str,
    StringConstraints(pattern=r"^[A-Za-z0-9][A-Za-z0-9._/:@+-]{0,511}$"),
]
Arg = Annotated[str, StringConstraints(max_length=8192)]


class Priority(StrEnum):
    CRITICAL = "critical"
    HIGH = "high"
    NORMAL = "normal"
    LOW = "low"


class SpotPolicy(StrEnum):
    """How a job may use spot capacity."""

    AUTO = "auto"  # spot first, on-demand when spot has no capacity
    REQUIRED = "required"  # spot only; wait and retry for spot capacity
    NEVER = "never"  # on-demand only


class Architecture(StrEnum):
    X86_64 = "x86_64"
    ARM64 = "arm64"


def parse_duration(value: object) -> int:
    """Seconds from `3600`, `"90m"`, `"4h"`, `"1.5d"`; raise ValueError otherwise."""
    if isinstance(value, bool):
        raise ValueError("a duration is a number of seconds or a string like '90m' or '4h'")
    if isinstance(value, int | float):
        seconds = float(value)
    elif isinstance(value, str):
        match = _DURATION_RE.match(value)
        if match is None:
            raise ValueError("a duration is a number of seconds or a string like '90m' or '4h'")
        seconds = float(match.group(1)) * _DURATION_UNITS[match.group(2) or "s"]
    else:
        raise ValueError("a duration is a number of seconds or a string like '90m' or '4h'")
    if seconds <= 0:
        raise ValueError("a duration must be positive")
    return round(seconds)


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, str_strip_whitespace=False)


class Resources(_Strict):
    """What one node of the job needs. `nodes` > 1 asks for that many identical nodes."""

    gpus: int = Field(default=1, ge=0, le=16, description="GPUs per node")
    gpu_memory_gib: float = Field(
        default=0, ge=0, le=1024, description="Minimum memory per GPU, GiB"
    )
    gpu_models: list[Annotated[str, StringConstraints(pattern=r"^[A-Za-z0-9 ._-]{1,40}$")]] = Field(
        default_factory=list,
        max_length=32,
        description="Allowed GPU models (e.g. A100, H100); empty allows any",
    )
    vcpus: int = Field(default=1, ge=1, le=1024, description="Minimum vCPUs per node")
    memory_gib: float = Field(default=1, gt=0, le=32768, description="Minimum RAM per node, GiB")
    nodes: int = Field(default=1, ge=1, le=64, description="Number of nodes")
    arch: Architecture = Field(default=Architecture.X86_64, description="CPU architecture")

    @property
    def total_gpus(self) -> int:
        return self.gpus * self.nodes


class JobSpec(_Strict):
    """A training job as submitted."""

    name: Name
    team: Name
    priority: Priority = Priority.NORMAL
    image: ImageRef
    command: list[Arg] = Field(
        min_length=1, max_length=1024, description="argv list; never run through a shell"
    )
    env: dict[EnvName, Annotated[str, StringConstraints(max_length=8192)]] = Field(
        default_factory=dict, max_length=256
    )
    resources: Resources = Field(default_factory=Resources)
    spot: SpotPolicy = SpotPolicy.AUTO
    checkpoint: (
        Annotated[str, StringConstraints(pattern=r"^s3://[a-z0-9][a-z0-9.-]{1,61}[a-z0-9](/\S*)?$")]
        | None
    ) = Field(default=None, description="S3 URI where the job writes and reads checkpoints")
    max_retries: int = Field(
        default=3, ge=0, le=20, description="Retries of a failed run (exit code, lost node)"
    )
    retry_exit_codes: list[Annotated[int, Field(ge=1, le=255)]] = Field(
        default_factory=list,
        max_length=64,
        description="Exit codes that are retried; empty: any non-zero exit code",
    )
    no_retry_exit_codes: list[Annotated[int, Field(ge=1, le=255)]] = Field(
        default_factory=list,
        max_length=64,
        description="Exit codes never retried (e.g. bad arguments)",
    )
    on_idle: Literal["flag", "release"] = Field(
        default="flag",
        description="When the GPUs stay idle: flag the job, or checkpoint and release it",
    )
    retry_oom_with_more_memory: bool = Field(
        default=True,
        description="Retry a run that ran out of GPU memory on GPUs with more memory",
    )
    timeout_seconds: int = Field(
        default=86400,
        alias="timeout",
        ge=60,
        le=14 * 86400,
        description="Wall-clock limit of one run: seconds or '90m', '4h', '2d'",
    )
    expected_duration_seconds: int | None = Field(
        default=None,
        alias="expected_duration",
        ge=1,
        le=14 * 86400,
        description="Expected run time, used for cost estimates and selection",
    )
    budget_usd: float | None = Field(default=None, gt=0, le=10_000_000)

    model_config = ConfigDict(extra="forbid", frozen=True, populate_by_name=True)

    @field_validator("command", mode="before")
    @classmethod
    def _argv_not_shell(cls, value: Any) -> Any:
        if isinstance(value, str):
            raise ValueError(
                "command is an argv list, e.g. ['python', 'train.py']; a shell string is refused"
            )
        return value

    @field_validator("timeout_seconds", "expected_duration_seconds", mode="before")
    @classmethod
    def _duration(cls, value: Any) -> Any:
        return None if value is None else parse_duration(value)

    @model_validator(mode="after")
    def _consistent(self) -> JobSpec:
        if self.resources.nodes > 1 and self.resources.gpus == 0:
            raise ValueError("multi-node jobs need GPUs on every node (resources.gpus >= 1)")
        return self

    def to_document(self) -> dict[str, Any]:
        """The canonical JSON-ready form, with the same field names a submitter writes."""
        return self.model_dump(mode="json", by_alias=True, exclude_none=True)


class FieldError(BaseModel):
    field: str
    message: str


class SpecError(Exception):
    """A submitted spec was refused. Carries every problem found, by field."""

    def __init__(self, message: str, fields: list[FieldError] | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.fields = fields or []

    def to_dict(self) -> dict[str, Any]:
        return {
            "error": "InvalidJobSpec",
            "message": self.message,
            "fields": [f.model_dump() for f in self.fields],
        }


def _field_path(loc: tuple[int | str, ...]) -> str:
    path = ""
    for part in loc:
        if isinstance(part, int):
            path += f"[{part}]"
        else:
            path += f".{part}" if path else str(part)
    return path or "(document)"


def spec_from_mapping(document: object) -> JobSpec:
    """Validate an already-parsed document; raise SpecError naming every bad field."""
    if not isinstance(document, dict):
        raise SpecError("a job spec is a mapping (YAML or JSON object)")
    try:
        return JobSpec.model_validate(document)
    except ValidationError as exc:
        fields = [
            FieldError(field=_field_path(tuple(err["loc"])), message=str(err["msg"]))
            for err in exc.errors(include_url=False, include_input=False)
        ]
        raise SpecError(f"{len(fields)} invalid field(s) in the job spec", fields) from None


class _SafeLoader(yaml.SafeLoader):
    """SafeLoader that refuses aliases, so a 'billion laughs' document cannot expand."""

    def compose_node(self, parent: Any, index: Any) -> Any:
        if self.check_event(yaml.AliasEvent):
            raise SpecError("YAML aliases are not allowed in a job spec")
        return super().compose_node(parent, index)


def parse_spec(raw: bytes | str, fmt: Literal["yaml", "json", "auto"] = "auto") -> JobSpec:
    """Parse and validate a YAML or JSON document into a JobSpec, or raise SpecError."""
    data = raw.encode("utf-8", "surrogatepass") if isinstance(raw, str) else raw
    if len(data) > MAX_SPEC_BYTES:
        raise SpecError(f"the spec is {len(data)} bytes; the limit is {MAX_SPEC_BYTES}")
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise SpecError(f"the spec is not valid UTF-8 (byte {exc.start})") from None
    try:
        document: object
        if fmt == "json" or (fmt == "auto" and text.lstrip().startswith("{")):
            document = json.loads(text)
        else:
            document = yaml.load(text, Loader=_SafeLoader)  # noqa: S506 - SafeLoader subclass
    except SpecError:
        raise
    except (ValueError, yaml.YAMLError, RecursionError) as exc:
        kind = "JSON" if fmt == "json" else "YAML/JSON"
        raise SpecError(f"the spec is not valid {kind}: {str(exc).splitlines()[0]}") from None
    return spec_from_mapping(document)


def json_schema() -> dict[str, Any]:
    """The JSON Schema of a job spec, as a submitter writes it."""
    return JobSpec.model_json_schema(by_alias=True)
