"""The trace-driven simulator's inputs: real cluster traces, their mapping to job specs, and
a spot market model built from the bundled catalog. See `gpufleet/sim/README.md`."""

from __future__ import annotations

from gpufleet.sim.mapping import DEFAULT_QOS_PRIORITY, TraceMapping, sanitize_name, to_spec
from gpufleet.sim.market import (
    MarketConfig,
    MarketModel,
    PreemptionCheck,
    bamboo_check,
    checkpointed_progress,
)
from gpufleet.sim.traces import FORMATS, Trace, TraceError, TraceFormat, TraceJob, load_trace

__all__ = [
    "DEFAULT_QOS_PRIORITY",
    "FORMATS",
    "MarketConfig",
    "MarketModel",
    "PreemptionCheck",
    "Trace",
    "TraceError",
    "TraceFormat",
    "TraceJob",
    "TraceMapping",
    "bamboo_check",
    "checkpointed_progress",
    "load_trace",
    "sanitize_name",
    "to_spec",
]
