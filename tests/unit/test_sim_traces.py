"""Trace loaders and the trace -> job spec mapping, on the real traces in ../shared/data."""

from __future__ import annotations

from collections import Counter
from datetime import datetime
from pathlib import Path

import pytest

from gpufleet.domain.spec import JobSpec, Priority, SpotPolicy
from gpufleet.sim.mapping import (
    MAX_SPEC_SECONDS,
    TraceMapping,
    hash_fraction,
    node_shape,
    priority_for,
    sanitize_name,
    to_spec,
)
from gpufleet.sim.traces import Trace, TraceError, TraceJob, load_trace

DATA = Path(__file__).resolve().parents[2].parent / "shared" / "data"
TRACES = DATA / "traces"
PHILLY = TRACES / "philly-2017-pollux-derived" / "philly.csv"
ITP = TRACES / "microsoft-itp-elasticflow-2021"
OPENB = TRACES / "alibaba-openb-gpu-2023"

needs_data = pytest.mark.skipif(
    not TRACES.is_dir(),
    reason=f"the shared trace data is not checked out at {DATA} (see ../shared/data/README.md)",
)


@pytest.fixture(scope="module")
def philly() -> Trace:
    if not PHILLY.is_file():
        pytest.skip(f"Philly trace absent at {PHILLY}")
    return load_trace(PHILLY, "philly")


@pytest.fixture(scope="module")
def itp() -> Trace:
    if not ITP.is_dir():
        pytest.skip(f"ITP traces absent at {ITP}")
    return load_trace(ITP, "itp")


@pytest.fixture(scope="module")
def openb() -> Trace:
    if not OPENB.is_dir():
        pytest.skip(f"openb trace absent at {OPENB}")
    return load_trace(OPENB, "openb", include_cpu_only=True)


# --- Loaders ----------------------------------------------------------------------------------


@needs_data
def test_philly_loads_every_job() -> None:
    # How fast is a benchmark's figure (scripts/bench_simulator.py prints the load's time).
    trace = load_trace(PHILLY, "philly")
    assert len(trace) == 82247
    assert trace.origin == datetime(2017, 9, 4, 10, 30, 41)
    assert trace.jobs[0].submit_seconds == 0.0
    assert trace.skipped == {}


def test_philly_rows_are_read_as_published(philly: Trace) -> None:
    by_id = {j.job_id: j for j in philly}
    first = by_id["philly-00001"]  # 2017-10-09 07:01:55,66.0,1,66.0,11cb48
    expected_submit = (
        datetime(2017, 10, 9, 7, 1, 55) - datetime(2017, 9, 4, 10, 30, 41)
    ).total_seconds()
    assert first == TraceJob("philly-00001", expected_submit, 66.0, 1, team="11cb48")
    # The Philly README's example job (SOURCE.md): 8 GPUs, 193,256 s, VC ee9e8c.
    assert any(
        j.gpus == 8 and j.duration_seconds == 193256.0 and j.team == "ee9e8c" for j in philly
    )
    assert len({j.team for j in philly}) == 15
    assert Counter(j.gpus for j in philly)[1] == 76627
    assert round(philly.gpu_hours) == 978078


def test_traces_are_sorted_by_submit_time(philly: Trace, itp: Trace, openb: Trace) -> None:
    for trace in (philly, itp, openb):
        keys = [(j.submit_seconds, j.job_id) for j in trace]
        assert keys == sorted(keys)
        assert all(j.duration_seconds > 0 for j in trace)


def test_window_keeps_only_jobs_submitted_inside_it(philly: Trace) -> None:
    window = load_trace(PHILLY, "philly", start_days=30, days=2)
    lo, hi = 30 * 86400, 32 * 86400
    assert window.window_start_seconds == lo
    assert window.window_end_seconds == hi
    assert all(lo <= j.submit_seconds < hi for j in window)
    assert len(window) == sum(1 for j in philly if lo <= j.submit_seconds < hi)
    assert 0 < len(window) < len(philly)
    rest = load_trace(PHILLY, "philly", start_days=100)
    assert rest.window_end_seconds is None
    assert len(rest) == sum(1 for j in philly if j.submit_seconds >= 100 * 86400)


