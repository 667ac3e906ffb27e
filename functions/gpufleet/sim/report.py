"""What a simulation measured: the JSON summary, and a folder of plots with an HTML page.

Metrics per policy (`policy_metrics`):

- `jobs`, `completed`, `failed` (with `failures` by reason: a launch that gave up, retries
  used up, never admitted).
- `cost_usd`: every held instance's price x held time (`domain.cost.run_cost_usd`); the
  static pool from the first submission to the last completion.
- `cost_lower_bound_usd` (the same for every policy, computed from the catalog alone, never
  from a policy's market: no interruptions, no boot, no waiting, no capacity limit): the sum
  over jobs of the job's nodes x the cheapest hourly price seen in the region for an instance
  type that holds one of its nodes (`selection.is_feasible`: GPUs per node, GPU memory, NVIDIA,
  EFA for multi-node; spot, or on-demand where that is cheaper) x its true (trace) duration.
  `cost_vs_lower_bound` = `cost_usd` / that. `cost_above_bound_usd` splits `cost_usd` minus
  the bound: per capacity type the price paid above each job's cheapest (the bound's price,
  `bound.cheapest_hourly_usd`), and `rest` (held hours beyond the work, at that price, and
  failed jobs); null for a static pool.
- `gpu_hours_paid`: instance GPUs x held hours (boot, restore, lost work, drains, idle pool
  included); `gpu_hours_useful`: trace GPUs x trace duration of the completed jobs;
  `utilization` = useful / paid.
- `wait_seconds`: submission to first start of work (admission + launch + boot), p50/p95/max,
  and the same `by_priority` (the job's own class from the mapping, also for policies that
  ignore classes); `jct_seconds`: submission to completion, p50/p95.
- `interruptions` (spot), `requeues` (interruptions and preemptions that went back to the
  queue), `ondemand_fallbacks` (launches on on-demand after the plan's spot step failed),
  `preemptions` (jobs stopped by `decide` to make room); `interruptions_per_job` and
  `preemptions_per_job` over the window's jobs; `expected_duration_sources`: how many launch
  plans were ranked by the spec's duration (`spec`: `--durations oracle`), by the team's
  history (`history`) or by the one-hour default (too little history).

`settings_label(document)` is the one line that says which trace window, cap, seed and market
settings produced a run; it heads every figure and the HTML page.

`write_report(dir, ...)` draws with matplotlib (Agg), imported only there.
"""

from __future__ import annotations

import html
import json
import math
import textwrap
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

from gpufleet.domain.catalog import Catalog, load_bundled
from gpufleet.domain.spec import Priority
from gpufleet.sim.bound import cheapest_hourly_usd
from gpufleet.sim.engine import SimResult, Workload, resource_shape

PLOTS: tuple[tuple[str, str], ...] = (
    ("cost_vs_lower_bound.png", "Cost against the lower bound, per policy"),
    ("cost_over_time.png", "Cost over time, relative to the lower bound"),
    ("wait_cdf.png", "Wait CDF per priority, per policy"),
    ("queue_length.png", "Queue length"),
    ("gpus_held_vs_used.png", "GPUs held vs used"),
)
_PRIORITY_ORDER = [p.value for p in Priority]


def percentile(sorted_values: Sequence[float], q: float) -> float:
    """Linear-interpolated percentile (q in [0, 100]) of already sorted values; 0 if empty."""
    if not sorted_values:
        return 0.0
    position = (len(sorted_values) - 1) * q / 100.0
    low = math.floor(position)
    high = min(low + 1, len(sorted_values) - 1)
    fraction = position - low
    return sorted_values[low] + (sorted_values[high] - sorted_values[low]) * fraction


def _stats(values: Iterable[float], keys: Sequence[str] = ("p50", "p95", "max")) -> dict[str, Any]:
    ordered = sorted(values)
    out: dict[str, Any] = {}
    for key in keys:
        value = ordered[-1] if key == "max" and ordered else percentile(ordered, float(key[1:]))
        if key == "max" and not ordered:
            value = 0.0
        out[key] = round(value, 1)
    return out


def cost_lower_bound_usd(
    workload: Workload, catalog: Catalog | None = None, region: str | None = None
) -> float:
    """Sum over jobs of nodes x the cheapest feasible hourly price x the true duration."""
    cat = catalog or load_bundled()
    where = region or workload.mapping.region
    cache: dict[tuple[object, ...], float] = {}
    total = 0.0
    for job, spec in zip(workload.jobs, workload.specs, strict=True):
        r = spec.resources
        key = resource_shape(r)
        if key not in cache:
            cache[key] = cheapest_hourly_usd(r, cat, where)
        total += r.nodes * cache[key] * job.duration_seconds / 3600.0
    return total


