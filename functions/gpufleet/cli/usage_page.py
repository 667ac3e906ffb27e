"""`gpufleet report ID [--out DIR]`: a page of the job's usage curves and its timeline.

    gpufleet report ID [--out DIR] [--json]

Writes DIR/usage.png (GPU utilization and GPU memory used per GPU, host CPU and memory, each
node's curves from its `runs/<job>/usage/<instance>.json`), DIR/timeline.png (queued,
launching, each node's runs, held after the run; checkpoint, interruption and release marks)
and DIR/index.html with both, the peaks and means, and the timeline as a table. DIR defaults to
`gpufleet-report-ID`. Everything the job says (its name, team, reasons, ids) is HTML-escaped.
"""

from __future__ import annotations

import argparse
import html
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from gpufleet.cli.output import print_json
from gpufleet.cli.png import FRAME, GRID, PALETTE, Canvas, Color
from gpufleet.cli.target import add_target_arguments, connect
from gpufleet.domain.job import Job
from gpufleet.domain.run_timeline import (
    HELD_AFTER,
    LAUNCHING,
    QUEUED,
    RELEASED,
    RUNNING,
    Timeline,
    timeline,
)
from gpufleet.domain.usage_layout import (
    EVENT_CHECKPOINT,
    EVENT_INTERRUPTED,
    NodeUsage,
    Sample,
    UsageSummary,
    summarize,
)

WIDTH = 960
PANEL_HEIGHT = 150
MARGIN = 10
PHASE_COLORS: dict[str, Color] = {
    QUEUED: (189, 189, 189),
    LAUNCHING: (255, 187, 120),
    RUNNING: (44, 160, 44),
    HELD_AFTER: (214, 39, 40),
}
MARK_COLORS: dict[str, Color] = {
    EVENT_CHECKPOINT: (31, 119, 180),
    EVENT_INTERRUPTED: (214, 39, 40),
    RELEASED: (0, 0, 0),
}
ROW_HEIGHT = 28


def register(commands: Any) -> None:
    report = commands.add_parser(
        "report", help="write a page of a job's usage curves and timeline (PNG and HTML)"
    )
    report.add_argument("job_id", metavar="ID")
    report.add_argument("--out", type=Path, help="the folder to write (default gpufleet-report-ID)")
    add_target_arguments(report)
    report.set_defaults(run=run_report)


def run_report(args: argparse.Namespace) -> int:
    connection = connect(args)
    job = connection.jobs.get(args.job_id)
    nodes = connection.usage.of_job(job.job_id)
    out: Path = args.out or Path(f"gpufleet-report-{job.job_id}")
    files = write_report(job, nodes, out, now=time.time())
    if args.json:
        print_json({"job": job.job_id, "out": str(out), "files": [str(f) for f in files]})
    else:
        print(f"wrote {out / 'index.html'} ({len(nodes)} node(s) of usage)")
    return 0


def write_report(job: Job, nodes: Sequence[NodeUsage], out: Path, now: float) -> list[Path]:
    """The page's three files in `out` (made if missing)."""
    out.mkdir(parents=True, exist_ok=True)
    line = timeline(job, nodes, now)
    usage_png, timeline_png, page = out / "usage.png", out / "timeline.png", out / "index.html"
    panels = usage_panels(nodes)
    start, end = _span(line, nodes)
    usage_png.write_bytes(draw_usage(panels, start, end))
    timeline_png.write_bytes(draw_timeline(line, [n.instance_id for n in nodes], start, end))
    page.write_text(render_page(job, nodes, line, panels, start, end))
    return [page, usage_png, timeline_png]


Series = tuple[str, tuple[tuple[float, float], ...]]  # (label, ((t, value), ...))


@dataclass(frozen=True)
class Panel:
    title: str
    unit: str
    top: float  # the y axis' top
    series: tuple[Series, ...]


