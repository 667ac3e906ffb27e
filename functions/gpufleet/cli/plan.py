"""`gpufleet plan`: which instances a job would get, and what it would cost.

    gpufleet plan job.yaml
    gpufleet plan --gpus 8 --gpu-memory-gib 80 [--gpu-model H100 ...] [--nodes 2]
                  [--spot auto|required|never] [--price-region us-east-1] [--hours 4] [--json]

`--price-region` is the region whose catalog prices are ranked (not a stack's region: `plan`
talks to no AWS API). The prices are the catalog's, of the date it names: the output says it.
Exit codes: 0 ok, 2 bad input or nothing feasible (message on stderr).
"""

from __future__ import annotations

import argparse
import json
import sys
from datetime import UTC, date, datetime
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from gpufleet.cli.output import CliError, ErrorCode, invalid, print_json
from gpufleet.domain.catalog import Catalog, load_bundled
from gpufleet.domain.config import FleetConfig, config_from_yaml
from gpufleet.domain.duration import DEFAULT_SECONDS, DurationEstimate, estimate_duration
from gpufleet.domain.planning import rank_offerings
from gpufleet.domain.selection import Selection
from gpufleet.domain.spec import Resources, SpotPolicy, parse_spec
from gpufleet.domain.templates import apply_template

DEFAULT_REGION = "us-east-1"

_RESOURCE_FLAGS = ("gpus", "gpu_memory_gib", "gpu_model", "nodes", "vcpus", "memory_gib", "arch")


