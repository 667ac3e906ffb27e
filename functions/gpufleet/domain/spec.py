"""The job specification: what a submitter asks gpufleet to run.

A spec arrives as YAML or JSON (an S3 object, an EventBridge event's detail, or the CLI). It is
validated here and nowhere else; everything downstream works with a `JobSpec` it can trust.

Parsing is as strict as the schema: a spec means one thing wherever it is read. YAML is read as
a notation of JSON (strings, decimal numbers, `true`/`false`, `null`, lists, mappings with
string keys, no duplicate keys, no aliases, merge keys or other tags), so that a YAML spec and
the JSON it is stored as are the same document; a number is never taken from a string, a count
never from a fraction or a boolean.
"""

from __future__ import annotations

import itertools
import json
import math
import re
from collections.abc import Sequence
from decimal import Decimal
from enum import StrEnum
from typing import Annotated, Any, Literal

from pydantic import (
    AfterValidator,
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    Strict,
    StringConstraints,
    ValidationError,
    ValidationInfo,
    WithJsonSchema,
    field_validator,
    model_validator,
)

from gpufleet.errors import RefusedInput

# A job's expected run time when neither its spec nor its team's history says: one hour, the
# unit prices are quoted in (`domain.duration`, and the queue's view of a job without one).
DEFAULT_EXPECTED_SECONDS = 3600

# Upper bound on a spec document, as uploaded and as stored (its canonical JSON, which can be
# longer than the YAML it came from). Real specs are a few KiB; anything near this is abuse.
MAX_SPEC_BYTES = 256 * 1024
# Environment variables of one run: the job's, or a stage's laid over the job's.
MAX_ENV = 256
# A run's wall-clock limit, and the longest expected duration a spec may state.
MAX_RUN_SECONDS = 14 * 86400
MAX_NODES = 64  # of one job

_DURATION_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400}
# A number of seconds, or of minutes, hours or days (the JSON Schema states the same pattern).
DURATION_PATTERN = r"^([0-9]{1,9}(?:\.[0-9]{1,6})?)([smhd]?)$"
_DURATION_RE = re.compile(DURATION_PATTERN)
_DURATION_FORM = "a duration is a whole number of seconds or a string like '90m', '4h', '1.5d'"

# Scalars are taken as they are written: no "3" for 3, no 1.0 or true for a count.
Count = Annotated[int, Strict()]
Number = Annotated[float, Strict()]  # an integer is a number too
Flag = Annotated[bool, Strict()]

# A name (of a job, a team, a template): also an S3 key's folder and an event source's last part.
NAME_PATTERN = r"[a-z0-9][a-z0-9._-]{0,62}"
Name = Annotated[str, Strict(), StringConstraints(pattern=f"^{NAME_PATTERN}$")]
EnvName = Annotated[str, Strict(), StringConstraints(pattern=r"^[A-Za-z_][A-Za-z0-9_]{0,127}$")]
# An OCI image reference: registry/repo[:tag][@digest]; no whitespace, no shell syntax.
ImageRef = Annotated[
    str,
    Strict(),
    StringConstraints(pattern=r"^[A-Za-z0-9][A-Za-z0-9._/:@+-]{0,511}$"),
]
ExitCode = Annotated[int, Strict(), Field(ge=1, le=255)]
GpuModel = Annotated[str, Strict(), StringConstraints(pattern=r"^[A-Za-z0-9 ._-]{1,40}$")]
# No whitespace or control characters: the URI is printed and passed on as it is.
CheckpointUri = Annotated[
    str,
    Strict(),
    StringConstraints(pattern=r"^s3://[a-z0-9][a-z0-9.-]{1,61}[a-z0-9](/[^\s\x00-\x1f\x7f]*)?$"),
]


def _no_nul(value: str) -> str:
    # argv and the environment reach a process as NUL-terminated strings: a NUL cannot be
    # passed on, and the node agent's exec would fail on it.
    if "\x00" in value:
        raise ValueError("a NUL byte cannot be passed to a process")
    return value


def _one_line(value: str) -> str:
    # The node hands the environment to docker as an env file, one NAME=value a line: a line
    # break cannot reach the container (the agent would fail the run on it).
    if "\n" in value or "\r" in value:
        raise ValueError("an environment value is one line (no line break)")
    return value


Arg = Annotated[str, Strict(), StringConstraints(max_length=8192), AfterValidator(_no_nul)]
EnvValue = Annotated[
    str,
    Strict(),
    StringConstraints(max_length=8192),
    AfterValidator(_no_nul),
    AfterValidator(_one_line),
]


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
    """Seconds from `3600`, `"90m"`, `"4h"`, `"1.5d"`; raise ValueError otherwise.

    Exact (decimal) arithmetic: a number too large for a float is a duration too long, not a
    crash, and `"0.5s"` is refused rather than rounded to nothing."""
    if isinstance(value, bool) or not isinstance(value, int | float | str):
        raise ValueError(_DURATION_FORM)
    if isinstance(value, str):
        match = _DURATION_RE.fullmatch(value)
        if match is None:
            raise ValueError(_DURATION_FORM)
        number, unit = match.groups()
        seconds = Decimal(number) * _DURATION_UNITS[unit or "s"]
    elif isinstance(value, float) and not math.isfinite(value):
        raise ValueError("a duration must be a finite number")
    else:
        seconds = Decimal(value)
    if seconds != seconds.to_integral_value():
        raise ValueError(_DURATION_FORM)
    if seconds <= 0:
        raise ValueError("a duration must be positive")
    return int(seconds)


