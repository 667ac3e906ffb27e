"""Shared test builders."""

from __future__ import annotations

from gpufleet.adapters.local.memory import FakeFleet, in_memory_ports
from gpufleet.ports import Ports
from gpufleet.settings import Settings

SPEC_YAML = b"""
name: resnet
team: vision
image: public.ecr.aws/pytorch/pytorch:2.4.0
command: [python, train.py]
resources: {gpus: 1, gpu_memory_gib: 16}
timeout: 1h
"""


def local_ports(fleet: FakeFleet | None = None) -> Ports:
    return in_memory_ports(fleet=fleet or FakeFleet())


def make_settings(**changes: object) -> Settings:
    """Settings for services built on in-memory ports (names are not used)."""
    values: dict[str, object] = {
        "region": "us-east-1",
        "jobs_table": "jobs",
        "idempotency_table": "idempotency",
        "capacity_table": "capacity",
        "queue_table": "queue",
        "event_bus_name": "gpufleet",
        "intake_bucket": "bucket",
        **changes,
    }
    return Settings.model_validate(values)