def policy_metrics(result: SimResult, lower_bound_usd: float) -> dict[str, Any]:
    """The JSON object for one policy's run."""
    paid = result.gpu_seconds_paid / 3600.0
    useful = result.gpu_seconds_useful / 3600.0
    waits = [w for w in result.waits if w is not None]
    by_priority: dict[str, list[float]] = {}
    for priority, wait in zip(result.priorities, result.waits, strict=True):
        if wait is not None:
            by_priority.setdefault(priority, []).append(wait)
    ordered = sorted(by_priority, key=lambda p: _PRIORITY_ORDER.index(p))
    return {
        "jobs": result.jobs,
        "completed": result.completed,
        "failed": result.failed,
        "failures": dict(sorted(result.failures.items())),
        "cost_usd": round(result.cost_usd, 2),
        "cost_lower_bound_usd": round(lower_bound_usd, 2),
        "cost_vs_lower_bound": (
            round(result.cost_usd / lower_bound_usd, 4) if lower_bound_usd > 0 else None
        ),
        "cost_above_bound_usd": _cost_above_bound(result, lower_bound_usd),
        "gpu_hours_paid": round(paid, 2),
        "gpu_hours_useful": round(useful, 2),
        "utilization": round(useful / paid, 4) if paid > 0 else 0.0,
        "wait_seconds": {
            **_stats(waits),
            "by_priority": {
                p: {**_stats(by_priority[p]), "jobs": len(by_priority[p])} for p in ordered
            },
        },
        "jct_seconds": _stats((j for j in result.jcts if j is not None), ("p50", "p95")),
        "interruptions": result.interruptions,
        "requeues": result.requeues,
        "ondemand_fallbacks": result.ondemand_fallbacks,
        "preemptions": result.preemptions,
        "interruptions_per_job": round(result.interruptions / result.jobs, 4) if result.jobs else 0,
        "preemptions_per_job": round(result.preemptions / result.jobs, 4) if result.jobs else 0,
        "expected_duration_sources": dict(sorted(result.expected_sources.items())),
        "launches": result.launches,
        "launch_failures": result.launch_failures,
        "dispatch_passes": result.dispatch_passes,
    }


def _cost_above_bound(result: SimResult, lower_bound_usd: float) -> dict[str, float] | None:
    """Where the cost above the bound went: per capacity type, the price paid above each job's
    cheapest (`price_above_cheapest_usd`), and `rest`, what is left: held hours beyond the
    work (boot, restore, work lost to interruptions, drains) at the job's cheapest price, and
    the jobs that failed. None for a static pool, whose instances no job's placement holds."""
    above = result.price_above_cheapest_usd
    if above is None:
        return None
    rest = result.cost_usd - lower_bound_usd - sum(above.values())
    return {**{kind: round(usd, 2) for kind, usd in sorted(above.items())}, "rest": round(rest, 2)}


def summary(
    results: Sequence[SimResult],
    lower_bound_usd: float,
    *,
    context: Mapping[str, Any] | None = None,
    sim_wall_seconds: float | None = None,
) -> dict[str, Any]:
    """The `--json` object: context (trace, seed, cap, ...), each policy, and the wall time."""
    out: dict[str, Any] = dict(context or {})
    out["policies"] = {r.policy: policy_metrics(r, lower_bound_usd) for r in results}
    wall = sum(r.wall_seconds for r in results) if sim_wall_seconds is None else sim_wall_seconds
    out["sim_wall_seconds"] = round(wall, 3)
    return out


def settings_label(document: Mapping[str, Any]) -> str:
    """The trace window, cap, seed and market settings of a run, in one line."""
    parts: list[str] = []
    trace: Mapping[str, Any] = document.get("trace") or {}
    if trace:
        start, days = trace.get("start_days") or 0, trace.get("days")
        window = f"days {start:g}-{start + days:g}" if days else f"from day {start:g}"
        parts.append(f"{trace.get('format', 'trace')} {window} ({trace.get('jobs', '?')} jobs)")
    if "region" in document:
        prices = f" prices of {document['prices_as_of']}" if document.get("prices_as_of") else ""
        parts.append(f"{document['region']}{prices}")
    if "cap_gpus" in document:
        parts.append(f"cap {document['cap_gpus']} GPUs")
    if "seed" in document:
        parts.append(f"seed {document['seed']}")
    settings: Mapping[str, Any] = document.get("settings") or {}
    market = ", ".join(
        f"{key.replace('_', ' ')} {value}" for key, value in settings.items() if key != "data"
    )
    if market:
        parts.append(market)
    return "; ".join(parts)


# --- Plots ------------------------------------------------------------------------------------