def _duration_schema(minimum: int) -> WithJsonSchema:
    return WithJsonSchema(
        {
            "anyOf": [
                {"type": "integer", "minimum": minimum, "maximum": MAX_RUN_SECONDS},
                {"type": "string", "pattern": DURATION_PATTERN},
            ]
        }
    )


# Seconds, or a number with a unit (s, m, h, d); stored as whole seconds.
RunTimeout = Annotated[
    int,
    BeforeValidator(parse_duration),
    Field(ge=60, le=MAX_RUN_SECONDS),
    _duration_schema(60),
]
ExpectedDuration = Annotated[
    int,
    BeforeValidator(parse_duration),
    Field(ge=1, le=MAX_RUN_SECONDS),
    _duration_schema(1),
]
CheckpointInterval = Annotated[
    int,
    BeforeValidator(parse_duration),
    Field(ge=60, le=MAX_RUN_SECONDS),
    _duration_schema(60),
]


# An SNS topic a job's status changes go to (domain/notify.py holds it to its team's).
SNS_TOPIC_ARN_PATTERN = r"^arn:aws[a-z-]*:sns:[a-z0-9-]+:[0-9]{12}:[A-Za-z0-9_-]{1,256}$"


def _a_topic(value: Any) -> Any:
    if isinstance(value, str) and not re.fullmatch(SNS_TOPIC_ARN_PATTERN, value):
        if "@" in value:
            raise ValueError(
                "e-mail addresses are subscribed in gpufleet.yaml (teams.<team>.notify), "
                "never in a spec: name one of the team's SNS topics"
            )
        raise ValueError("notify is an SNS topic ARN: arn:aws:sns:REGION:ACCOUNT:NAME")
    return value


NotifyTopic = Annotated[
    str,
    Strict(),
    AfterValidator(_a_topic),
    WithJsonSchema({"type": "string", "pattern": SNS_TOPIC_ARN_PATTERN}),
]


def canonical_json(value: Any) -> str:
    """JSON text of `value` as the job store keeps a spec: sorted keys, no spaces, UTF-8
    characters as they are (escaped, a non-ASCII character would cost up to six times its
    bytes)."""
    return json.dumps(value, sort_keys=True, ensure_ascii=False, separators=(",", ":"))


class _Strict(BaseModel):
    # No infinities or NaN in any number: nothing downstream (prices, alarms) can use them.
    model_config = ConfigDict(
        extra="forbid", frozen=True, str_strip_whitespace=False, allow_inf_nan=False
    )


# The names AWS gives file systems: EFS ids are fs- and 8 or 17 hex digits, FSx ids fs- and 17.
FILE_SYSTEM_ID_PATTERN = r"^fs-[0-9a-f]{8,17}$"
FileSystemId = Annotated[str, Strict(), StringConstraints(pattern=FILE_SYSTEM_ID_PATTERN)]
# A container path a volume is mounted at: absolute, no `.`/`..` steps, no doubled or trailing
# slash, and no `:` (docker's --volume separator) or other character a path rarely needs.
_MOUNT_PATH = re.compile(r"^(/[A-Za-z0-9_@+-][A-Za-z0-9._@+-]{0,127}){1,16}$")
# The container's own system directories: a volume over (or above) one breaks the image.
RESERVED_MOUNT_PATHS = (
    "/bin", "/boot", "/dev", "/etc", "/lib", "/lib32", "/lib64", "/libx32", "/proc", "/run",
    "/sbin", "/sys", "/usr", "/var/run", "/var/lib/docker",
)  # fmt: skip
# Characters S3 documents as safe in an object key (and so in a prefix a URI names).
_S3_PREFIX = re.compile(r"^[A-Za-z0-9!_.*'()/-]{0,1000}$")
_S3_BUCKET = re.compile(r"^[a-z0-9][a-z0-9.-]{1,61}[a-z0-9]$")
_S3_RESERVED_BUCKET_PREFIXES = ("xn--", "sthree-", "amzn-s3-demo-")
_S3_RESERVED_BUCKET_SUFFIXES = ("-s3alias", "--ol-s3", ".mrap", "--x-s3", "--table-s3")


