"""`python -m gpufleet.emulator.programs.sweep_point [NAME ...]`: a child of an array or sweep
that really runs (docs/arrays.md).

It prints its index under both names (GPUFLEET_ARRAY_INDEX, AWS_BATCH_JOB_ARRAY_INDEX) and the
value of each parameter named, as its environment holds them, and exits 0. Stdlib only: it
runs in any image with Python.
"""

from __future__ import annotations

import os
import sys


def main(argv: list[str] | None = None) -> int:
    names = sys.argv[1:] if argv is None else argv
    index = os.environ.get("GPUFLEET_ARRAY_INDEX", "-")
    batch_index = os.environ.get("AWS_BATCH_JOB_ARRAY_INDEX", "-")
    values = " ".join(f"{name}={os.environ.get(name, '-')}" for name in names)
    print(f"index={index} batch_index={batch_index} {values}".rstrip(), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