# In the cost-over-time plot, a policy that ends this many times above the cheapest one is
# drawn off the scale (its end is in the legend), so the others stay apart.
OFF_SCALE_FACTOR = 3.0


def write_report(
    directory: str | Path, results: Sequence[SimResult], document: Mapping[str, Any]
) -> list[Path]:
    """Write the PNGs of `PLOTS` and `index.html` into `directory`; return the paths written.
    Every figure carries the run's `settings_label` under its title."""
    import matplotlib  # optional dependency (the `sim` extra), only for reports

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    out = Path(directory)
    out.mkdir(parents=True, exist_ok=True)
    start = min((r.series.t[0] for r in results if r.series.t), default=0.0)
    label = textwrap.fill(settings_label(document), 110)
    metrics: Mapping[str, Mapping[str, Any]] = document.get("policies", {})
    bound = next((float(m["cost_lower_bound_usd"]) for m in metrics.values()), 0.0)

    def days(ts: Sequence[float]) -> list[float]:
        return [(t - start) / 86400.0 for t in ts]

    written: list[Path] = []

    def save(fig: Any, name: str, title: str) -> None:
        fig.suptitle(f"{title}\n{label}", fontsize=9)
        fig.tight_layout()
        path = out / name
        fig.savefig(path, dpi=100)
        plt.close(fig)
        written.append(path)

    titles = dict(PLOTS)
    names = [r.policy for r in results]

    fig, ax = plt.subplots(figsize=(8, 4.8))
    ratios = [r.cost_usd / bound if bound > 0 else 0.0 for r in results]
    bars = ax.bar(names, ratios, color="tab:blue")
    labels = [  # a policy that failed jobs did not buy the same work
        f"{x:.2f}x" + (f"\n({r.failed} failed)" if r.failed else "")
        for x, r in zip(ratios, results, strict=True)
    ]
    ax.bar_label(bars, labels=labels)
    ax.axhline(1.0, color="black", linewidth=1, label=f"lower bound (${bound:,.0f})")
    ax.set_ylim(0, max([1.1, *ratios]) * 1.15)
    ax.set_ylabel("cost / lower bound")
    ax.legend(loc="upper left")
    ax.grid(alpha=0.3, axis="y")
    save(fig, PLOTS[0][0], titles[PLOTS[0][0]])

    fig, ax = plt.subplots(figsize=(8, 4.8))
    curves = [[c / bound if bound > 0 else 0.0 for c in r.series.cost_usd] for r in results]
    finals = [curve[-1] if curve else 0.0 for curve in curves]
    # The scale of the policies that end near the cheapest one: a policy far above them (a
    # static cluster paid around the clock) would squash them into one line; it leaves the
    # chart, and its legend entry says where it ends.
    top = max([1.1, *(f for f in finals if f <= OFF_SCALE_FACTOR * max(min(finals), 1.0))])
    for r, curve, final in zip(results, curves, finals, strict=True):
        off = final > top * 1.15
        name = f"{r.policy} (ends at {final:.1f}x, off the scale)" if off else r.policy
        ax.plot(days(r.series.t), curve, label=name)
    ax.set_ylim(0, top * 1.15)
    ax.axhline(1.0, color="black", linewidth=1, linestyle="--", label="lower bound")
    ax.set_xlabel("days since the window's first submission")
    ax.set_ylabel("spent so far / lower bound")
    ax.legend()
    ax.grid(alpha=0.3)
    save(fig, PLOTS[1][0], titles[PLOTS[1][0]])

    priorities = sorted(
        {p for r in results for p in r.priorities}, key=lambda p: _PRIORITY_ORDER.index(p)
    )
    fig, axes = plt.subplots(
        1, len(results), figsize=(4.2 * len(results), 4.2), sharey=True, squeeze=False
    )
    for ax, r in zip(axes[0], results, strict=True):
        for priority in priorities:
            waits = sorted(
                max(1.0, w)
                for p, w in zip(r.priorities, r.waits, strict=True)
                if p == priority and w is not None
            )
            if waits:
                ys = [(i + 1) / len(waits) for i in range(len(waits))]
                ax.step(waits, ys, where="post", label=f"{priority} ({len(waits)})")
        ax.set_xscale("log")
        ax.set_xlabel("wait, submission to running (s, log)")
        ax.set_title(r.policy)
        ax.grid(alpha=0.3)
        ax.legend(loc="lower right")
    axes[0][0].set_ylabel("share of jobs")
    save(fig, PLOTS[2][0], titles[PLOTS[2][0]])

    fig, ax = plt.subplots(figsize=(8, 4.8))
    for r in results:
        ax.step(days(r.series.t), r.series.queued, where="post", label=r.policy)
    ax.set_xlabel("days since the window's first submission")
    ax.set_ylabel("jobs waiting")
    ax.legend()
    ax.grid(alpha=0.3)
    save(fig, PLOTS[3][0], titles[PLOTS[3][0]])

    fig, axes = plt.subplots(
        len(results), 1, figsize=(8, 2.6 * len(results) + 0.8), sharex=True, squeeze=False
    )
    for ax, r in zip(axes[:, 0], results, strict=True):
        xs = days(r.series.t)
        ax.step(xs, r.series.gpus_held, where="post", label="held")
        ax.step(xs, r.series.gpus_used, where="post", label="used")
        ax.set_ylabel("GPUs")
        ax.set_title(r.policy)
        ax.grid(alpha=0.3)
        ax.legend(loc="upper right")
    axes[-1][0].set_xlabel("days since the window's first submission")
    save(fig, PLOTS[4][0], titles[PLOTS[4][0]])

    page = out / "index.html"
    page.write_text(_html(document), encoding="utf-8")
    written.append(page)
    return written