def bucket_name_problem(name: str) -> str | None:
    """Why `name` is no S3 general purpose bucket name (S3's naming rules), or None."""
    if not _S3_BUCKET.fullmatch(name):
        return (
            "a bucket name is 3 to 63 lowercase letters, digits, dots and hyphens, and begins "
            "and ends with a letter or digit"
        )
    if ".." in name:
        return "a bucket name has no two adjacent dots"
    if re.fullmatch(r"[0-9]{1,3}(\.[0-9]{1,3}){3}", name):
        return "a bucket name is not an IP address"
    if name.startswith(_S3_RESERVED_BUCKET_PREFIXES) or name.endswith(_S3_RESERVED_BUCKET_SUFFIXES):
        return "a bucket name does not take a prefix or suffix S3 reserves"
    return None


def split_s3_uri(uri: str) -> tuple[str, str]:
    """`s3://bucket/some/prefix` -> ("bucket", "some/prefix/"): the prefix as Mountpoint for
    Amazon S3 takes it (empty, or ending in `/`). Raises ValueError naming what is wrong."""
    if not uri.startswith("s3://"):
        raise ValueError("an S3 location is s3://bucket or s3://bucket/prefix")
    bucket, _, prefix = uri[len("s3://") :].partition("/")
    problem = bucket_name_problem(bucket)
    if problem is not None:
        raise ValueError(f"{bucket!r}: {problem}")
    if not _S3_PREFIX.fullmatch(prefix) or "//" in prefix or prefix.startswith("/"):
        raise ValueError("an S3 prefix is made of letters, digits, / and !_.*'()- (no empty step)")
    return bucket, prefix if not prefix or prefix.endswith("/") else prefix + "/"


def _mount_path(value: str) -> str:
    if not _MOUNT_PATH.fullmatch(value) or any(step in (".", "..") for step in value.split("/")):
        raise ValueError(
            "mount is an absolute container path, e.g. /data: steps of letters, digits and "
            "._@+- (no '.' or '..', no doubled or trailing slash, no ':')"
        )
    for reserved in RESERVED_MOUNT_PATHS:
        if _within(value, reserved) or _within(reserved, value):
            raise ValueError(f"a volume cannot be mounted over the container's {reserved}")
    return value


def _within(path: str, directory: str) -> bool:
    return path == directory or path.startswith(directory + "/")


MountPath = Annotated[str, Strict(), AfterValidator(_mount_path)]


class VolumeKind(StrEnum):
    FSX_LUSTRE = "fsx_lustre"  # an existing FSx for Lustre file system
    EFS = "efs"  # an existing EFS file system
    INSTANCE_STORE = "instance_store"  # the instance's NVMe instance-store disks, as scratch
    S3 = "s3"  # an S3 prefix, read-only through Mountpoint for Amazon S3


class Volume(_Strict):
    """Storage mounted into the container at `mount`: give exactly one of `fsx_lustre`, `efs`
    (a file system id configured in gpufleet.yaml), `instance_store: scratch` (the instance's
    NVMe disks, striped when there are several) or `s3` (an s3:// prefix configured in
    gpufleet.yaml, read-only). docs/data.md."""

    fsx_lustre: FileSystemId | None = Field(default=None, description="An FSx for Lustre id")
    efs: FileSystemId | None = Field(default=None, description="An EFS file system id")
    instance_store: Literal["scratch"] | None = Field(
        default=None, description="The instance's NVMe instance-store disks, as scratch space"
    )
    s3: Annotated[str, Strict(), StringConstraints(max_length=1100)] | None = Field(
        default=None, description="s3://bucket/prefix, mounted read-only"
    )
    mount: MountPath = Field(description="Absolute path in the container")
    read_only: Flag | None = Field(
        default=None, description="Mounted read-only; S3 volumes always are"
    )

    @field_validator("s3")
    @classmethod
    def _s3_uri(cls, value: str | None) -> str | None:
        if value is not None:
            split_s3_uri(value)
        return value

    @model_validator(mode="after")
    def _one_source(self) -> Volume:
        given = [kind for kind in VolumeKind if getattr(self, kind.value) is not None]
        if len(given) != 1:
            raise ValueError("a volume names exactly one of fsx_lustre, efs, instance_store, s3")
        if self.kind is VolumeKind.S3 and self.read_only is False:
            raise ValueError("an S3 volume is read-only (Mountpoint for Amazon S3 --read-only)")
        if self.kind is VolumeKind.INSTANCE_STORE and self.read_only:
            raise ValueError("instance-store scratch is written to: it cannot be read-only")
        return self

    @property
    def kind(self) -> VolumeKind:
        return next(kind for kind in VolumeKind if getattr(self, kind.value) is not None)

    @property
    def source(self) -> str:
        """The file system id, `scratch`, or the s3:// URI."""
        return str(getattr(self, self.kind.value))

    @property
    def is_read_only(self) -> bool:
        return self.kind is VolumeKind.S3 or bool(self.read_only)


