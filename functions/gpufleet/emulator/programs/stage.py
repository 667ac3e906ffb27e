"""`python -m gpufleet.emulator.programs.stage NAME`: a stage of the stages demo that really runs.

It prints where its stage reads and writes (GPUFLEET_STAGE_INPUT, GPUFLEET_STAGE_OUTPUT), how
many GPUs it was given (none on a CPU-only type: the container got no GPU flag), and whether it
holds its job's session (the keys the agent serves at the container credentials endpoint, read
as an SDK reads them: the URI and the token of its environment), and exits 0.
Stdlib only: it runs in any image with Python.
"""

from __future__ import annotations

import json
import os
import sys
import urllib.request


def _holds_a_session() -> bool:
    uri = os.environ.get("AWS_CONTAINER_CREDENTIALS_FULL_URI")
    token = os.environ.get("AWS_CONTAINER_AUTHORIZATION_TOKEN")
    if not uri or not token:
        return False
    request = urllib.request.Request(uri, headers={"Authorization": token})  # noqa: S310 - loopback
    with urllib.request.urlopen(request, timeout=5) as answer:  # noqa: S310 - loopback
        return bool(json.load(answer).get("AccessKeyId"))


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    name = args[0] if args else "stage"
    source = os.environ.get("GPUFLEET_STAGE_INPUT", "the job's own data")
    target = os.environ.get("GPUFLEET_STAGE_OUTPUT", "nowhere")
    gpus = os.environ.get("GPUFLEET_GPUS_PER_NODE", "0")
    session = "with its job's session" if _holds_a_session() else "without credentials"
    print(f"{name}: from {source} to {target} on {gpus} GPU(s), {session}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
