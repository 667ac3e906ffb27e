"""`python -m gpufleet.emulator.programs.rank_sum [--hold SECONDS]`: the distributed demo's job.

Every node of the run meets the others over TCP at MASTER_ADDR:MASTER_PORT, as torchrun's
rendezvous does: the main node (NODE_RANK 0) listens, every other node connects and sends its
rank, the main node adds them up and sends the sum back, and each node prints
`rank R of N: sum of ranks S`. `--hold` keeps each node running that long after (a run long
enough for a node to be lost in). Stdlib only: it runs in any image with Python.
"""

from __future__ import annotations

import argparse
import os
import socket
import sys
import time

# How long a node waits for the others: they boot at different times.
MEET_SECONDS = 60.0


def _serve(address: str, port: int, nodes: int) -> int:
    with socket.create_server((address, port), reuse_port=False) as server:
        server.settimeout(MEET_SECONDS)
        peers = []
        total = 0
        for _ in range(nodes - 1):
            connection, _peer = server.accept()
            connection.settimeout(MEET_SECONDS)
            total += int(connection.makefile().readline())
            peers.append(connection)
        for connection in peers:
            with connection:
                connection.sendall(f"{total}\n".encode())
        return total


def _join(address: str, port: int, rank: int) -> int:
    deadline = time.monotonic() + MEET_SECONDS
    while True:
        try:
            connection = socket.create_connection((address, port), timeout=MEET_SECONDS)
            break
        except OSError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.1)  # the main node is not listening yet
    with connection:
        connection.sendall(f"{rank}\n".encode())
        return int(connection.makefile().readline())


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="rank_sum")
    parser.add_argument("--hold", type=float, default=0.0)
    args = parser.parse_args(argv)
    rank, nodes = int(os.environ["NODE_RANK"]), int(os.environ["NNODES"])
    address, port = os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"])
    print(f"rank {rank} of {nodes}: meeting at {address}:{port}", flush=True)
    total = _serve(address, port, nodes) if rank == 0 else _join(address, port, rank)
    print(f"rank {rank} of {nodes}: sum of ranks {total}", flush=True)
    time.sleep(args.hold)
    return 0


if __name__ == "__main__":
    sys.exit(main())