def test_itp_reads_every_cluster_or_one(itp: Trace) -> None:
    assert len(itp) == 69351
    assert {j.team for j in itp} == {f"cluster{i:02d}" for i in range(1, 11)}
    assert {j.gpus for j in itp} == {1, 2, 4, 8, 16, 32, 64}
    assert min(j.duration_seconds for j in itp) >= 600  # the publisher's filter
    assert itp.origin is None
    one = load_trace(ITP / "cluster10.csv", "itp")
    assert len(one) == 260
    assert {j.team for j in one} == {"cluster10"}
    first_week = load_trace(ITP, "itp", start_days=0, days=7)
    assert all(j.submit_seconds < 7 * 86400 for j in first_week)


def test_openb_rounds_fractional_gpus_up_and_skips_unscheduled(openb: Trace) -> None:
    assert len(openb) == 8152 - 897  # never-scheduled pods have no run time
    assert openb.skipped == {"never_scheduled": 897}
    default = load_trace(OPENB, "openb")
    assert default.skipped == {"never_scheduled": 897, "cpu_only": 1052}
    assert all(j.gpus >= 1 for j in default)
    fractional = [j for j in openb if j.gpu_milli is not None]
    assert fractional
    assert all(j.gpus == 1 and 0 < j.gpu_milli < 1000 for j in fractional if j.gpu_milli)
    pod = next(j for j in openb if j.job_id == "openb-pod-0001")  # 1 GPU at 460 milli, LS
    assert (pod.gpus, pod.gpu_milli, pod.qos, pod.status) == (1, 460, "LS", "Running")
    assert pod.duration_seconds == 12902960 - 427061
    assert {j.qos for j in openb} == {"LS", "BE", "Burstable", "Guaranteed"}
    assert {j.status for j in openb} <= {"Running", "Succeeded", "Failed"}
    assert all(j.trace_wait_seconds is not None and j.trace_wait_seconds >= 0 for j in openb)


@needs_data
def test_bad_inputs_are_refused(tmp_path: Path) -> None:
    with pytest.raises(TraceError, match="unknown trace format"):
        load_trace(PHILLY, "helios")
    with pytest.raises(TraceError, match="start_days"):
        load_trace(PHILLY, "philly", start_days=-1)
    with pytest.raises(TraceError, match="days"):
        load_trace(PHILLY, "philly", days=0)
    with pytest.raises(TraceError, match="not found"):
        load_trace(tmp_path / "missing.csv", "philly")
    with pytest.raises(TraceError, match="header"):
        load_trace(ITP / "cluster10.csv", "philly")
    bad = tmp_path / "cluster01.csv"
    bad.write_text("job_id,submission_time,duration,num_gpu\nx,12,abc,1\n")
    with pytest.raises(TraceError, match=r"cluster01.csv:2: malformed row"):
        load_trace(tmp_path, "itp")


# --- Mapping ----------------------------------------------------------------------------------


def test_every_job_of_every_trace_maps_to_a_valid_spec(
    philly: Trace, itp: Trace, openb: Trace
) -> None:
    mapping = TraceMapping()
    for trace in (philly, itp, openb):
        names = set()
        for job in trace:
            spec = to_spec(job, mapping)
            assert isinstance(spec, JobSpec)
            r = spec.resources
            assert r.gpus * r.nodes >= job.gpus
            assert r.gpus <= mapping.max_gpus_per_node
            assert spec.expected_duration_seconds is not None
            assert spec.expected_duration_seconds <= spec.timeout_seconds
            names.add(spec.name)
        assert len(names) == len(trace)
    # A sample round-trips through the submitter's document form.
    for job in (philly.jobs[0], itp.jobs[-1], openb.jobs[3]):
        spec = to_spec(job)
        assert JobSpec.model_validate(spec.to_document()) == spec


def test_hash_priority_share_is_about_high_share_on_philly(philly: Trace) -> None:
    mapping = TraceMapping(high_share=0.1)
    high = [j.job_id for j in philly if priority_for(j, mapping) is Priority.HIGH]
    assert abs(len(high) / len(philly) - 0.1) < 0.005
    again = [j.job_id for j in philly if priority_for(j, mapping) is Priority.HIGH]
    assert high == again
    salted = TraceMapping(high_share=0.1, priority_salt="run-2")
    other = {j.job_id for j in philly if priority_for(j, salted) is Priority.HIGH}
    assert other != set(high)
    assert all(priority_for(j, TraceMapping(high_share=0)) is Priority.NORMAL for j in philly)


