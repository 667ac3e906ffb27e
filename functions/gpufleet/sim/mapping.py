"""Trace job -> `JobSpec`: the documented, configurable rules the simulator replays with.

- Resources: a job of G GPUs needs `nodes = ceil(G / max_gpus_per_node)` nodes of
  `ceil(G / nodes)` GPUs each (balanced, so nodes x gpus-per-node >= G and never more than
  `max_gpus_per_node` per node: 12 GPUs -> 2 x 6, 24 -> 3 x 8, 128 -> 16 x 8). Each GPU needs
  `min_gpu_memory_gib` (default 16 GiB); arch `x86_64` (configurable). vCPU and RAM are left
  at the spec's minimums: the traces do not say what the original hosts had (openb's CPU and
  memory requests are on `TraceJob` for whoever wants them). A CPU-only openb pod (only with
  `include_cpu_only`) maps to a 1-node job with 0 GPUs.
- Team: the trace's team (Philly virtual cluster, ITP cluster), sanitised to the spec's name
  pattern `^[a-z0-9][a-z0-9._-]{0,62}$`; `default_team` when the trace has none (openb).
- Priority: openb's QoS class through `qos_priority` (default LS -> high, Guaranteed -> high,
  Burstable -> normal, BE -> low); otherwise (and for a QoS class not in the table) a
  deterministic hash of the job id (blake2b of `priority_salt + job_id`, as a fraction in
  [0, 1)) below `high_share` makes the job high priority, else normal. Same id, same salt:
  same priority, on every machine and Python version.
- Durations: `expected_duration` = the trace duration (the simulator knows it), rounded up and
  capped at the spec's 14-day maximum; `timeout` = `timeout_factor` x the duration, at least
  `min_timeout_seconds`, at most 14 days. A trace job longer than 14 days (Philly 79, ITP 4,
  openb 29 GPU pods) cannot be expressed exactly: the simulator should run the `TraceJob`'s duration
  and decide what its timeout means for such jobs.
- Spot policy `auto` (configurable); a checkpoint URI under `checkpoint_prefix` and the spec's
  `checkpoint_interval` when `checkpoint_interval_seconds` is set: plans rank offerings with
  it, as Launch does, and the simulated runs checkpoint that often
  (`gpufleet.sim.market.checkpointed_progress`).
"""

from __future__ import annotations

import hashlib
import math
import re
from functools import lru_cache
from typing import Annotated

from pydantic import BaseModel, ConfigDict, Field, StringConstraints

from gpufleet.domain.spec import Architecture, JobSpec, Priority, Resources, SpotPolicy
from gpufleet.sim.traces import TraceJob

MAX_SPEC_SECONDS = 14 * 86400  # JobSpec's limit for timeout and expected_duration
MAX_NODES = 64  # Resources.nodes limit

DEFAULT_QOS_PRIORITY: dict[str, Priority] = {
    "LS": Priority.HIGH,  # latency-sensitive
    "Guaranteed": Priority.HIGH,
    "Burstable": Priority.NORMAL,
    "BE": Priority.LOW,  # best-effort
}

_NAME_RE = re.compile(r"^[a-z0-9][a-z0-9._-]{0,62}$")
_BAD_CHARS = re.compile(r"[^a-z0-9._-]+")
_HASH_SCALE = float(2**64)


