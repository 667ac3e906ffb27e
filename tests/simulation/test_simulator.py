"""The trace-driven simulator: invariants on a synthetic 20-job trace (always runs) and on
a small Philly slice on the default (measured) market (when ../shared/data is checked out),
the CLI's JSON and its settings, and the report."""

from __future__ import annotations

import json
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

from gpufleet.cli import main
from gpufleet.domain.catalog import load_bundled
from gpufleet.domain.queueing import QueuePolicy, TeamQuota
from gpufleet.domain.spec import Priority
from gpufleet.sim.engine import SimPolicy, SimResult, Workload, simulate
from gpufleet.sim.mapping import TraceMapping, to_spec
from gpufleet.sim.market import MarketConfig
from gpufleet.sim.policies import (
    BATCH_LIKE,
    FIFO_SPOT,
    GPUFLEET,
    POLICY_NAMES,
    SKYPILOT_LIKE,
    STATIC_ONDEMAND,
    build_policies,
)
from gpufleet.sim.report import PLOTS, cost_lower_bound_usd, summary
from gpufleet.sim.settings import SimSettings
from gpufleet.sim.traces import Trace, TraceJob, load_trace

DATA = Path(__file__).resolve().parents[2].parent / "shared" / "data"
PHILLY = DATA / "traces" / "philly-2017-pollux-derived"

METRIC_KEYS = {
    "jobs",
    "completed",
    "cost_usd",
    "cost_lower_bound_usd",
    "gpu_hours_paid",
    "gpu_hours_useful",
    "utilization",
    "wait_seconds",
    "jct_seconds",
    "interruptions",
    "requeues",
    "ondemand_fallbacks",
    "preemptions",
    "cost_vs_lower_bound",
    "interruptions_per_job",
    "preemptions_per_job",
    "expected_duration_sources",
    "cost_above_bound_usd",
}
# Runs that need no shared data: the Spot Advisor hazard, unlimited spot, true durations.
DATA_FREE = ["--interruptions", "advisor", "--spot-capacity", "unlimited", "--durations", "oracle"]

# --- A synthetic trace that always runs -------------------------------------------------------

HIGH = {f"syn-{i:02d}" for i in range(12, 16)}


def synthetic_jobs() -> list[TraceJob]:
    """20 jobs of one team on an 8-GPU cap: 12 long normal jobs fill it, 4 high-priority jobs
    arrive an hour later (gpufleet preempts for them), then 4 multi-GPU jobs."""
    jobs = [
        TraceJob(f"syn-{i:02d}", submit_seconds=10.0 * i, duration_seconds=3 * 3600.0, gpus=1)
        for i in range(12)
    ]
    jobs += [
        TraceJob(f"syn-{i:02d}", submit_seconds=3600.0 + 60 * i, duration_seconds=3600.0, gpus=1)
        for i in range(12, 16)
    ]
    jobs += [
        TraceJob(f"syn-{i:02d}", submit_seconds=7200.0 + 30 * i, duration_seconds=1800.0, gpus=g)
        for i, g in zip(range(16, 20), (2, 2, 4, 8), strict=True)
    ]
    return [TraceJob(**{**_fields(j), "team": "lab"}) for j in jobs]


def _fields(job: TraceJob) -> dict[str, Any]:
    return {name: getattr(job, name) for name in TraceJob.__slots__}


def synthetic_workload() -> Workload:
    mapping = TraceMapping(high_share=0.0)
    jobs = tuple(synthetic_jobs())
    specs = tuple(
        to_spec(j, mapping).model_copy(
            update={"priority": Priority.HIGH if j.job_id in HIGH else Priority.NORMAL}
        )
        for j in jobs
    )
    return Workload(jobs, specs, mapping, "synthetic")


def run_all(
    workload: Workload,
    seed: int = 7,
    cap_gpus: int | None = None,
    market: MarketConfig | None = None,
) -> list[SimResult]:
    policies = build_policies(list(POLICY_NAMES), workload, cap_gpus=cap_gpus)
    config = market
    return [simulate(workload, p, seed=seed, market_config=config) for p in policies]


def as_json(workload: Workload, results: list[SimResult]) -> str:
    document = summary(results, cost_lower_bound_usd(workload), sim_wall_seconds=0.0)
    return json.dumps(document, sort_keys=True)


