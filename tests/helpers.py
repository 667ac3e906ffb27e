"""Shared test builders."""

from __future__ import annotations

from gpufleet.adapters.local.memory import (
    FakeFleet,
    InMemoryCapacityMemory,
    InMemoryJobQueue,
    InMemoryJobStore,
    InMemoryObjects,
    ManualClock,
    RecordingPublisher,
    RecordingWorkflow,
)
from gpufleet.ports import Ports

SPEC_YAML = b"""
name: resnet
team: vision
image: public.ecr.aws/pytorch/pytorch:2.4.0
command: [python, train.py]
resources: {gpus: 1, gpu_memory_gib: 16}
timeout: 1h
"""


def local_ports(fleet: FakeFleet | None = None) -> Ports:
    return Ports(
        clock=ManualClock(),
        jobs=InMemoryJobStore(),
        events=RecordingPublisher(),
        objects=InMemoryObjects(),
        workflow=RecordingWorkflow(),
        fleet=fleet or FakeFleet(),
        capacity=InMemoryCapacityMemory(),
        queue=InMemoryJobQueue(),
    )