class TraceMapping(BaseModel):
    """How trace jobs become job specs. Every field has the default the CLI uses."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    region: str = Field(default="us-east-1", description="Region the simulated fleet runs in")
    min_gpu_memory_gib: float = Field(default=16, ge=0, le=1024)
    high_share: float = Field(
        default=0.1, ge=0, le=1, description="Share of jobs made high priority by the id hash"
    )
    priority_salt: str = Field(default="", max_length=64)
    qos_priority: dict[str, Priority] = Field(default_factory=lambda: dict(DEFAULT_QOS_PRIORITY))
    max_gpus_per_node: int = Field(default=8, ge=1, le=16)
    arch: Architecture = Architecture.X86_64
    spot: SpotPolicy = SpotPolicy.AUTO
    checkpoint_interval_seconds: int | None = Field(default=1800, ge=60)
    checkpoint_prefix: Annotated[
        str, StringConstraints(pattern=r"^s3://[a-z0-9][a-z0-9.-]{1,61}[a-z0-9](/[^\s]*)?$")
    ] = "s3://gpufleet-sim/checkpoints"
    default_team: Annotated[str, StringConstraints(pattern=_NAME_RE.pattern)] = "default"
    image: str = "public.ecr.aws/gpufleet/trace-replay:latest"
    command: tuple[str, ...] = Field(default=("replay",), min_length=1)
    max_retries: int = Field(default=3, ge=0, le=20)
    timeout_factor: float = Field(default=2.0, ge=1)
    min_timeout_seconds: int = Field(default=3600, ge=60, le=MAX_SPEC_SECONDS)


def sanitize_name(raw: str | None, default: str) -> str:
    """`raw` as a spec name (`^[a-z0-9][a-z0-9._-]{0,62}$`), or `default` if nothing is left.

    Lower-cased; runs of other characters become '-'; leading '.', '_', '-' dropped; cut to 63.
    """
    if raw is None:
        return default
    name = raw.lower()
    if _NAME_RE.match(name):
        return name
    name = _BAD_CHARS.sub("-", name).lstrip("._-")[:63]
    return name if name else default


def hash_fraction(job_id: str, salt: str = "") -> float:
    """A stable, uniform-looking number in [0, 1) for a job id."""
    digest = hashlib.blake2b(f"{salt}{job_id}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big") / _HASH_SCALE


def priority_for(job: TraceJob, mapping: TraceMapping) -> Priority:
    """The QoS mapping when the trace has a known QoS class, else the id-hash rule."""
    if job.qos is not None:
        mapped = mapping.qos_priority.get(job.qos)
        if mapped is not None:
            return mapped
    if mapping.high_share > 0 and hash_fraction(job.job_id, mapping.priority_salt) < (
        mapping.high_share
    ):
        return Priority.HIGH
    return Priority.NORMAL


def node_shape(gpus: int, max_gpus_per_node: int) -> tuple[int, int]:
    """(nodes, GPUs per node) for `gpus` GPUs in total, balanced across the fewest nodes."""
    if gpus < 0:
        raise ValueError("gpus must be >= 0")
    if gpus <= max_gpus_per_node:
        return 1, gpus
    nodes = math.ceil(gpus / max_gpus_per_node)
    if nodes > MAX_NODES:
        raise ValueError(
            f"{gpus} GPUs need {nodes} nodes of at most {max_gpus_per_node} GPUs; "
            f"a job spec allows {MAX_NODES} nodes"
        )
    return nodes, math.ceil(gpus / nodes)


@lru_cache(maxsize=256)
def _resources(
    gpus: int, max_gpus_per_node: int, gpu_memory_gib: float, arch: Architecture
) -> Resources:
    # Resources is frozen, so one instance per shape serves every job of that shape.
    nodes, per_node = node_shape(gpus, max_gpus_per_node)
    return Resources(
        gpus=per_node,
        gpu_memory_gib=gpu_memory_gib if per_node else 0,
        nodes=nodes,
        arch=arch,
    )


def to_spec(job: TraceJob, mapping: TraceMapping | None = None) -> JobSpec:
    """The job spec the simulator submits for `job` (rules in the module doc)."""
    m = mapping or _DEFAULT_MAPPING
    duration = max(1, math.ceil(job.duration_seconds))
    timeout = min(
        MAX_SPEC_SECONDS, max(m.min_timeout_seconds, math.ceil(duration * m.timeout_factor))
    )
    name = sanitize_name(job.job_id, "job")
    checkpoint = (
        None
        if m.checkpoint_interval_seconds is None
        else f"{m.checkpoint_prefix.rstrip('/')}/{name}/"
    )
    return JobSpec(
        name=name,
        team=sanitize_name(job.team, m.default_team),
        priority=priority_for(job, m),
        image=m.image,
        command=list(m.command),
        resources=_resources(job.gpus, m.max_gpus_per_node, m.min_gpu_memory_gib, m.arch),
        spot=m.spot,
        checkpoint=checkpoint,
        checkpoint_interval_seconds=m.checkpoint_interval_seconds,
        max_retries=m.max_retries,
        timeout_seconds=timeout,
        expected_duration_seconds=min(duration, MAX_SPEC_SECONDS),
    )


_DEFAULT_MAPPING = TraceMapping()