_ROWS: tuple[tuple[str, str], ...] = (
    ("jobs", "jobs"),
    ("completed", "completed"),
    ("failed", "failed"),
    ("cost_usd", "cost (USD)"),
    ("cost_lower_bound_usd", "cost lower bound (USD)"),
    ("cost_vs_lower_bound", "cost / lower bound"),
    ("cost_above_bound_usd.spot", "above the bound: spot price over cheapest (USD)"),
    ("cost_above_bound_usd.on-demand", "above the bound: on-demand price over cheapest (USD)"),
    ("cost_above_bound_usd.rest", "above the bound: the rest (USD)"),
    ("gpu_hours_paid", "GPU-hours paid"),
    ("gpu_hours_useful", "GPU-hours useful"),
    ("utilization", "utilization"),
    ("wait_seconds.p50", "wait p50 (s)"),
    ("wait_seconds.p95", "wait p95 (s)"),
    ("wait_seconds.max", "wait max (s)"),
    *((f"wait_seconds.by_priority.{p}.p95", f"wait p95 {p} (s)") for p in _PRIORITY_ORDER),
    ("jct_seconds.p50", "JCT p50 (s)"),
    ("jct_seconds.p95", "JCT p95 (s)"),
    ("interruptions", "spot interruptions"),
    ("requeues", "requeues"),
    ("ondemand_fallbacks", "on-demand fallbacks"),
    ("preemptions", "preemptions"),
    ("interruptions_per_job", "interruptions per job"),
    ("preemptions_per_job", "preemptions per job"),
)


def _lookup(metrics: Mapping[str, Any], dotted: str) -> Any:
    value: Any = metrics
    for part in dotted.split("."):
        value = value.get(part, "") if isinstance(value, Mapping) else ""
    return value


def _html(document: Mapping[str, Any]) -> str:
    policies: Mapping[str, Mapping[str, Any]] = document.get("policies", {})
    head = "".join(f"<th>{html.escape(name)}</th>" for name in policies)
    rows = "".join(
        "<tr><th>"
        + html.escape(label)
        + "</th>"
        + "".join(f"<td>{html.escape(str(_lookup(m, key)))}</td>" for m in policies.values())
        + "</tr>"
        for key, label in _ROWS
    )
    context = {k: v for k, v in document.items() if k != "policies"}
    label = html.escape(settings_label(document))
    settings = "".join(
        f"<tr><th>{html.escape(str(k))}</th><td>{html.escape(str(v))}</td></tr>"
        for k, v in (document.get("settings") or {}).items()
    )
    images = "".join(
        f'<figure><img src="{name}" alt="{html.escape(title)}">'
        f"<figcaption>{html.escape(title)}: {label}</figcaption></figure>"
        for name, title in PLOTS
    )
    return f"""<!doctype html>
<html lang="en"><head><meta charset="utf-8"><title>gpufleet simulation</title>
<style>
body {{ font-family: sans-serif; margin: 2em; }}
table {{ border-collapse: collapse; }}
th, td {{ border: 1px solid #ccc; padding: 4px 8px; text-align: right; }}
tr th:first-child {{ text-align: left; }}
img {{ max-width: 100%; }}
pre {{ background: #f6f6f6; padding: 1em; }}
</style></head><body>
<h1>gpufleet simulation</h1>
<p>{label}</p>
<h2>Settings that produced these figures</h2>
<table>{settings}</table>
<h2>Policies</h2>
<table><tr><th></th>{head}</tr>{rows}</table>
{images}
<h2>Run</h2>
<pre>{html.escape(json.dumps(context, indent=2, sort_keys=True))}</pre>
</body></html>
"""
