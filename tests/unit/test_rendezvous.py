"""Several nodes, one run: ranks, the containers' rendezvous environment, when the run is
RUNNING and which node's end ends it (domain/rendezvous.py and the node reports that use it)."""

from __future__ import annotations

import json
from typing import Any, cast

import pytest

from gpufleet.adapters.local.memory import FakeFleet, InMemoryObjects, RecordingWorkflow
from gpufleet.agent.docker import container_environment, device_options
from gpufleet.agent.node import RunManifest
from gpufleet.domain.job import JobStatus
from gpufleet.domain.rendezvous import Peer, ends_run, node_environment, rank_of, ranked_peers
from gpufleet.services.factory import build_lifecycle
from gpufleet.services.lifecycle_base import run_manifest_key
from gpufleet.services.run_reports import NodeReport
from gpufleet.services.workflow_state import WorkflowState
from tests.helpers import local_ports, plan_of
from tests.unit.test_services import SETTINGS, submit

TWO_NODES = b"""
name: ddp
team: vision
image: public.ecr.aws/pytorch/pytorch:2.4.0
command: [torchrun, train.py]
resources: {gpus: 8, gpu_memory_gib: 80, nodes: 2}
timeout: 1h
"""


def test_ranks_follow_the_sorted_instance_ids_whatever_order_ec2_returned() -> None:
    ips = {"i-0c": "10.0.0.3", "i-0a": "10.0.0.1", "i-0b": "10.0.0.2"}
    assert [p.instance_id for p in ranked_peers(["i-0c", "i-0a", "i-0b"], ips)] == [
        "i-0a",
        "i-0b",
        "i-0c",
    ]
    assert rank_of(["i-0c", "i-0a", "i-0b"], "i-0c") == 2
    assert ranked_peers(["i-0a", "i-0z"], ips) == []  # an IP not known yet: no peers


def test_the_environment_is_what_torchrun_reads_plus_gpufleet_names() -> None:
    peers = [Peer("i-0a", "10.0.0.1"), Peer("i-0b", "10.0.0.2")]
    env = node_environment(peers, rank=1, gpus_per_node=8)
    assert {k: env[k] for k in ("MASTER_ADDR", "NODE_RANK", "NNODES", "WORLD_SIZE")} == {
        "MASTER_ADDR": "10.0.0.1",
        "NODE_RANK": "1",
        "NNODES": "2",
        "WORLD_SIZE": "16",  # every process of the run: 2 nodes x 8 GPUs
    }
    assert env["LOCAL_WORLD_SIZE"] == "8" and env["MASTER_PORT"] == env["GPUFLEET_MASTER_PORT"]
    assert env["GPUFLEET_NODE_IPS"] == "10.0.0.1,10.0.0.2"
    assert (env["GPUFLEET_NODE_RANK"], env["GPUFLEET_NODE_COUNT"]) == ("1", "2")
    # A CPU-only node runs one process.
    assert node_environment(peers, 0, gpus_per_node=0)["WORLD_SIZE"] == "2"


@pytest.mark.parametrize(
    ("instance", "exit_code", "ends"),
    [
        ("i-0a", 0, True),
        ("i-0a", 3, True),
        ("i-0b", 0, False),
        ("i-0b", 1, True),
        ("i-0b", None, True),
    ],
)
def test_the_main_nodes_end_ends_the_run_and_any_other_only_when_it_failed(
    instance: str, exit_code: int | None, ends: bool
) -> None:
    assert ends_run(["i-0b", "i-0a"], instance, exit_code) is ends


def manifest(**fields: Any) -> RunManifest:
    document = {"job_id": "j-1", "image": "img", "command": ["python"], **fields}
    return RunManifest.from_json(json.dumps(document).encode())