MAX_VOLUMES = 16
MAX_SECRETS = 64
# Secrets Manager names: 1-512 of letters, digits and /_+=.@-.
_SECRET_NAME = r"[A-Za-z0-9/_+=.@-]{1,512}"  # noqa: S105 - a pattern, no password
_SECRET_ARN = r"arn:aws[a-z-]*:secretsmanager:[a-z0-9-]+:[0-9]{12}:secret:" + _SECRET_NAME
# SSM Parameter Store names in a hierarchy: /path/to/name, letters, digits and _.-/.
_PARAMETER_NAME = r"/[A-Za-z0-9_.-]+(?:/[A-Za-z0-9_.-]+)*"
SECRET_REFERENCE_PATTERN = (
    f"^(?:secretsmanager:(?:{_SECRET_ARN}|{_SECRET_NAME})|{_SECRET_ARN}|ssm:{_PARAMETER_NAME})$"
)
# Where a secret's value is read on the node: Secrets Manager (`secretsmanager:NAME`, or its
# ARN) or SSM Parameter Store (`ssm:/path/name`). Only the reference is ever stored.
SecretReference = Annotated[
    str,
    Strict(),
    StringConstraints(pattern=SECRET_REFERENCE_PATTERN, max_length=2048),
]
# A Secrets Manager secret by name or ARN, holding {"username": ..., "password": ...}.
RegistryCredentials = Annotated[
    str,
    Strict(),
    StringConstraints(pattern=f"^(?:{_SECRET_ARN}|{_SECRET_NAME})$"),
]


class Elastic(_Strict):
    """An elastic job runs on `min_nodes` to `max_nodes` nodes: busy GPUs (or its own `scale_on`
    metric) add nodes, idle ones remove them; each change is a checkpoint and a resume on the
    new shape (docs/fleet.md, "Elastic jobs")."""

    min_nodes: Count = Field(
        default=1, ge=1, le=MAX_NODES, description="Fewest nodes it scales in to"
    )
    max_nodes: Count = Field(ge=2, le=MAX_NODES, description="Most nodes it scales out to")

    @model_validator(mode="after")
    def _a_range(self) -> Elastic:
        if self.min_nodes >= self.max_nodes:
            raise ValueError("min_nodes must be below max_nodes")
        return self


class Resources(_Strict):
    """What one node of the job needs. `nodes` > 1 asks for that many identical nodes."""

    gpus: Count = Field(default=1, ge=0, le=16, description="GPUs per node")
    gpu_memory_gib: Number = Field(
        default=0, ge=0, le=1024, description="Minimum memory per GPU, GiB"
    )
    gpu_models: list[GpuModel] = Field(
        default_factory=list,
        max_length=32,
        description="Allowed GPU models (e.g. A100, H100); empty allows any",
    )
    vcpus: Count = Field(default=1, ge=1, le=1024, description="Minimum vCPUs per node")
    memory_gib: Number = Field(default=1, gt=0, le=32768, description="Minimum RAM per node, GiB")
    nodes: Count = Field(default=1, ge=1, le=MAX_NODES, description="Number of nodes")
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
JobMetricName = Annotated[
    str, Strict(), StringConstraints(pattern=r"^[A-Za-z][A-Za-z0-9_.-]{0,62}$")
]


class ScaleOn(_Strict):
    """Scale an elastic job out when a metric its code publishes stays below (or above) a
    threshold, e.g. `{metric: samples_per_second, below: 1000, for_minutes: 10}`."""

    metric: JobMetricName
    below: Number | None = None
    above: Number | None = None
    for_minutes: Number = Field(default=10, gt=0, le=1440, description="How long it must hold")

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
        default_factory=dict,
        max_length=MAX_ENV,
        description=f"Laid over the job's environment; together at most {MAX_ENV} variables",
    )
    max_retries: Count | None = Field(default=None, ge=0, le=20)
    retry_exit_codes: list[ExitCode] | None = Field(default=None, max_length=64)
    timeout_seconds: RunTimeout | None = Field(default=None, alias="timeout")
    expected_duration_seconds: ExpectedDuration | None = Field(
        default=None, alias="expected_duration"
    )
    reuse_previous: Flag = Field(
        default=False,
        description="Run on the previous stage's instances when they fit, instead of new ones",
    )

    model_config = ConfigDict(extra="forbid", frozen=True, populate_by_name=True)

    _argv_not_shell = field_validator("command", mode="before")(_refuse_shell_string)


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


MAX_ARRAY_SIZE = 10_000  # AWS Batch's limit of an array job's children
# AWS Batch: "A job can depend upon a maximum of 20 jobs" (SubmitJob, dependsOn).
MAX_DEPENDENCIES = 20
ARRAY_INDEX_ENV = "GPUFLEET_ARRAY_INDEX"
# The name AWS Batch gives a child its index: a program written for Batch runs unchanged.
BATCH_ARRAY_INDEX_ENV = "AWS_BATCH_JOB_ARRAY_INDEX"
INDEX_ENV_NAMES = (ARRAY_INDEX_ENV, BATCH_ARRAY_INDEX_ENV)

# A value as written: 32 stays the integer 32 (the child reads "32", never "32.0"); a string
# becomes an environment value, so it is one (one line, no NUL).
SweepValue = (
    Annotated[
        str,
        Strict(),
        StringConstraints(max_length=1024),
        AfterValidator(_no_nul),
        AfterValidator(_one_line),
    ]
    | Count
    | Number
    | Flag
)


