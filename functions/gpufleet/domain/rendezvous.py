"""How the nodes of one run find each other, and which node's end is the run's end.

A run of `nodes` instances gives each a rank: its place among the run's instance ids in sorted
order (deterministic, and the same for a next stage on the same instances). Rank 0 is the main
node: its private IP is MASTER_ADDR, and its container's exit ends the run. Every container gets
the names `torchrun` reads (MASTER_ADDR, MASTER_PORT, NODE_RANK, NNODES, WORLD_SIZE: all the
run's processes, one per GPU, LOCAL_WORLD_SIZE: this node's) and `GPUFLEET_*` names for the
rest, so a program without torchrun finds its peers too.

The same rules serve the control plane (the run manifest, a node's report) and the node agent
(its container's environment).
"""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass

# The port the main node's rendezvous listens on (torchrun's default).
MASTER_PORT = 29500


@dataclass(frozen=True)
class Peer:
    instance_id: str
    private_ip: str


def ranked_peers(instance_ids: Collection[str], private_ips: Mapping[str, str]) -> list[Peer]:
    """The run's nodes in rank order (by instance id), each with its private IP; none until
    every one's IP is known."""
    if not instance_ids or any(i not in private_ips for i in instance_ids):
        return []
    return [Peer(instance_id, private_ips[instance_id]) for instance_id in sorted(instance_ids)]


def rank_of(instance_ids: Collection[str], instance_id: str) -> int:
    """The rank of `instance_id` among the run's instances (ValueError: not one of them)."""
    return sorted(instance_ids).index(instance_id)


def node_environment(
    peers: Sequence[Peer], rank: int, gpus_per_node: int, port: int = MASTER_PORT
) -> dict[str, str]:
    """What the container of the node at `rank` gets to meet the others."""
    nodes = len(peers)
    processes_per_node = max(gpus_per_node, 1)  # a CPU-only node runs one process
    ips = ",".join(peer.private_ip for peer in peers)
    return {
        "MASTER_ADDR": peers[0].private_ip,
        "MASTER_PORT": str(port),
        "NODE_RANK": str(rank),
        "NNODES": str(nodes),
        "WORLD_SIZE": str(nodes * processes_per_node),
        "LOCAL_WORLD_SIZE": str(processes_per_node),
        "GPUFLEET_NODE_RANK": str(rank),
        "GPUFLEET_NODE_COUNT": str(nodes),
        "GPUFLEET_NODE_IPS": ips,
        "GPUFLEET_MASTER_ADDR": peers[0].private_ip,
        "GPUFLEET_MASTER_PORT": str(port),
        "GPUFLEET_GPUS_PER_NODE": str(gpus_per_node),
    }


def all_started(instance_ids: Collection[str], started: Collection[str]) -> bool:
    """Whether the run is RUNNING: every one of its nodes has reported its start."""
    return set(instance_ids) <= set(started)


def ends_run(instance_ids: Collection[str], instance_id: str, exit_code: int | None) -> bool:
    """Whether a node's finish ends the run of all of them: the main node's, however it ended;
    any other node's when it failed (an exit status other than 0, or none). A worker that ended
    well waits for the main node, whose exit ends the run (and the other containers with it)."""
    return rank_of(instance_ids, instance_id) == 0 or exit_code != 0