def usage_panels(nodes: Sequence[NodeUsage]) -> list[Panel]:
    def per_gpu(
        values: Callable[[Sample], tuple[float | None, ...]], scale: float
    ) -> tuple[Series, ...]:
        series: list[Series] = []
        for node in nodes:
            width = max((len(values(s)) for s in node.samples), default=0)
            for gpu in range(width):
                points = tuple(
                    (s.t, v / scale)
                    for s in node.samples
                    if gpu < len(values(s)) and (v := values(s)[gpu]) is not None
                )
                series.append((f"{node.instance_id} GPU {gpu}", points))
        return tuple(series)

    def per_node(value: Callable[[Sample], float | None], scale: float) -> tuple[Series, ...]:
        return tuple(
            (
                node.instance_id,
                tuple((s.t, v / scale) for s in node.samples if (v := value(s)) is not None),
            )
            for node in nodes
        )

    gib = 1024.0
    gpu_total = max((t for n in nodes for t in n.gpu_mem_total_mib), default=0.0) / gib
    host_total = max((n.host_mem_total_mib or 0.0 for n in nodes), default=0.0) / gib
    panels = [
        Panel("GPU utilization", "%", 100.0, per_gpu(lambda s: s.gpu_util, 1.0)),
        Panel("GPU memory used", "GiB", gpu_total, per_gpu(lambda s: s.gpu_mem_mib, gib)),
        Panel("Host CPU", "%", 100.0, per_node(lambda s: s.cpu_percent, 1.0)),
        Panel("Host memory used", "GiB", host_total, per_node(lambda s: s.mem_mib, gib)),
    ]
    return [_with_top(p) for p in panels]


def _with_top(panel: Panel) -> Panel:
    """The panel's axis reaches its largest value when the total is unknown or exceeded."""
    peak = max((v for _, points in panel.series for _, v in points), default=0.0)
    return Panel(panel.title, panel.unit, max(panel.top, peak, 1.0), panel.series)


def _span(line: Timeline, nodes: Sequence[NodeUsage]) -> tuple[float, float]:
    times = [s.t for n in nodes for s in n.samples]
    start = min([line.start, *times]) if line.spans or line.marks else min(times, default=0.0)
    end = max([line.end, *times]) if line.spans or line.marks else max(times, default=1.0)
    return start, max(end, start + 1.0)


def draw_usage(panels: Sequence[Panel], start: float, end: float) -> bytes:
    canvas = Canvas(WIDTH, len(panels) * (PANEL_HEIGHT + MARGIN) + MARGIN)
    for index, panel in enumerate(panels):
        top = MARGIN + index * (PANEL_HEIGHT + MARGIN)
        bottom, left, right = top + PANEL_HEIGHT, MARGIN, WIDTH - MARGIN
        for quarter in (1, 2, 3):
            y = bottom - quarter * PANEL_HEIGHT // 4
            canvas.line(left, y, right, y, GRID)
        canvas.frame(left, top, right, bottom)
        for number, (_, points) in enumerate(panel.series):
            xy = [
                (
                    left + round((t - start) / (end - start) * (right - left)),
                    bottom - round(min(v, panel.top) / panel.top * PANEL_HEIGHT),
                )
                for t, v in points
            ]
            canvas.polyline(xy, PALETTE[number % len(PALETTE)])
    return canvas.png()


def draw_timeline(line: Timeline, instances: Sequence[str], start: float, end: float) -> bytes:
    rows = ["job", *instances]
    canvas = Canvas(WIDTH, MARGIN * 2 + ROW_HEIGHT * len(rows))
    left, right = MARGIN, WIDTH - MARGIN

    def x_of(t: float) -> int:
        return left + round((t - start) / (end - start) * (right - left))

    for span in line.spans:
        row = rows.index(span.instance_id) if span.instance_id in rows else 0
        top = MARGIN + row * ROW_HEIGHT + 4
        canvas.fill(
            x_of(span.start), top, x_of(span.end), top + ROW_HEIGHT - 8, PHASE_COLORS[span.phase]
        )
    for mark in line.marks:
        x = x_of(mark.t)
        canvas.fill(x - 1, MARGIN, x + 1, MARGIN + ROW_HEIGHT * len(rows), MARK_COLORS[mark.name])
    canvas.frame(left, MARGIN, right, MARGIN + ROW_HEIGHT * len(rows), FRAME)
    return canvas.png()


def _utc(t: float) -> str:
    return time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(t))


