"""`gpufleet templates`: the resource templates of the fleet config, and what each gets now.

    gpufleet templates [--config gpufleet.yaml] [--price-region us-east-1] [--json]

For every template: its resources and the instance a job using it would get now, which is
the first choice of `gpufleet plan` for those resources (bundled catalog, spot policy auto,
the default expected run time of one hour). A template nothing in the region fits is listed
with the reason. Reservations in the config are not considered (`gpufleet plan` ignores them
too); a job that fits a free reservation launches into it first. The prices are the bundled
catalog's, and the output names its date.

Exit codes: 0 ok (also when a template fits nothing: its reason is shown), 2 the config cannot
be read or is invalid.
"""

from __future__ import annotations

import argparse
from typing import Any

from gpufleet.cli.output import print_json
from gpufleet.cli.plan import (
    add_config_argument,
    add_price_region_argument,
    prices_as_of,
    prices_note,
    read_fleet_config,
    to_json,
)
from gpufleet.domain.catalog import Catalog, load_bundled
from gpufleet.domain.duration import DEFAULT_SECONDS
from gpufleet.domain.selection import NoFeasibleOffering, select
from gpufleet.domain.spec import Resources, SpotPolicy


def register(commands: Any) -> None:
    parser: argparse.ArgumentParser = commands.add_parser(
        "templates",
        help="list the resource templates and the instance each would get now",
        description="List the resource templates of the fleet config (a job spec names one "
        "with `template: NAME`) and, for each, the instance `gpufleet plan` would choose first.",
    )
    add_config_argument(parser, "whose templates are listed")
    add_price_region_argument(parser)
    parser.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    config = read_fleet_config(args.config)
    catalog = load_bundled()
    region = args.price_region
    listing = [
        {
            "name": name,
            "resources": resources.model_dump(mode="json"),
            **first_choice(resources, catalog, region),
        }
        for name, resources in sorted(config.templates.items())
    ]
    prices = prices_as_of(catalog)
    if args.json:
        print_json({"price_region": region, "prices_as_of": prices, "templates": listing})
    else:
        print(render(listing, region, args.config, prices_note(prices)))
    return 0


def first_choice(resources: Resources, catalog: Catalog, region: str) -> dict[str, Any]:
    """`{"instance": offering}` as in `gpufleet plan --json`, or `{"instance": None,
    "no_instance": reason}` when nothing in the region fits."""
    try:
        selection = select(
            resources,
            SpotPolicy.AUTO,
            catalog,
            region,
            expected_hours=DEFAULT_SECONDS / 3600,
            limit=1,
        )
    except NoFeasibleOffering as exc:
        return {"instance": None, "no_instance": exc.message}
    return {"instance": to_json(selection)["offerings"][0]}


def _summary(resources: dict[str, Any]) -> str:
    if resources["gpus"]:
        models = "/".join(resources["gpu_models"]) or "GPU"
        ask = f"{resources['gpus']}x {models} >={resources['gpu_memory_gib']:g}G"
    else:
        ask = "CPU"
    ask += f", >={resources['vcpus']} vCPU, >={resources['memory_gib']:g} GiB"
    if resources["arch"] != "x86_64":
        ask += f", {resources['arch']}"
    if resources["nodes"] > 1:
        ask += f", {resources['nodes']} nodes"
    return ask


def render(listing: list[dict[str, Any]], region: str, config_path: str, prices: str) -> str:
    if not listing:
        return f"{config_path} defines no templates (see docs/templates.md)"
    rows = [["TEMPLATE", "RESOURCES (PER NODE)", "INSTANCE NOW", "CAPACITY", "$/HOUR", "ZONE"]]
    notes = []
    for entry in listing:
        instance = entry["instance"]
        if instance is None:
            rows.append([entry["name"], _summary(entry["resources"]), "-", "-", "-", "-"])
            notes.append(f"{entry['name']}: {entry['no_instance']}")
            continue
        rows.append(
            [
                entry["name"],
                _summary(entry["resources"]),
                instance["instance_type"],
                instance["capacity_type"],
                f"{instance['hourly_usd']:.4f}",
                instance["zone"] or f"({region})",
            ]
        )
    widths = [max(len(row[c]) for row in rows) for c in range(len(rows[0]))]
    lines = [
        f"templates in {config_path}, first choice in {region} (spot auto, 1 h); {prices}:",
        "",
    ]
    lines += [
        "  ".join(
            cell.rjust(w) if c == 4 else cell.ljust(w)
            for c, (cell, w) in enumerate(zip(row, widths, strict=True))
        ).rstrip()
        for row in rows
    ]
    return "\n".join([*lines, *(f"no instance for {note}" for note in notes)])