def check_invariants(workload: Workload, results: list[SimResult]) -> None:
    bound = cost_lower_bound_usd(workload)
    assert bound > 0
    for r in results:
        assert r.jobs == len(workload)
        assert r.completed + r.failed == r.jobs, r.policy  # every job ends
        assert r.completed == r.jobs, (r.policy, r.failures)
        assert all(w is not None and w >= 0 for w in r.waits)
        assert r.gpu_seconds_paid >= r.gpu_seconds_useful > 0, r.policy
        assert r.cost_usd >= bound, r.policy
        # The plotted spend integrates to the per-interval cost.
        assert r.series.cost_usd[-1] == pytest.approx(r.cost_usd, rel=1e-6)
        assert r.requeues == r.interruptions + r.preemptions, r.policy
        above = r.price_above_cheapest_usd
        if r.policy == STATIC_ONDEMAND:
            assert above is None  # no job's placement holds a static pool's instances
            continue
        assert above is not None
        # No run pays less than its job's cheapest price, and every job, done, held its
        # instances at least as long as its work: what is left above the bound is >= 0 too.
        assert all(usd >= -1e-9 for usd in above.values()), (r.policy, above)
        assert r.cost_usd - bound - sum(above.values()) >= -1e-6, (r.policy, above)
    by_name = {r.policy: r for r in results}
    assert by_name[STATIC_ONDEMAND].interruptions == 0
    assert by_name[STATIC_ONDEMAND].launches == 0
    for name in (STATIC_ONDEMAND, FIFO_SPOT, BATCH_LIKE, SKYPILOT_LIKE):
        assert by_name[name].preemptions == 0, name
    assert by_name[SKYPILOT_LIKE].ondemand_fallbacks == 0  # spot only


def test_synthetic_invariants_and_preemption() -> None:
    workload = synthetic_workload()
    results = run_all(workload, cap_gpus=8)
    check_invariants(workload, results)
    by_name = {r.policy: r for r in results}
    gpufleet = by_name[GPUFLEET]
    assert gpufleet.preemptions >= 1  # the high-priority jobs preempt normal ones
    high_waits = [
        w for p, w in zip(gpufleet.priorities, gpufleet.waits, strict=True) if p == "high"
    ]
    fifo = by_name[FIFO_SPOT]
    fifo_high = [w for p, w in zip(fifo.priorities, fifo.waits, strict=True) if p == "high"]
    assert max(w or 0 for w in high_waits) < max(w or 0 for w in fifo_high)


def test_synthetic_same_seed_same_json() -> None:
    workload = synthetic_workload()
    # A harsh market so that the seed matters: frequent interruptions and launch failures.
    harsh = MarketConfig(hazard_scale=2000.0, spot_launch_failure=0.5)
    first = as_json(workload, run_all(workload, seed=3, cap_gpus=8, market=harsh))
    again = as_json(workload, run_all(workload, seed=3, cap_gpus=8, market=harsh))
    other = as_json(workload, run_all(workload, seed=4, cap_gpus=8, market=harsh))
    assert first == again
    assert first != other


def test_synthetic_harsh_market_still_ends_every_job() -> None:
    workload = synthetic_workload()
    # Each override of a wide spot step is a draw: 0.9 so that a whole step still fails often.
    harsh = MarketConfig(hazard_scale=2000.0, spot_launch_failure=0.9)
    results = run_all(workload, seed=5, market=harsh)
    for r in results:
        assert r.completed + r.failed == r.jobs
        assert r.gpu_seconds_paid >= r.gpu_seconds_useful
    by_name = {r.policy: r for r in results}
    assert by_name[GPUFLEET].interruptions > 0
    assert by_name[GPUFLEET].ondemand_fallbacks > 0
    assert by_name[STATIC_ONDEMAND].interruptions == 0
    # Interruptions use batch-like's retries; the others requeue for as long as it takes.
    assert by_name[GPUFLEET].failed == by_name[FIFO_SPOT].failed == 0