def test_openb_priority_comes_from_qos(openb: Trace) -> None:
    mapping = TraceMapping(high_share=0.5)  # must not matter for openb
    by_qos: dict[str, set[Priority]] = {}
    for job in openb:
        assert job.qos is not None
        by_qos.setdefault(job.qos, set()).add(to_spec(job, mapping).priority)
    assert by_qos == {
        "LS": {Priority.HIGH},
        "Guaranteed": {Priority.HIGH},
        "Burstable": {Priority.NORMAL},
        "BE": {Priority.LOW},
    }
    custom = TraceMapping(qos_priority={"LS": Priority.CRITICAL}, high_share=0)
    be = next(j for j in openb if j.qos == "BE")
    ls = next(j for j in openb if j.qos == "LS")
    assert to_spec(ls, custom).priority is Priority.CRITICAL
    assert to_spec(be, custom).priority is Priority.NORMAL  # unmapped QoS: the hash rule


def test_teams_come_from_the_trace(philly: Trace, itp: Trace, openb: Trace) -> None:
    assert {to_spec(j).team for j in philly.jobs[::20]} == {j.team for j in philly.jobs[::20]}
    assert to_spec(itp.jobs[0]).team.startswith("cluster")
    assert {to_spec(j).team for j in openb} == {"default"}
    assert to_spec(openb.jobs[0], TraceMapping(default_team="alibaba")).team == "alibaba"


@pytest.mark.parametrize(
    ("gpus", "shape"),
    [
        (0, (1, 0)),
        (1, (1, 1)),
        (8, (1, 8)),
        (9, (2, 5)),
        (12, (2, 6)),
        (16, (2, 8)),
        (24, (3, 8)),
        (128, (16, 8)),
        (512, (64, 8)),
    ],
)
def test_node_shape(gpus: int, shape: tuple[int, int]) -> None:
    assert node_shape(gpus, 8) == shape


def test_node_shape_refuses_what_a_spec_cannot_hold() -> None:
    with pytest.raises(ValueError, match="64 nodes"):
        node_shape(513, 8)
    assert node_shape(12, 4) == (3, 4)


@pytest.mark.parametrize(
    ("raw", "name"),
    [
        ("6214e9", "6214e9"),
        ("Cluster 04", "cluster-04"),
        ("__VC/Research!", "vc-research-"),
        ("..", "default"),
        ("", "default"),
        (None, "default"),
        ("x" * 80, "x" * 63),
    ],
)
def test_sanitize_name(raw: str | None, name: str) -> None:
    assert sanitize_name(raw, "default") == name


def test_mapping_rules_on_a_synthetic_job() -> None:
    job = TraceJob("Job_42", 100.0, 30 * 86400.0, 12, team="Team A")
    spec = to_spec(job, TraceMapping(min_gpu_memory_gib=40, spot=SpotPolicy.NEVER))
    assert spec.name == "job_42"
    assert spec.team == "team-a"
    assert (spec.resources.nodes, spec.resources.gpus) == (2, 6)
    assert spec.resources.gpu_memory_gib == 40
    assert spec.resources.arch.value == "x86_64"
    assert spec.spot is SpotPolicy.NEVER
    assert spec.expected_duration_seconds == MAX_SPEC_SECONDS  # capped: 30 days > 14
    assert spec.timeout_seconds == MAX_SPEC_SECONDS
    assert spec.checkpoint == "s3://gpufleet-sim/checkpoints/job_42/"
    short = to_spec(TraceJob("j", 0.0, 0.4, 1), TraceMapping(checkpoint_interval_seconds=None))
    assert short.expected_duration_seconds == 1
    assert short.timeout_seconds == 3600
    assert short.checkpoint is None


def test_hash_fraction_is_stable_and_uniform() -> None:
    assert hash_fraction("philly-00001") == hash_fraction("philly-00001")
    assert 0 <= hash_fraction("a") < 1
    values = [hash_fraction(f"job-{i}") for i in range(20000)]
    assert abs(sum(v < 0.25 for v in values) / len(values) - 0.25) < 0.015
