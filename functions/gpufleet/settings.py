"""Deployment settings, read once per cold start from the function's environment."""

from __future__ import annotations

from collections.abc import Mapping

from pydantic import BaseModel, ConfigDict, Field

from gpufleet import topology
from gpufleet.domain.boot import BootTarget, TemplateKey
from gpufleet.domain.config import FleetConfig, config_from_env

ENV_CATALOG_MAX_AGE_DAYS = "GPUFLEET_CATALOG_MAX_AGE_DAYS"


class Settings(BaseModel):
    model_config = ConfigDict(frozen=True)

    region: str
    jobs_table: str
    idempotency_table: str
    capacity_table: str
    queue_table: str
    event_bus_name: str
    intake_bucket: str
    job_state_machine_arn: str = ""
    # Launch template id by template key (gpufleet.domain.boot.TemplateKey.name).
    launch_templates: dict[str, str] = Field(default_factory=dict)
    notify_topic_arn: str = ""
    # The deployment's account (intake holds a spec's notify topic to it), and each team's
    # own topic (team -> ARN), for its e-mail addresses.
    account_id: str = ""
    # Where the job role lets each team keep checkpoints (`s3://bucket/prefix`; empty: nowhere).
    checkpoint_uri: str = ""
    team_topics: dict[str, str] = Field(default_factory=dict)
    subnet_ids: list[str] = Field(default_factory=list)
    config: FleetConfig = Field(default_factory=FleetConfig)
    # Launch policy: how often and how long to wait for capacity before a job fails.
    max_launch_attempts: int = 20
    retry_wait_seconds: int = 60
    boot_allowance_seconds: int = 900
    # An instance younger than this is never taken for an orphan (its launch may be recording it).
    reconcile_grace_seconds: int = 300
    # A live job whose workflow has not run for this long is ended by the reconciler (the
    # backstop's event, which usually ends it within seconds, was lost).
    abandoned_after_seconds: int = 900
    # Spot interruptions a job may absorb (each requeues it) before it runs on on-demand only
    # (spot: auto) or fails (spot: required).
    max_interruptions: int = 10
    # How long an offering that failed for capacity is skipped by every launch.
    capacity_memory_seconds: int = 300
    # A node that sends no heartbeat for this long is taken for lost.
    node_heartbeat_timeout_seconds: int = 900
    # Each node's root EBS volume (the stack's `root_volume_gib`), priced into every run.
    root_volume_gib: int = 200
    # A refreshed catalog (topology.CATALOG_KEY) older than this is ignored for the bundled one.
    catalog_max_age_days: int = 7

    @property
    def bootable(self) -> frozenset[BootTarget]:
        """What the deployment's launch templates boot: selection's and intake's limit."""
        return frozenset(TemplateKey.parse(key).target for key in self.launch_templates)

    @classmethod
    def from_env(cls, env: Mapping[str, str]) -> Settings:
        return cls(
            region=env.get("AWS_REGION") or env.get("AWS_DEFAULT_REGION") or "us-east-1",
            jobs_table=env[topology.JOBS_TABLE.env_var],
            idempotency_table=env[topology.IDEMPOTENCY_TABLE.env_var],
            capacity_table=env[topology.CAPACITY_TABLE.env_var],
            queue_table=env[topology.QUEUE_TABLE.env_var],
            event_bus_name=env[topology.ENV_EVENT_BUS],
            intake_bucket=env[topology.ENV_INTAKE_BUCKET],
            job_state_machine_arn=env.get(topology.ENV_STATE_MACHINE, ""),
            launch_templates=topology.parse_launch_templates(
                env.get(topology.ENV_LAUNCH_TEMPLATES, "")
            ),
            notify_topic_arn=env.get(topology.ENV_NOTIFY_TOPIC, ""),
            account_id=env.get(topology.ENV_ACCOUNT, ""),
            checkpoint_uri=env.get(topology.ENV_CHECKPOINT_URI, ""),
            team_topics=topology.parse_pairs(
                topology.ENV_TEAM_TOPICS, env.get(topology.ENV_TEAM_TOPICS, "")
            ),
            subnet_ids=[s for s in env.get(topology.ENV_SUBNETS, "").split(",") if s],
            config=config_from_env(env.get(topology.ENV_CONFIG)),
            max_launch_attempts=int(env.get("GPUFLEET_MAX_LAUNCH_ATTEMPTS", "20")),
            retry_wait_seconds=int(env.get("GPUFLEET_RETRY_WAIT_SECONDS", "60")),
            max_interruptions=int(env.get("GPUFLEET_MAX_INTERRUPTIONS", "10")),
            capacity_memory_seconds=int(env.get("GPUFLEET_CAPACITY_MEMORY_SECONDS", "300")),
            boot_allowance_seconds=int(env.get("GPUFLEET_BOOT_ALLOWANCE_SECONDS", "900")),
            node_heartbeat_timeout_seconds=int(
                env.get("GPUFLEET_NODE_HEARTBEAT_TIMEOUT_SECONDS", "900")
            ),
            root_volume_gib=int(env.get(topology.ENV_ROOT_VOLUME, "200")),
            catalog_max_age_days=int(env.get(ENV_CATALOG_MAX_AGE_DAYS, "7")),
            reconcile_grace_seconds=int(env.get("GPUFLEET_RECONCILE_GRACE_SECONDS", "300")),
            abandoned_after_seconds=int(env.get("GPUFLEET_ABANDONED_AFTER_SECONDS", "900")),
        )