def test_no_checkpoints_loses_all_progress() -> None:
    base = synthetic_workload()
    mapping = TraceMapping(high_share=0.0, checkpoint_interval_seconds=None)
    no_checkpoint = {"checkpoint": None, "checkpoint_interval_seconds": None}
    specs = tuple(s.model_copy(update=no_checkpoint) for s in base.specs)
    workload = Workload(base.jobs, specs, mapping, "no-checkpoints")
    harsh = MarketConfig(hazard_scale=2000.0)
    with_ckpt = {r.policy: r for r in run_all(base, seed=9, market=harsh)}
    without = {r.policy: r for r in run_all(workload, seed=9, market=harsh)}
    kept, lost = with_ckpt[FIFO_SPOT], without[FIFO_SPOT]
    assert lost.interruptions > 0
    assert kept.completed == kept.jobs
    # Every interruption costs the whole run: more is paid for less work done, and the jobs
    # interrupted more often than the Lambdas allow go on, as they do, on on-demand.
    assert lost.gpu_seconds_paid - lost.gpu_seconds_useful > (
        kept.gpu_seconds_paid - kept.gpu_seconds_useful
    )
    assert lost.completed == lost.jobs, lost.failures


# --- A Philly slice on the default market ---------------------------------------------------


@pytest.fixture(scope="module")
def philly_slice() -> Workload:
    if not (PHILLY / "philly.csv").is_file():
        pytest.skip(f"../shared/data is absent: no Philly trace at {PHILLY}")
    trace: Trace = load_trace(PHILLY, "philly", start_days=20, days=1)
    return Workload.from_trace(trace, TraceMapping())


def run_default(
    workload: Workload,
    seed: int,
    cap_gpus: int | None = None,
    names: list[str] | None = None,
) -> list[SimResult]:
    """Every policy on the default market: measured interruptions, finite spot capacity,
    durations from history (the traces read from ../shared/data)."""
    settings = SimSettings()
    measured = settings.load(DATA)
    catalog = load_bundled()
    policies = build_policies(
        names or list(POLICY_NAMES), workload, catalog=catalog, cap_gpus=cap_gpus
    )
    return [
        simulate(
            workload,
            p,
            seed=seed,
            market=settings.market(catalog, workload.mapping.region, seed, measured),
            config=settings.engine_config(),
        )
        for p in policies
    ]


def test_philly_slice_on_the_default_market(philly_slice: Workload) -> None:
    assert len(philly_slice) > 500
    results = run_default(philly_slice, seed=1)
    check_invariants_allowing_failures(philly_slice, results)
    by_name = {r.policy: r for r in results}
    # The market bites: interruptions are counted per job, not per thousand jobs.
    assert by_name[GPUFLEET].interruptions > 0.1 * len(philly_slice)
    assert by_name[GPUFLEET].expected_sources.get("history", 0) > len(philly_slice) // 2
    again = run_default(philly_slice, seed=1, names=[GPUFLEET])
    assert as_json(philly_slice, again) == as_json(philly_slice, [by_name[GPUFLEET]])