def _duration(seconds: float) -> str:
    minutes, secs = divmod(round(seconds), 60)
    hours, minutes = divmod(minutes, 60)
    return f"{hours}h{minutes:02d}m{secs:02d}s" if hours else f"{minutes}m{secs:02d}s"


def _hex(color: Color) -> str:
    return "#{:02x}{:02x}{:02x}".format(*color)


def summary_rows(summary: UsageSummary) -> list[tuple[str, float | None, float | None, str]]:
    return [
        ("GPU utilization", summary.gpu_util_percent.peak, summary.gpu_util_percent.mean, "%"),
        (
            "GPU memory used (fullest GPU)",
            summary.gpu_mem_mib.peak,
            summary.gpu_mem_mib.mean,
            "MiB",
        ),
        ("Host CPU", summary.cpu_percent.peak, summary.cpu_percent.mean, "%"),
        ("Host memory used", summary.host_mem_mib.peak, summary.host_mem_mib.mean, "MiB"),
    ]


def render_page(
    job: Job,
    nodes: Sequence[NodeUsage],
    line: Timeline,
    panels: Sequence[Panel],
    start: float,
    end: float,
) -> str:
    e = html.escape
    summary = summarize(nodes)

    def number(value: float | None) -> str:
        return "n/a" if value is None else f"{value:,.1f}"

    stats = "".join(
        f"<tr><td>{e(name)}</td><td>{number(peak)} {unit}</td><td>{number(mean)} {unit}</td></tr>"
        for name, peak, mean, unit in summary_rows(summary)
    )
    legends = "".join(
        f"<h3>{e(p.title)} <small>(0 to {p.top:,.1f} {e(p.unit)})</small></h3><ul>"
        + "".join(
            f'<li><span class="swatch" style="background:{_hex(PALETTE[i % len(PALETTE)])}">'
            f"</span>{e(label)}</li>"
            for i, (label, _) in enumerate(p.series)
        )
        + "</ul>"
        for p in panels
    )
    spans = "".join(
        f"<tr><td>{e(s.phase)}</td><td>{e(s.instance_id or '')}</td><td>{_utc(s.start)}</td>"
        f"<td>{_utc(s.end)}</td><td>{_duration(s.end - s.start)}</td></tr>"
        for s in line.spans
    ) + "".join(
        f"<tr><td>{e(m.name)}</td><td>{e(m.instance_id or '')}</td><td>{_utc(m.t)}</td>"
        "<td></td><td></td></tr>"
        for m in line.marks
    )
    key = "".join(
        f'<li><span class="swatch" style="background:{_hex(c)}"></span>{e(name)}</li>'
        for name, c in (*PHASE_COLORS.items(), *MARK_COLORS.items())
    )
    title = f"{job.spec.name} ({job.job_id})"
    return f"""<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8">
<title>gpufleet report: {e(title)}</title>
<style>
body {{ font-family: sans-serif; margin: 2em; color: #222; }}
table {{ border-collapse: collapse; margin: 1em 0; }}
td, th {{ border: 1px solid #ccc; padding: 0.2em 0.6em; text-align: left; }}
.swatch {{ display: inline-block; width: 1em; height: 0.7em; margin-right: 0.4em; }}
ul {{ list-style: none; padding-left: 0; columns: 3; }}
</style></head>
<body>
<h1>{e(title)}</h1>
<p>team {e(job.spec.team)} · status {e(job.status.value)} · {len(nodes)} node(s) ·
{summary.samples} sample(s) · {_utc(start)} to {_utc(end)} ({_duration(end - start)})</p>
<h2>Peaks and means</h2>
<table><tr><th></th><th>peak</th><th>mean</th></tr>{stats}</table>
<h2>Usage</h2>
<img src="usage.png" alt="GPU utilization, GPU memory, host CPU and host memory over the run"
 width="{WIDTH}">
{legends}
<h2>Timeline</h2>
<img src="timeline.png" alt="the job's timeline: first row the job, then one row per node"
 width="{WIDTH}">
<ul>{key}</ul>
<table><tr><th>phase</th><th>node</th><th>from</th><th>to</th><th>for</th></tr>{spans}</table>
</body></html>
"""