def _positive(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number: {text!r}") from None
    if not value > 0:
        raise argparse.ArgumentTypeError("must be > 0")
    return value


def register(commands: Any) -> None:
    parser: argparse.ArgumentParser = commands.add_parser(
        "plan",
        help="rank the instance offerings a job would run on, by expected cost",
        description="Rank the feasible EC2 offerings for a job spec (FILE) or for resources "
        "given as flags, cheapest expected cost to finish first (spot rework included).",
    )
    parser.add_argument("file", nargs="?", metavar="FILE", help="job spec, YAML or JSON")
    res = parser.add_argument_group("resources (instead of FILE)")
    res.add_argument("--gpus", type=int, help="GPUs per node (0 = CPU only)")
    res.add_argument("--gpu-memory-gib", type=float, help="minimum memory per GPU, GiB")
    res.add_argument(
        "--gpu-model", action="append", metavar="MODEL", help="allowed GPU model (repeatable)"
    )
    res.add_argument("--nodes", type=int, help="number of nodes (default 1)")
    res.add_argument("--vcpus", type=int, help="minimum vCPUs per node")
    res.add_argument("--memory-gib", type=float, help="minimum RAM per node, GiB")
    res.add_argument("--arch", choices=["x86_64", "arm64"], help="CPU architecture")
    parser.add_argument(
        "--spot",
        choices=[p.value for p in SpotPolicy],
        help="spot policy (default: the spec's, else auto)",
    )
    add_price_region_argument(parser)
    parser.add_argument(
        "--catalog",
        metavar="PATH",
        help="a catalog written by `gpufleet catalog refresh` (default: the bundled one)",
    )
    parser.add_argument(
        "--hours",
        type=_positive,
        help="expected run time in hours (default: the spec's expected_duration, else 1)",
    )
    parser.add_argument(
        "--checkpoint-hours",
        type=_positive,
        help="checkpoint interval in hours (default: the spec's checkpoint_interval, else none)",
    )
    add_config_argument(parser, "where a spec's `template:` is looked up")
    parser.add_argument(
        "--limit",
        type=int,
        default=10,
        help="offerings to show, in the text and the JSON alike (%(default)s)",
    )
    parser.set_defaults(run=run)


def add_price_region_argument(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--price-region",
        default=DEFAULT_REGION,
        metavar="REGION",
        help="the region whose catalog prices are ranked (%(default)s)",
    )


def prices_as_of(catalog: Catalog, today: date | None = None) -> dict[str, Any]:
    """The date of the catalog's prices and their age in days, for every output that shows a
    price (the bundled catalog is a snapshot; `gpufleet catalog refresh` reads today's)."""
    if catalog.generated is None:
        return {"date": None, "age_days": None}
    generated = date.fromisoformat(catalog.generated)
    return {
        "date": catalog.generated,
        "age_days": ((today or datetime.now(UTC).date()) - generated).days,
    }


def prices_note(prices: dict[str, Any]) -> str:
    if prices["date"] is None:
        return "prices: undated catalog"
    age = prices["age_days"]
    stale = "; `gpufleet catalog refresh` reads today's" if age > 30 else ""
    return f"prices: catalog of {prices['date']} ({age} days old{stale})"


def load_catalog(path: str | None) -> Catalog:
    """The bundled catalog, or one `gpufleet catalog refresh` wrote."""
    if path is None:
        return load_bundled()
    try:
        return Catalog.from_document(json.loads(Path(path).read_text(encoding="utf-8")))
    except OSError as exc:
        raise CliError(
            f"cannot read the catalog {path}: {exc.strerror}", ErrorCode.NOT_FOUND
        ) from None
    except ValueError as exc:
        raise invalid(f"cannot load the catalog {path}: {exc}") from None


def add_config_argument(parser: argparse.ArgumentParser, purpose: str) -> None:
    parser.add_argument(
        "--config",
        default="gpufleet.yaml",
        help=f"the fleet config file, {purpose} (%(default)s)",
    )


def read_fleet_config(path: str) -> FleetConfig:
    """The fleet config at `path`; a ConfigFileError is reported as InvalidConfig."""
    try:
        text = Path(path).read_text(encoding="utf-8")
    except OSError as exc:
        raise CliError(f"cannot read {path}: {exc.strerror}", ErrorCode.NOT_FOUND) from None
    return config_from_yaml(text)


def run(args: argparse.Namespace) -> int:
    flags = [f for f in _RESOURCE_FLAGS if getattr(args, f) is not None]
    spot = SpotPolicy(args.spot) if args.spot else SpotPolicy.AUTO
    estimate = (
        DurationEstimate(round(args.hours * 3600), "flag")
        if args.hours
        else DurationEstimate(DEFAULT_SECONDS, "default")
    )
    checkpoint_seconds = round(args.checkpoint_hours * 3600) if args.checkpoint_hours else None
    if args.limit < 1:
        raise invalid("--limit must be >= 1")
    needs_instance_store = False
    if args.file:
        if flags:
            raise invalid(
                "give a spec FILE or resource flags, not both "
                f"(got --{', --'.join(f.replace('_', '-') for f in flags)})"
            )
        try:
            raw = sys.stdin.buffer.read() if args.file == "-" else Path(args.file).read_bytes()
        except OSError as exc:
            raise CliError(
                f"cannot read {args.file}: {exc.strerror}", ErrorCode.NOT_FOUND
            ) from None
        spec = parse_spec(raw)  # a SpecError is reported with its fields
        if spec.template is not None or spec.stages:
            # As intake reads it: the template's resources, the spec's fields laid over them.
            spec = apply_template(spec, read_fleet_config(args.config).templates)
        resources = spec.resources
        needs_instance_store = spec.needs_instance_store
        if not args.spot:
            spot = spec.spot
        if args.hours is None:
            estimate = estimate_duration(spec, history=[])
        if checkpoint_seconds is None:
            checkpoint_seconds = spec.checkpoint_interval_seconds
    else:
        if not flags:
            raise invalid("give a spec FILE or at least --gpus (see gpufleet plan --help)")
        values: dict[str, Any] = {
            "gpus": args.gpus,
            "gpu_memory_gib": args.gpu_memory_gib,
            "gpu_models": args.gpu_model,
            "nodes": args.nodes,
            "vcpus": args.vcpus,
            "memory_gib": args.memory_gib,
            "arch": args.arch,
        }
        try:
            resources = Resources(**{k: v for k, v in values.items() if v is not None})
        except ValidationError as exc:
            problems = "; ".join(
                f"--{'-'.join(str(p) for p in e['loc'][:1]).replace('_', '-')}: {e['msg']}"
                for e in exc.errors(include_url=False)
            )
            raise invalid(problems) from None
    catalog = load_catalog(args.catalog)
    # NoFeasibleOffering is reported with the constraint that ruled out all.
    selection = rank_offerings(
        resources,
        spot,
        catalog,
        args.price_region,
        expected=estimate,
        checkpoint_interval_seconds=checkpoint_seconds,
        limit=args.limit,
        needs_instance_store=needs_instance_store,
    )
    prices = prices_as_of(catalog)
    if args.json:
        document = to_json(selection)
        document["more_feasible"] = selection.feasible_count - len(selection.ranked)
        document["price_region"] = selection.region
        document["prices_as_of"] = prices
        document["expected_duration"] = {"seconds": estimate.seconds, "source": estimate.source}
        print_json(document)
    else:
        checkpoint = None if checkpoint_seconds is None else checkpoint_seconds / 3600
        print(render(selection, resources, spot, estimate.seconds / 3600, checkpoint))
        source = "--hours" if estimate.source == "flag" else estimate.describe()
        print(f"\nexpected run time {_duration(estimate.seconds)}: {source}")
        print(prices_note(prices))
    return 0


def to_json(selection: Selection) -> dict[str, Any]:
    return {
        "offerings": [
            {
                "instance_type": r.offering.instance_type.name,
                "zone": r.offering.zone,
                "capacity_type": r.offering.capacity_type,
                "hourly_usd": r.offering.hourly_usd,
                "expected_cost_usd": round(r.expected_cost_usd, 4),
                "gpus": r.offering.instance_type.gpus,
                "gpu_model": r.offering.instance_type.gpu_model,
                "gpu_memory_gib": r.offering.instance_type.gpu_memory_gib,
            }
            for r in selection.ranked
        ]
    }


def render(
    selection: Selection,
    resources: Resources,
    spot: SpotPolicy,
    hours: float,
    checkpoint: float | None,
) -> str:
    if resources.gpus:
        models = f" {'/'.join(resources.gpu_models)}" if resources.gpu_models else ""
        ask = f"{resources.gpus}x GPU{models} (>= {resources.gpu_memory_gib:g} GiB each)"
    else:
        ask = "CPU only"
    ask += f", >= {resources.vcpus} vCPU, >= {resources.memory_gib:g} GiB RAM, {resources.arch}"
    ckpt = f"checkpoint every {checkpoint:g} h" if checkpoint else "no checkpoints"
    head = (
        f"{ask} x {resources.nodes} node{'s' if resources.nodes > 1 else ''} in "
        f"{selection.region}; spot {spot.value}; {hours:g} h expected, {ckpt}"
    )
    rows = [["#", "INSTANCE TYPE", "ZONE", "CAPACITY", "GPUS", "$/HOUR", "NODES", "EXPECTED $"]]
    for i, r in enumerate(selection.ranked, 1):
        it = r.offering.instance_type
        gpus = f"{it.gpus}x {it.gpu_model} {it.gpu_memory_gib:g}G" if it.gpus else "-"
        rows.append(
            [
                str(i),
                it.name,
                r.offering.zone or f"({r.offering.region})",
                r.offering.capacity_type,
                gpus,
                f"{r.offering.hourly_usd:.4f}",
                str(r.nodes),
                f"{r.expected_cost_usd:,.2f}",
            ]
        )
    right = {0, 5, 6, 7}
    widths = [max(len(row[c]) for row in rows) for c in range(len(rows[0]))]
    lines = [head, ""]
    for n, row in enumerate(rows):
        cells = [
            cell.rjust(widths[c]) if c in right else cell.ljust(widths[c])
            for c, cell in enumerate(row)
        ]
        reason = "REASON" if n == 0 else selection.ranked[n - 1].reason
        lines.append("  ".join([*cells, reason]))
    more = selection.feasible_count - len(selection.ranked)
    if more > 0:
        lines.append(f"... and {more} more feasible offerings (--limit to see them)")
    return "\n".join(lines)


def _duration(seconds: int) -> str:
    hours, rest = divmod(seconds, 3600)
    return f"{hours}h{rest // 60:02d}m" if hours else f"{rest // 60}m"
