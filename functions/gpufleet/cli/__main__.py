"""`python -m gpufleet.cli`, the same as the `gpufleet` console script."""

import sys

from gpufleet.cli import main

sys.exit(main())
