"""`python -m gpufleet.emulator.programs.stage NAME`: a stage of the stages demo that really runs.

It prints where its stage reads and writes (GPUFLEET_STAGE_INPUT, GPUFLEET_STAGE_OUTPUT) and how
many GPUs it was given (none on a CPU-only type: the container got no GPU flag), and exits 0.
Stdlib only: it runs in any image with Python.
"""

from __future__ import annotations

import os
import sys


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    name = args[0] if args else "stage"
    source = os.environ.get("GPUFLEET_STAGE_INPUT", "the job's own data")
    target = os.environ.get("GPUFLEET_STAGE_OUTPUT", "nowhere")
    gpus = os.environ.get("GPUFLEET_GPUS_PER_NODE", "0")
    print(f"{name}: from {source} to {target} on {gpus} GPU(s)", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