class ArraySize(_Strict):
    """`array: {size: N}`: N children of one spec, told apart by their index (docs/arrays.md)."""

    size: Count = Field(ge=1, le=MAX_ARRAY_SIZE)


class Sweep(_Strict):
    """The parameter values of an array's children, each child one point (docs/arrays.md):
    `grid` (every combination of each parameter's values) or `points` (one mapping a child).
    Each child gets its point's values as environment variables of the parameters' names."""

    grid: dict[EnvName, list[SweepValue]] | None = Field(default=None, min_length=1)
    points: list[dict[EnvName, SweepValue]] | None = Field(
        default=None, min_length=1, max_length=MAX_ARRAY_SIZE
    )

    @model_validator(mode="after")
    def _one_form(self) -> Sweep:
        if (self.grid is None) == (self.points is None):
            raise ValueError("a sweep is either a grid or a list of points")
        if self.grid is not None:
            empty = sorted(name for name, values in self.grid.items() if not values)
            if empty:
                raise ValueError(f"parameter {empty[0]} has no values")
            if self.size > MAX_ARRAY_SIZE:
                raise ValueError(f"the grid makes {self.size} runs; the limit is {MAX_ARRAY_SIZE}")
        if self.points is not None:
            names = set(self.points[0])
            if not names:
                raise ValueError("a point names at least one parameter")
            for index, point in enumerate(self.points):
                if set(point) != names:
                    raise ValueError(f"point {index} does not name the parameters point 0 names")
        return self

    @property
    def parameters(self) -> list[str]:
        return sorted(self.grid if self.grid is not None else (self.points or [{}])[0])

    @property
    def size(self) -> int:
        if self.grid is not None:
            return math.prod(len(values) for values in self.grid.values())
        return len(self.points or ())

    def point(self, index: int) -> dict[str, SweepValue]:
        """Child `index`'s values: grid points in row-major order of the sorted parameter
        names (the last name varies fastest)."""
        if self.points is not None:
            return dict(self.points[index])
        grid = self.grid or {}
        values: dict[str, SweepValue] = {}
        for name in reversed(self.parameters):
            index, at = divmod(index, len(grid[name]))
            values[name] = grid[name][at]
        return dict(sorted(values.items()))


class DependencyMode(StrEnum):
    ALL = "all"  # after every child of the dependency (or the job itself)
    ELEMENT = "element"  # child i after the dependency's child i (Slurm's aftercorr)


DependencyEnd = Literal["success", "any"]
DEPENDENCY_ENDS: tuple[DependencyEnd, ...] = ("success", "any")