def test_each_node_takes_its_rank_from_its_own_instance_id() -> None:
    peers = [{"instance_id": "i-0a", "private_ip": "10.0.0.1"}]
    peers.append({"instance_id": "i-0b", "private_ip": "10.0.0.2"})
    run = manifest(nodes=2, peers=peers, gpus=4)
    second = run.on_node("i-0b")
    assert second is not None
    env = container_environment(second)
    assert (env["NODE_RANK"], env["MASTER_ADDR"], env["WORLD_SIZE"]) == ("1", "10.0.0.1", "8")
    # Written before the launch knew the nodes: a node of a 2-node run waits for its name.
    assert manifest(nodes=2).on_node("i-0b") is None
    assert manifest().on_node("i-0b") == manifest()  # a single node runs at once


@pytest.mark.parametrize(
    ("fields", "options"),
    [
        ({"gpus": 8, "accelerator": "nvidia"}, ["--gpus", "all"]),
        ({"gpus": 0, "accelerator": "none"}, []),  # a CPU stage: docker refuses --gpus there
        ({"gpus": 0}, []),  # an older manifest without the accelerator
        (
            {"gpus": 2, "accelerator": "trainium", "accelerator_devices": 2},
            ["--device", "/dev/neuron0", "--device", "/dev/neuron1"],
        ),
    ],
)
def test_the_container_gets_the_accelerators_the_instance_has(
    fields: dict[str, Any], options: list[str]
) -> None:
    assert device_options(manifest(**fields)) == options


def reported(job_id: str, instance: str, phase: str, exit_code: int | None = None) -> NodeReport:
    return NodeReport.model_validate(
        {"job_id": job_id, "instance_id": instance, "phase": phase, "nodes": 2}
        | ({"exit_code": exit_code} if phase == "finished" else {})
    )


def launched_two_nodes() -> tuple[Any, Any, str, list[str]]:
    ports = local_ports(FakeFleet())
    job_id = submit(ports, body=TWO_NODES).job_id
    service = build_lifecycle(ports, SETTINGS)
    assert service.launch(job_id, plan_of(ports, job_id), 0, 0, task_token="t") is None
    placement = ports.jobs.get(job_id).placement
    return service, ports, job_id, sorted(placement.instance_ids)


def test_the_launch_writes_every_node_with_its_private_ip_into_the_manifest() -> None:
    _, ports, job_id, (main, worker) = launched_two_nodes()
    placement = ports.jobs.get(job_id).placement
    document = json.loads(cast(InMemoryObjects, ports.objects).objects[run_manifest_key(job_id)])
    assert document["peers"] == [
        {"instance_id": main, "private_ip": placement.private_ips[main]},
        {"instance_id": worker, "private_ip": placement.private_ips[worker]},
    ]
    assert (document["nodes"], document["gpus"], document["accelerator"]) == (2, 8, "nvidia")


def test_the_job_runs_once_every_node_started_and_the_main_nodes_exit_ends_the_run() -> None:
    service, ports, job_id, (main, worker) = launched_two_nodes()
    workflow = cast(RecordingWorkflow, ports.workflow)
    service.node_report(reported(job_id, worker, "started"))
    assert ports.jobs.get(job_id).status is JobStatus.LAUNCHING  # one of two
    service.node_report(reported(job_id, worker, "started"))  # delivered again
    assert ports.jobs.get(job_id).status is JobStatus.LAUNCHING
    service.node_report(reported(job_id, main, "started"))
    assert ports.jobs.get(job_id).status is JobStatus.RUNNING
    service.node_report(reported(job_id, worker, "finished", exit_code=0))
    assert "t" not in workflow.completed  # a worker done: the run waits for the main node
    service.node_report(reported(job_id, main, "finished", exit_code=0))
    assert workflow.completed["t"]["exit_code"] == 0


def test_a_failed_worker_fails_the_run_of_every_node() -> None:
    service, ports, job_id, (main, worker) = launched_two_nodes()
    for node in (main, worker):
        service.node_report(reported(job_id, node, "started"))
    service.node_report(reported(job_id, worker, "finished", exit_code=1))
    assert cast(RecordingWorkflow, ports.workflow).completed["t"]["exit_code"] == 1
    released = service.release(job_id, WorkflowState.model_validate({"run": {"exit_code": 1}}))
    assert set(released["terminated"]) == {main, worker}  # retried as one run
    assert released["requeue"] is True