def test_philly_slice_under_contention(philly_slice: Workload) -> None:
    """Half the peak: jobs queue, gpufleet preempts, every job still ends."""
    peak = philly_slice.peak_gpus()
    results = run_default(philly_slice, seed=1, cap_gpus=peak // 2)
    check_invariants_allowing_failures(philly_slice, results)
    assert max(max(r.series.queued) for r in results) > 0


def check_invariants_allowing_failures(workload: Workload, results: list[SimResult]) -> None:
    """The invariants, except that batch-like may fail jobs whose interruptions used up their
    retries (on the measured market they do)."""
    bound = cost_lower_bound_usd(workload)
    for r in results:
        assert r.completed + r.failed == r.jobs, r.policy
        if r.policy != BATCH_LIKE:
            assert r.completed == r.jobs, (r.policy, r.failures)
            assert r.cost_usd >= bound, r.policy
        assert r.gpu_seconds_paid >= r.gpu_seconds_useful > 0, r.policy
        assert r.series.cost_usd[-1] == pytest.approx(r.cost_usd, rel=1e-6)


# --- CLI --------------------------------------------------------------------------------------


def write_philly_csv(path: Path, jobs: list[TraceJob]) -> Path:
    """The synthetic jobs in Philly's CSV format (timestamp,duration,num_gpus,gpu_time,cluster)."""
    origin = datetime(2017, 10, 3, 8, 0, 0)
    lines = ["timestamp,duration,num_gpus,gpu_time,cluster"]
    for j in jobs:
        stamp = (origin + timedelta(seconds=j.submit_seconds)).strftime("%Y-%m-%d %H:%M:%S")
        gpu_time = j.duration_seconds * j.gpus
        lines.append(f"{stamp},{j.duration_seconds},{j.gpus},{gpu_time},{j.team}")
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path


def cli(argv: list[str]) -> int:
    return main(["simulate", *argv])


@pytest.fixture
def trace_csv(tmp_path: Path) -> Path:
    return write_philly_csv(tmp_path / "philly.csv", synthetic_jobs())


def test_cli_json_shape(trace_csv: Path, capsys: pytest.CaptureFixture[str]) -> None:
    argv = ["--trace", str(trace_csv), "--format", "philly", "--seed", "1", "--json"]
    assert cli([*argv, *DATA_FREE]) == 0
    document = json.loads(capsys.readouterr().out)
    assert isinstance(document["sim_wall_seconds"], float)
    assert document["trace"]["jobs"] == 20
    assert document["settings"] == {
        "interruptions": "advisor",
        "spot_capacity": "unlimited",
        "durations": "oracle",
        "hazard_scale": 1.0,
    }
    assert list(document["policies"]) == [
        GPUFLEET,
        STATIC_ONDEMAND,
        FIFO_SPOT,
        BATCH_LIKE,
        SKYPILOT_LIKE,
    ]
    for metrics in document["policies"].values():
        assert set(metrics) >= METRIC_KEYS
        assert set(metrics["wait_seconds"]) >= {"p50", "p95", "max", "by_priority"}
        assert set(metrics["jct_seconds"]) == {"p50", "p95"}
        assert metrics["completed"] == metrics["jobs"] == 20
        assert metrics["cost_lower_bound_usd"] <= metrics["cost_usd"]
        above = metrics["cost_above_bound_usd"]
        if above is not None:  # its parts add up to the cost above the bound
            above_bound = metrics["cost_usd"] - metrics["cost_lower_bound_usd"]
            assert sum(above.values()) == pytest.approx(above_bound, abs=0.05)
        for by in metrics["wait_seconds"]["by_priority"].values():
            assert set(by) >= {"p50", "p95", "max"}


def test_cli_defaults_to_the_measured_market(
    trace_csv: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    argv = ["--trace", str(trace_csv), "--format", "philly", "--json", "--compare", "none"]
    missing = tmp_path / "no-data"
    # Asked for by flag, the measured market without its data is an error naming what it needs.
    assert cli([*argv, "--data", str(missing), "--interruptions", "measured"]) == 2
    error = json.loads(capsys.readouterr().err)
    assert error["error"] == "DataMissing"
    assert "--interruptions measured needs the measured spot traces" in error["message"]
    assert str(missing / "traces" / "aws-spot-preemption-bamboo") in error["message"]
    # Left at its defaults, the market without its data is the data-free one, and says so.
    assert cli([*argv, "--data", str(missing)]) == 0
    document = json.loads(capsys.readouterr().out)
    assert document["settings"]["interruptions"] == "advisor"
    assert document["settings"]["spot_capacity"] == "unlimited"
    assert str(missing) in document["market_fallback"]
    if not (DATA / "traces" / "skypilot-spot-traces-nsdi24").is_dir():
        pytest.skip(f"../shared/data is absent at {DATA}")
    assert cli([*argv, "--data", str(DATA)]) == 0
    document = json.loads(capsys.readouterr().out)
    assert document["settings"] == {
        "interruptions": "measured",
        "spot_capacity": "finite",
        "durations": "history",
        "spot_pool_instances": 16,
        "data": str(DATA),
    }
    assert document["market_fallback"] is None


def test_a_fresh_clone_simulates_the_sample_that_ships_and_says_so(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """No shared data folder: Philly's week-long sample, on the data-free market."""
    argv = ["--format", "philly", "--data", str(tmp_path / "no-shared-data"), "--days", "1"]
    assert cli([*argv, "--compare", "none"]) == 0
    out, err = capsys.readouterr()
    assert "sim/data/philly-sample" in err and "SOURCE.md" in err  # where it came from
    assert "data-free market" in err
    assert "simulating gpufleet (1/1)" in err  # progress, on stderr
    assert "philly-sample" in out.splitlines()[0]
    assert cli([*argv, "--compare", "none", "--json"]) == 0
    out, err = capsys.readouterr()
    assert err == ""  # no progress under --json
    document = json.loads(out)
    assert document["trace"]["sample"] is True and document["trace"]["jobs"] > 0
    sample = Path(document["trace"]["path"])
    assert (sample / "SOURCE.md").is_file() and (
        sample / "LICENSE-adaptdl-Apache-2.0.txt"
    ).is_file()
    assert sum(f.stat().st_size for f in sample.iterdir()) < 200_000
    # The other formats ship no sample: the error says what is needed and where.
    assert cli(["--format", "itp", "--data", str(tmp_path), "--json"]) == 2
    error = json.loads(capsys.readouterr().err)
    assert error["error"] == "DataMissing"
    assert "microsoft-itp-elasticflow-2021" in error["message"] and "--trace" in error["message"]


def test_cli_compare_none_and_errors(trace_csv: Path, capsys: pytest.CaptureFixture[str]) -> None:
    argv = ["--trace", str(trace_csv), "--format", "philly", "--json", *DATA_FREE]
    assert cli([*argv, "--policy", "fifo-spot", "--compare", "none"]) == 0
    document = json.loads(capsys.readouterr().out)
    assert list(document["policies"]) == [FIFO_SPOT]
    assert cli([*argv, "--compare", "round-robin"]) == 2
    assert "unknown policy" in capsys.readouterr().err
    assert cli(["--trace", str(trace_csv.parent / "missing.csv"), "--format", "philly"]) == 2
    assert cli([*argv, "--start-days", "30"]) == 2  # an empty window
    assert "no jobs" in capsys.readouterr().err


def test_cli_table(trace_csv: Path, capsys: pytest.CaptureFixture[str]) -> None:
    argv = ["--trace", str(trace_csv), "--format", "philly", "--compare", "fifo-spot", *DATA_FREE]
    assert cli(argv) == 0
    out = capsys.readouterr().out
    assert "gpufleet" in out
    assert "fifo-spot" in out
    assert "utilization" in out


def test_cli_report_writes_pngs_and_html(
    trace_csv: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "report"
    argv = ["--trace", str(trace_csv), "--format", "philly", "--report", str(out), *DATA_FREE]
    assert cli([*argv, "--compare", f"{FIFO_SPOT},{SKYPILOT_LIKE}"]) == 0
    capsys.readouterr()
    page = (out / "index.html").read_text("utf-8")
    names = {name for name, _ in PLOTS}
    assert {"wait_cdf.png", "cost_vs_lower_bound.png", "cost_over_time.png"} <= names
    label = "interruptions advisor, spot capacity unlimited, durations oracle"
    for name, title in PLOTS:
        png = out / name
        assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n", name
        assert f'src="{name}"' in page
        assert f"{title}: philly" in page  # every caption says which run made it
    assert page.count(label) >= len(PLOTS) + 1
    assert "Settings that produced these figures" in page
    for name in (GPUFLEET, FIFO_SPOT, SKYPILOT_LIKE):
        assert f"<th>{name}</th>" in page
    assert "<th>above the bound: spot price over cheapest (USD)</th>" in page


def test_a_teams_backlog_over_its_quota_does_not_hold_back_another_teams_critical_job() -> None:
    # 300 critical jobs of lab, one at a time within its 8 GPUs, wait ahead of one 1-GPU
    # critical job of ops on a half-empty fleet: ops runs in its first pass, not days later
    # when the backlog has drained below the page a pass once read.
    backlog = [
        TraceJob(
            f"lab-{i:03d}", submit_seconds=float(i), duration_seconds=3600.0, gpus=8, team="lab"
        )
        for i in range(300)
    ]
    urgent = TraceJob("ops-1", submit_seconds=600.0, duration_seconds=600.0, gpus=1, team="ops")
    mapping = TraceMapping(high_share=0.0)
    jobs = (*backlog, urgent)
    specs = tuple(
        to_spec(j, mapping).model_copy(update={"priority": Priority.CRITICAL}) for j in jobs
    )
    queue = QueuePolicy(
        max_gpus=16,
        max_instances=16,
        reserve_share=0.0,
        teams={"lab": TeamQuota(gpus=8), "ops": TeamQuota(gpus=8)},
    )
    result = simulate(
        Workload(jobs, specs, mapping, "backlog"), SimPolicy("gpufleet", queue), seed=1
    )
    assert result.completed == len(jobs)
    assert result.waits[-1] is not None and result.waits[-1] < 600.0  # a pass, a launch, a boot