class Dependency(_Strict):
    """A job this one waits for: a job id, or the name of a job of the same submission."""

    job: Annotated[str, Strict(), StringConstraints(pattern=f"^{NAME_PATTERN}$")]
    on: DependencyEnd = Field(
        default="success",
        description="success: run only if the dependency succeeded, else end CANCELLED; "
        "any: run once the dependency ended, however it ended",
    )
    mode: DependencyMode = Field(
        default=DependencyMode.ALL,
        description="element: each child of this array waits for the same index of the "
        "dependency's array (both arrays of one size)",
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
    env: dict[EnvName, EnvValue] = Field(default_factory=dict, max_length=MAX_ENV)
    secrets: dict[EnvName, SecretReference] = Field(
        default_factory=dict,
        max_length=MAX_SECRETS,
        description="Environment variables read on the node at start from Secrets Manager "
        "('secretsmanager:NAME' or an ARN) or SSM Parameter Store ('ssm:/path'), under the "
        "deployment's secrets_prefix; only the names are stored, never the values",
    )
    registry_credentials: RegistryCredentials | None = Field(
        default=None,
        description="A Secrets Manager secret {username, password} the node logs in to the "
        "image's registry with (not for ECR: the node's role logs in there)",
    )
    volumes: list[Volume] = Field(
        default_factory=list,
        max_length=MAX_VOLUMES,
        description="Storage mounted into the container (docs/data.md): FSx for Lustre, EFS, "
        "the instance's NVMe disks, an S3 prefix read-only",
    )
    resources: Resources = Field(default_factory=Resources)
    template: Name | None = Field(
        default=None,
        description="A resource template of the fleet config (gpufleet templates); the fields "
        "`resources` names override the template's. The stored job holds the resolved resources",
    )
    spot: SpotPolicy = SpotPolicy.AUTO
    checkpoint: CheckpointUri | None = Field(
        default=None, description="S3 URI where the job writes and reads checkpoints"
    )
    checkpoint_interval_seconds: CheckpointInterval | None = Field(
        default=None,
        alias="checkpoint_interval",
        description="How often the job writes a checkpoint ('30m'): the work a spot "
        "interruption costs it, which selection weighs. Needs `checkpoint`; none: as if it "
        "lost the whole run",
    )
    max_retries: Count = Field(
        default=3, ge=0, le=20, description="Retries of a failed run (exit code, lost node)"
    )
    retry_exit_codes: list[ExitCode] = Field(
        default_factory=list,
        max_length=64,
        description="Exit codes that are retried; empty: any non-zero exit code",
    )
    no_retry_exit_codes: list[ExitCode] = Field(
        default_factory=list,
        max_length=64,
        description="Exit codes never retried (e.g. bad arguments)",
    )
    on_idle: Literal["flag", "release"] = Field(
        default="flag",
        description="When the GPUs stay idle: flag the job, or checkpoint and release it",
    )
    retry_oom_with_more_memory: Flag = Field(
        default=True,
        description="Retry a run that ran out of GPU memory on GPUs with more memory",
    )
    timeout_seconds: RunTimeout = Field(
        default=86400,
        alias="timeout",
        description="Wall-clock limit of one run: seconds or '90m', '4h', '2d'",
    )
    expected_duration_seconds: ExpectedDuration | None = Field(
        default=None,
        alias="expected_duration",
        description="Expected run time, used for cost estimates and selection",
    )
    wait_for_block: Flag = Field(
        default=False,
        description="When no Capacity Block of the config it fits is active now but one "
        "starts later, wait in the queue for that one instead of running elsewhere now "
        "(docs/fleet.md)",
    )
    budget_usd: Number | None = Field(default=None, gt=0, le=10_000_000)
    on_budget: Literal["checkpoint", "stop"] = Field(
        default="checkpoint",
        description="When the job's cost reaches budget_usd: checkpoint then stop, or stop now",
    )
    scale_on: ScaleOn | None = Field(
        default=None, description="A metric of the job's own that scales it out (elastic jobs)"
    )
    array: ArraySize | None = Field(
        default=None, description=f"Run N children of this spec, 1 to {MAX_ARRAY_SIZE}"
    )
    sweep: Sweep | None = Field(
        default=None,
        description="Run one child per point of a parameter grid or list (docs/arrays.md); "
        "refused whole, with one error, when any part of it is wrong",
    )
    depends_on: list[Dependency] = Field(
        default_factory=list,
        max_length=MAX_DEPENDENCIES,
        description="Jobs this one waits for (docs/arrays.md); a job whose dependency failed "
        "ends CANCELLED and never runs",
    )
    notify: NotifyTopic | None = Field(
        default=None,
        description="An SNS topic of the team's (gpufleet.yaml teams.<team>.notify) the job's "
        "status changes go to instead of all the team's destinations (docs/notifications.md)",
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

    @field_validator("stages")
    @classmethod
    def _stages_are_consistent(cls, stages: list[Stage], info: ValidationInfo) -> list[Stage]:
        names = [stage.name for stage in stages]
        if len(set(names)) != len(names):
            raise ValueError("stage names must be unique")
        if stages and stages[0].reuse_previous:
            raise ValueError("the first stage has no previous stage to reuse")
        # A stage runs with its env laid over the job's (`for_stage`): the cap holds for that.
        job_env = info.data.get("env", {})
        for stage in stages:
            merged = len(job_env.keys() | stage.env.keys())
            if merged > MAX_ENV:
                raise ValueError(
                    f"stage {stage.name!r} runs with {merged} environment variables (its env "
                    f"laid over the job's); the limit is {MAX_ENV}"
                )
        return stages

    @field_validator("volumes")
    @classmethod
    def _mounts_apart(cls, volumes: list[Volume]) -> list[Volume]:
        # One path, one volume: a volume inside another's mount would hide or be hidden by it.
        mounts = sorted(volume.mount for volume in volumes)
        for outer, inner in itertools.pairwise(mounts):
            if _within(inner, outer):
                raise ValueError(f"volumes mounted at {outer} and {inner} overlap")
        if sum(volume.kind is VolumeKind.INSTANCE_STORE for volume in volumes) > 1:
            raise ValueError("the instance store is one scratch volume: list it once")
        return volumes

    @model_validator(mode="after")
    def _secrets_apart_from_env(self) -> JobSpec:
        # A name in both would leave which value the container sees to chance.
        envs = [self.env, *(stage.env for stage in self.stages)]
        both = sorted({name for env in envs for name in env} & self.secrets.keys())
        if both:
            raise ValueError(f"{', '.join(both)} named in both env and secrets")
        return self

    @model_validator(mode="after")
    def _array_fits(self) -> JobSpec:
        if self.array is not None and self.sweep is not None:
            raise ValueError("a sweep sets the array's size: give array or sweep, not both")
        taken = {*self.env, *self.secrets, *INDEX_ENV_NAMES}
        if self.sweep is not None:
            clash = sorted(taken & set(self.sweep.parameters))
            if clash:
                raise ValueError(f"sweep parameter {clash[0]} is also an environment variable")
        if self.array is not None or self.sweep is not None:
            extra = len(INDEX_ENV_NAMES) + len(self.sweep.parameters if self.sweep else ())
            widest = max([len(self.env), *(len(self.env | s.env) for s in self.stages)])
            if widest + extra > MAX_ENV:
                raise ValueError(
                    f"a child runs with {widest + extra} environment variables (its index "
                    f"and sweep values with the env); the limit is {MAX_ENV}"
                )
        return self

    @property
    def size(self) -> int:
        """How many children the spec makes: 1 for a plain job."""
        if self.sweep is not None:
            return self.sweep.size
        return self.array.size if self.array is not None else 1

    @property
    def is_array(self) -> bool:
        return self.array is not None or self.sweep is not None

    @model_validator(mode="after")
    def _interval_needs_checkpoint(self) -> JobSpec:
        if self.checkpoint_interval_seconds is not None and self.checkpoint is None:
            raise ValueError("checkpoint_interval needs a checkpoint URI to write to")
        return self

    @model_validator(mode="after")
    def _scale_on_needs_elastic(self) -> JobSpec:
        # Not with a template: the elastic range may be the template's (`apply_template`
        # holds the resolved resources to this rule).
        if self.scale_on and self.resources.elastic is None and self.template is None:
            raise ValueError("scale_on scales elastic jobs: give resources.elastic")
        return self

    @property
    def needs_instance_store(self) -> bool:
        """Whether the job mounts the instance's NVMe instance-store disks (every stage does:
        volumes are the job's): only types that have them can run it."""
        return any(volume.kind is VolumeKind.INSTANCE_STORE for volume in self.volumes)

    def to_document(self) -> dict[str, Any]:
        """The canonical JSON-ready form, with the same field names a submitter writes."""
        return self.model_dump(mode="json", by_alias=True, exclude_none=True)

    def stored_form(self) -> str:
        """The canonical JSON text of the spec: what the job store keeps."""
        return canonical_json(self.to_document())

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


# A refusal's report goes into an S3 object, an EventBridge event (256 KiB an entry) and the
# idempotency record of its delivery (a DynamoDB item, 400 KB): its size is bounded whatever
# the spec holds. A hostile spec can have thousands of problems, keys as long as the document,
# and YAML errors that quote it.
MAX_REPORTED_FIELDS = 50
MAX_FIELD_PATH = 200
MAX_FIELD_MESSAGE = 500
MAX_MESSAGE = 1000
# The fields listed, as ASCII-escaped JSON (the largest form any store or event gives them).
MAX_FIELDS_BYTES = 32 * 1024


def _clipped(text: str, limit: int) -> str:
    return text if len(text) <= limit else text[: limit - 3] + "..."


class SpecError(RefusedInput):
    """A submitted spec was refused. Carries the problems found, by field: the first ones, as
    many as a bounded report holds (the message then says how many are listed)."""

    def __init__(self, message: str, fields: Sequence[FieldError] = ()) -> None:
        listed: list[FieldError] = []
        size = 0
        for problem in fields[:MAX_REPORTED_FIELDS]:
            clipped = FieldError(
                field=_clipped(problem.field, MAX_FIELD_PATH),
                message=_clipped(problem.message, MAX_FIELD_MESSAGE),
            )
            size += len(json.dumps(clipped.model_dump())) + 2
            if size > MAX_FIELDS_BYTES:
                break
            listed.append(clipped)
        if len(listed) < len(fields):
            message += f"; the first {len(listed)} are listed"
        self.message = _clipped(message, MAX_MESSAGE)
        self.fields = listed
        super().__init__(self.message)

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


ELEMENT_WITHOUT_ARRAY = "an element-by-element dependency is for an array"


def spec_from_mapping(document: object) -> JobSpec:
    """Validate an already-parsed document; raise SpecError naming every bad field.

    Only the field names a submitter writes are accepted (`timeout`, never `timeout_seconds`),
    and the spec must fit the job store once stored (`stored_form`)."""
    if not isinstance(document, dict):
        raise SpecError("a job spec is a mapping (YAML or JSON object)")
    try:
        spec = JobSpec.model_validate(document, by_alias=True, by_name=False)
    except ValidationError as exc:
        problems = _one_per_sweep(
            [
                FieldError(field=_field_path(tuple(e["loc"])), message=str(e["msg"]))
                for e in exc.errors(include_url=False, include_input=False)
            ]
        )
        raise SpecError(f"{len(problems)} invalid field(s) in the job spec", problems) from None
    # Checked where a spec is submitted, not in JobSpec: a child's stored spec has no array
    # but keeps its array's element-by-element dependency (`arrays.child_spec`).
    if spec.size == 1 and any(d.mode is DependencyMode.ELEMENT for d in spec.depends_on):
        raise SpecError(
            "1 invalid field(s) in the job spec",
            [FieldError(field="depends_on", message=ELEMENT_WITHOUT_ARRAY)],
        )
    stored = len(spec.stored_form().encode("utf-8"))
    if stored > MAX_SPEC_BYTES:
        raise SpecError(
            f"the spec is {stored} bytes as stored (canonical JSON); the limit is {MAX_SPEC_BYTES}",
            [_largest_field(spec)],
        )
    return spec


def _one_per_sweep(problems: list[FieldError]) -> list[FieldError]:
    """A bad sweep is refused whole, with one error: its first problem, and how many more."""

    def in_sweep(problem: FieldError) -> bool:
        return problem.field == "sweep" or problem.field.startswith(("sweep.", "sweep["))

    sweep = [p for p in problems if in_sweep(p)]
    if len(sweep) <= 1:
        return problems
    one = FieldError(
        field=sweep[0].field,
        message=f"{sweep[0].message} (and {len(sweep) - 1} more in the sweep)",
    )
    others = [p for p in problems if not in_sweep(p)]
    at = problems.index(sweep[0])
    return [*others[:at], one, *others[at:]]


def _largest_field(spec: JobSpec) -> FieldError:
    """The field that takes the most of a spec's stored form: the one to make smaller."""
    sizes = {
        name: len(canonical_json(value).encode("utf-8"))
        for name, value in spec.to_document().items()
    }
    largest = max(sizes, key=lambda name: sizes[name])
    return FieldError(field=largest, message=f"{sizes[largest]} bytes as stored")


def _object_without_duplicates(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    document: dict[str, Any] = {}
    for key, value in pairs:
        if key in document:
            raise SpecError(f"the spec is not valid JSON: the key {key!r} twice in one object")
        document[key] = value
    return document


def _no_constant(name: str) -> object:
    raise SpecError(f"the spec is not valid JSON: {name} is not a JSON number")


SpecFormat = Literal["yaml", "json", "auto"]


def format_for(key: str) -> SpecFormat:
    """How a spec named `key` is read: `.json` is JSON, anything else YAML or JSON (JSON when it
    starts with `{`). The CLI checks a file by the rule intake reads its upload with."""
    return "json" if key.endswith(".json") else "auto"


def syntax_error(exc: Exception) -> str:
    """What is wrong with a document, in one line: JSON's problem and where, or the first line
    of any other parser's message (spec_yaml words YAML's own)."""
    if isinstance(exc, json.JSONDecodeError):
        return f"{exc.msg} (line {exc.lineno}, column {exc.colno})"
    lines = str(exc).splitlines()
    return lines[0] if lines else type(exc).__name__


def _json(text: str) -> object:
    return json.loads(
        text, object_pairs_hook=_object_without_duplicates, parse_constant=_no_constant
    )


def _load(text: str, fmt: SpecFormat) -> object:
    """The document `text` holds. In "auto", a document that starts with `{` is read as JSON
    first (the fast parser), and as YAML when it is no JSON (a YAML flow mapping): both read
    JSON's data model the same way."""
    if fmt == "json":
        return _json(text)
    if fmt == "auto" and text.lstrip().startswith("{"):
        try:
            return _json(text)
        except json.JSONDecodeError:
            pass
    # The YAML reader (and PyYAML) is imported by the first YAML document: JSON specs, and the
    # functions that never read a spec, do without it.
    from gpufleet.domain.spec_yaml import load_yaml

    return load_yaml(text)


def parse_spec(raw: bytes | str, fmt: SpecFormat = "auto") -> JobSpec:
    """Parse and validate a YAML or JSON document into a JobSpec, or raise SpecError."""
    return spec_from_mapping(load_document(raw, fmt))


def load_document(raw: bytes | str, fmt: SpecFormat = "auto") -> object:
    """The document an upload holds, within the spec's size, as UTF-8 YAML or JSON; or
    SpecError."""
    data = raw.encode("utf-8", "surrogatepass") if isinstance(raw, str) else raw
    if len(data) > MAX_SPEC_BYTES:
        raise SpecError(f"the spec is {len(data)} bytes; the limit is {MAX_SPEC_BYTES}")
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise SpecError(f"the spec is not valid UTF-8 (byte {exc.start})") from None
    if not text.strip():
        raise SpecError("the spec is empty")
    try:
        document = _load(text, fmt)
    except SpecError:
        raise
    except (ValueError, RecursionError) as exc:
        kind = "JSON" if fmt == "json" else "YAML/JSON"
        raise SpecError(f"the spec is not valid {kind}: {syntax_error(exc)}") from None
    return document


SCHEMA_RULES = (
    f"A gpufleet job spec, as YAML or JSON, at most {MAX_SPEC_BYTES // 1024} KiB as uploaded "
    "and as stored "
    "(canonical JSON). YAML is read as a notation of JSON: plain true/false, null and decimal "
    "numbers are those values, anything else plain is a string; aliases, merge keys, "
    "duplicate keys, non-string keys and tags for other types are refused. Values are taken as "
    "written: no number from a string, no integer from a fraction or a boolean. A stage's env "
    f"laid over the job's holds at most {MAX_ENV} variables (with an array child's index "
    "and sweep values). A bad sweep is refused whole, as one error."
)


def json_schema() -> dict[str, Any]:
    """The JSON Schema of a job spec, as a submitter writes it."""
    schema = JobSpec.model_json_schema(by_alias=True)
    schema["description"] = SCHEMA_RULES
    return schema
