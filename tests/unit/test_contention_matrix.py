"""scripts/contention_matrix.py: its run syntax and the held-out traces' explicit windows."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

import pytest

from gpufleet.sim.engine import Workload
from gpufleet.sim.mapping import TraceMapping
from gpufleet.sim.traces import TraceJob

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "contention_matrix.py"


@pytest.fixture(scope="module")
def matrix() -> ModuleType:
    spec = importlib.util.spec_from_file_location("contention_matrix", SCRIPT)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses resolve annotations through sys.modules
    spec.loader.exec_module(module)
    return module


def _workload() -> Workload:
    # Two 4-GPU jobs overlapping for an hour: the window's peak is 8 GPUs.
    jobs = [
        TraceJob("a", submit_seconds=0.0, duration_seconds=7200.0, gpus=4),
        TraceJob("b", submit_seconds=3600.0, duration_seconds=7200.0, gpus=4),
    ]
    return Workload.from_trace(jobs, TraceMapping())


def test_cap_is_a_count_the_peak_or_a_share_of_the_windows_peak(matrix: ModuleType) -> None:
    workload = _workload()
    count = matrix.Run.parse("14:1:272:0")
    peak = matrix.Run.parse("14:1:peak:1")
    third = matrix.Run.parse("14:1:peak/3:1")
    assert (count.cap_for(workload), count.capped, count.label) == (272, True, "14+1, 272, 0")
    assert (peak.cap_for(workload), peak.capped, peak.label) == (None, False, "14+1, peak, 1")
    assert (third.cap_for(workload), third.capped) == (8 // 3, True)
    assert third.label == "14+1, peak/3, 1"


@pytest.mark.parametrize("extra", [[], ["--week", "--runs", "14:1:peak/2:0"]])
def test_a_held_out_trace_takes_named_windows_only(
    matrix: ModuleType, extra: list[str], capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as exit_info:
        matrix.main(["--format", "itp", *extra])
    assert exit_info.value.code == 2
    assert "--format itp takes --runs and no --week" in capsys.readouterr().err
