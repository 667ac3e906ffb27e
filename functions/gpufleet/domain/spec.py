"""The job specification: what a submitter asks gpufleet to run.

A spec arrives as YAML or JSON (an S3 object, an EventBridge event's detail, or the CLI). It is
validated here and nowhere else; everything downstream works with a `JobSpec` it can trust.
"""

from __future__ import annotations

import json
import math
import re
from enum import StrEnum
from typing import Annotated, Any, Literal

import yaml
from pydantic import (
    AfterValidator,
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


def _no_nul(value: str) -> str:
    # argv and the environment reach a process as NUL-terminated strings: a NUL cannot be
    # passed on, and the node agent's exec would fail on it.
    if "\x00" in value:
        raise ValueError("a NUL byte cannot be passed to a process")
    return value


Arg = Annotated[str, StringConstraints(max_length=8192), AfterValidator(_no_nul)]
EnvValue = Annotated[str, StringConstraints(max_length=8192), AfterValidator(_no_nul)]


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
    if not math.isfinite(seconds):
        raise ValueError("a duration must be a finite number")
    if seconds <= 0:
        raise ValueError("a duration must be positive")
    return round(seconds)


class _Strict(BaseModel):
    # No infinities or NaN in any number: nothing downstream (prices, alarms) can use them.
    model_config = ConfigDict(
        extra="forbid", frozen=True, str_strip_whitespace=False, allow_inf_nan=False
    )


class Elastic(_Strict):
    """An elastic job runs on `min_nodes` to `max_nodes` nodes: busy GPUs (or its own `scale_on`
    metric) add nodes, idle ones remove them; each change is a checkpoint and a resume on the
    new shape (docs/fleet.md, "Elastic jobs")."""

    min_nodes: int = Field(default=1, ge=1, le=64, description="Fewest nodes it scales in to")
    max_nodes: int = Field(ge=2, le=64, description="Most nodes it scales out to")

    @model_validator(mode="after")
    def _a_range(self) -> Elastic:
        if self.min_nodes >= self.max_nodes:
            raise ValueError("min_nodes must be below max_nodes")
        return self


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
    elastic: Elastic | None = Field(
        default=None, description="Scale between min_nodes and max_nodes (nodes is the start)"
    )

    @property
    def total_gpus(self) -> int:
        return self.gpus * self.nodes

    @model_validator(mode="after")
    def _multi_node_needs_gpus(self) -> Resources:
        # Here rather than on JobSpec so resource templates in the config are held to it too.
        if self.nodes > 1 and self.gpus == 0:
            raise ValueError("multi-node jobs need GPUs on every node (resources.gpus >= 1)")
        return self

    @model_validator(mode="after")
    def _nodes_within_elastic_range(self) -> Resources:
        elastic = self.elastic
        if elastic is None:
            return self
        if self.gpus == 0:
            raise ValueError("elastic jobs scale GPU nodes (resources.gpus >= 1)")
        if not elastic.min_nodes <= self.nodes <= elastic.max_nodes:
            raise ValueError("nodes must lie within elastic.min_nodes and elastic.max_nodes")
        return self


# A metric the job's own code publishes through the node agent (docs/fleet.md).
JobMetricName = Annotated[str, StringConstraints(pattern=r"^[A-Za-z][A-Za-z0-9_.-]{0,62}$")]


class ScaleOn(_Strict):
    """Scale an elastic job out when a metric its code publishes stays below (or above) a
    threshold, e.g. `{metric: samples_per_second, below: 1000, for_minutes: 10}`."""

    metric: JobMetricName
    below: float | None = None
    above: float | None = None
    for_minutes: float = Field(default=10, gt=0, le=1440, description="How long it must hold")

    @model_validator(mode="after")
    def _one_threshold(self) -> ScaleOn:
        if (self.below is None) == (self.above is None):
            raise ValueError("give exactly one of below and above")
        return self


def _refuse_shell_string(value: Any) -> Any:
    if isinstance(value, str):
        raise ValueError(
            "command is an argv list, e.g. ['python', 'train.py']; a shell string is refused"
        )
    return value


def _duration_or_none(value: Any) -> Any:
    return None if value is None else parse_duration(value)


MAX_STAGES = 10


class Stage(_Strict):
    """One step of a multi-stage job (docs/stages.md). Every field but `name` is optional: what
    a stage leaves out, it takes from the job (its `resources` and `command`, ...)."""

    name: Name
    template: Name | None = Field(
        default=None, description="A resource template; `resources` overrides its fields"
    )
    resources: Resources | None = Field(
        default=None,
        description="Overrides of the stage's template, or of the job's resources without one. "
        "The stored job holds the resolved resources",
    )
    image: ImageRef | None = None
    command: list[Arg] | None = Field(
        default=None, min_length=1, max_length=1024, description="argv list, as the job's"
    )
    env: dict[EnvName, EnvValue] = Field(
        default_factory=dict, max_length=256, description="Laid over the job's environment"
    )
    max_retries: int | None = Field(default=None, ge=0, le=20)
    retry_exit_codes: list[Annotated[int, Field(ge=1, le=255)]] | None = Field(
        default=None, max_length=64
    )
    timeout_seconds: int | None = Field(default=None, alias="timeout", ge=60, le=14 * 86400)
    expected_duration_seconds: int | None = Field(
        default=None, alias="expected_duration", ge=1, le=14 * 86400
    )
    reuse_previous: bool = Field(
        default=False,
        description="Run on the previous stage's instances when they fit, instead of new ones",
    )

    model_config = ConfigDict(extra="forbid", frozen=True, populate_by_name=True)

    _argv_not_shell = field_validator("command", mode="before")(_refuse_shell_string)
    _duration = field_validator("timeout_seconds", "expected_duration_seconds", mode="before")(
        _duration_or_none
    )


# The fields of a stage that replace the job's in `JobSpec.for_stage` (env is merged instead).
_STAGE_OVERRIDES = (
    "resources",
    "image",
    "command",
    "max_retries",
    "retry_exit_codes",
    "timeout_seconds",
    "expected_duration_seconds",
)


class JobSpec(_Strict):
    """A training job as submitted."""

    name: Name
    team: Name
    priority: Priority = Priority.NORMAL
    image: ImageRef
    command: list[Arg] = Field(
        min_length=1, max_length=1024, description="argv list; never run through a shell"
    )
    env: dict[EnvName, EnvValue] = Field(default_factory=dict, max_length=256)
    resources: Resources = Field(default_factory=Resources)
    template: Name | None = Field(
        default=None,
        description="A resource template of the fleet config (gpufleet templates); the fields "
        "`resources` names override the template's. The stored job holds the resolved resources",
    )
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
    on_budget: Literal["checkpoint", "stop"] = Field(
        default="checkpoint",
        description="When the job's cost reaches budget_usd: checkpoint then stop, or stop now",
    )
    scale_on: ScaleOn | None = Field(
        default=None, description="A metric of the job's own that scales it out (elastic jobs)"
    )
    stages: list[Stage] = Field(
        default_factory=list,
        max_length=MAX_STAGES,
        description="Steps run in order, each on its own instances (docs/stages.md); the job's "
        "fields are the defaults of every stage",
    )

    model_config = ConfigDict(extra="forbid", frozen=True, populate_by_name=True)

    @field_validator("command", mode="before")
    @classmethod
    def _argv_not_shell(cls, value: Any) -> Any:
        return _refuse_shell_string(value)

    @field_validator("timeout_seconds", "expected_duration_seconds", mode="before")
    @classmethod
    def _duration(cls, value: Any) -> Any:
        return _duration_or_none(value)

    @field_validator("stages")
    @classmethod
    def _stages_are_consistent(cls, stages: list[Stage]) -> list[Stage]:
        names = [stage.name for stage in stages]
        if len(set(names)) != len(names):
            raise ValueError("stage names must be unique")
        if stages and stages[0].reuse_previous:
            raise ValueError("the first stage has no previous stage to reuse")
        return stages

    @model_validator(mode="after")
    def _scale_on_needs_elastic(self) -> JobSpec:
        # Not with a template: the elastic range may be the template's. A job that ends up
        # without one gets no scale_on alarm.
        if self.scale_on and self.resources.elastic is None and self.template is None:
            raise ValueError("scale_on scales elastic jobs: give resources.elastic")
        return self

    def to_document(self) -> dict[str, Any]:
        """The canonical JSON-ready form, with the same field names a submitter writes."""
        return self.model_dump(mode="json", by_alias=True, exclude_none=True)

    def for_stage(self, index: int) -> JobSpec:
        """What stage `index` runs: this spec with the fields the stage gives in place of the
        job's, and the stage's environment laid over the job's."""
        stage = self.stages[index]
        changes: dict[str, Any] = {"env": {**self.env, **stage.env}}
        for name in _STAGE_OVERRIDES:
            value = getattr(stage, name)
            if value is not None:
                changes[name] = value
        return self.model_copy(update=changes)


class FieldError(BaseModel):
    field: str
    message: str


# A refusal lists this many problems at most (and says how many there were): its report goes
# into an EventBridge event, which holds 256 KB, and a hostile spec can have thousands.
MAX_REPORTED_FIELDS = 50
MAX_FIELD_PATH = 200


class SpecError(Exception):
    """A submitted spec was refused. Carries the problems found, by field."""

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
    if len(path) > MAX_FIELD_PATH:  # a hostile key can be as long as the document
        path = path[: MAX_FIELD_PATH - 3] + "..."
    return path or "(document)"


def spec_from_mapping(document: object) -> JobSpec:
    """Validate an already-parsed document; raise SpecError naming every bad field."""
    if not isinstance(document, dict):
        raise SpecError("a job spec is a mapping (YAML or JSON object)")
    try:
        return JobSpec.model_validate(document)
    except ValidationError as exc:
        errors = exc.errors(include_url=False, include_input=False)
        fields = [
            FieldError(field=_field_path(tuple(err["loc"])), message=str(err["msg"]))
            for err in errors[:MAX_REPORTED_FIELDS]
        ]
        message = f"{len(errors)} invalid field(s) in the job spec"
        if len(errors) > len(fields):
            message += f"; the first {len(fields)} are listed"
        raise SpecError(message, fields) from None


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
