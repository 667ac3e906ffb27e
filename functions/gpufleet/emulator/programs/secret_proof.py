"""`python -m gpufleet.emulator.programs.secret_proof NAME`: a job of the distributed demo that
really runs from a private image and proves it got its secret without showing it.

It prints the length of environment variable NAME and the first 12 hex digits of its SHA-256
(never the value: the log is stored), and exits 0; it exits 1 when NAME is unset or empty.
Stdlib only: it runs in any image with Python.
"""

from __future__ import annotations

import hashlib
import os
import sys


def proof(name: str, value: str) -> str:
    """The line that shows `value` arrived, naming only its length and a hash prefix."""
    digest = hashlib.sha256(value.encode("utf-8")).hexdigest()[:12]
    return f"secret {name}: {len(value)} characters, sha256 {digest}"


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    name = args[0] if args else "SECRET"
    value = os.environ.get(name, "")
    if not value:
        print(f"secret {name}: not set", flush=True)
        return 1
    print(proof(name, value), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
