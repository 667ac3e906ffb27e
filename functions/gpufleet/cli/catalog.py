"""`gpufleet catalog`: inspect the bundled instance catalog, or rebuild one from the AWS APIs.

    gpufleet catalog show [--region R] [--json]
    gpufleet catalog refresh --region R [--region R2 ...] [--out PATH] [--json]

`refresh` reads DescribeInstanceTypes, DescribeAvailabilityZones and DescribeSpotPriceHistory
in each region and the Price List API (us-east-1 endpoint) with the default AWS credentials,
keeps interruption buckets from the bundled catalog (they are in no AWS API), checks that the
result loads, and writes it (default ./catalog.json). It does not replace the bundled catalog.

`show` (and `show --price-region R`) prints the catalog's date with its prices.

Exit codes: 0 ok, 1 the APIs could not be read or gave no usable catalog, 2 bad input.
"""

from __future__ import annotations

import argparse
from collections.abc import Mapping, Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from gpufleet.cli.output import EXIT_UNEXPECTED, CliError, ErrorCode, invalid, print_json
from gpufleet.domain.catalog import CatalogError, bundled_document, load_bundled
from gpufleet.domain.catalog_refresh import STD_REGION, RefreshError, RegionPages, dumps
from gpufleet.services.catalog_refresh import Fetch, refreshed_document

DEFAULT_OUT = Path("catalog.json")


def register(commands: Any) -> None:
    parser: argparse.ArgumentParser = commands.add_parser(
        "catalog",
        help="show the instance catalog, or refresh one from the AWS APIs",
        description="Show the bundled instance catalog, or rebuild one from the AWS APIs.",
    )
    actions = parser.add_subparsers(dest="catalog_command", required=True, metavar="ACTION")
    show = actions.add_parser(
        "show",
        help="summarise the bundled catalog",
        description="Summarise the bundled catalog: instance types, regions, offerings, "
        "sources and their dates. With --region, the region's instance types and prices.",
    )
    show.add_argument(
        "--price-region", metavar="REGION", help="one region's instance types and prices"
    )
    show.set_defaults(run=run_show)
    refresh = actions.add_parser(
        "refresh",
        help="rebuild the catalog from the AWS APIs",
        description="Rebuild the catalog from DescribeInstanceTypes, DescribeSpotPriceHistory "
        "and the Price List API (GetProducts), with the default AWS credentials. Interruption "
        "buckets are kept from the bundled catalog. Writes a file; the bundled catalog is not "
        "changed.",
    )
    refresh.add_argument(
        "--region",
        action="append",
        required=True,
        metavar="REGION",
        help="region to read (repeatable)",
    )
    refresh.add_argument(
        "--out", type=Path, default=DEFAULT_OUT, help="catalog JSON to write (%(default)s)"
    )
    refresh.set_defaults(run=run_refresh)


def _unusable(message: str) -> CliError:
    """The APIs could not be read, or gave nothing usable: exit 1."""
    return CliError(message, ErrorCode.AWS_ERROR, exit_code=EXIT_UNEXPECTED)


# --- refresh ----------------------------------------------------------------------------------


def aws_fetch(regions: Sequence[str], at: datetime) -> list[RegionPages]:
    """Read the APIs with the default credentials (boto3 stays in the adapters)."""
    from gpufleet.adapters.aws.catalog_source import fetch_with_default_clients

    return fetch_with_default_clients(regions, at)


def refresh(
    regions: Sequence[str],
    *,
    now: datetime,
    fetch: Fetch = aws_fetch,
    previous: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    """A refreshed catalog document, checked to load. Raises RefreshError or CatalogError."""
    return refreshed_document(
        fetch(regions, now), now=now, previous=bundled_document() if previous is None else previous
    )


def run_refresh(args: argparse.Namespace) -> int:
    regions: list[str] = list(dict.fromkeys(args.region))
    bad = [r for r in regions if not STD_REGION.match(r)]
    if bad:
        raise invalid(f"not a standard AWS region: {', '.join(bad)}")
    try:
        # Credentials, access denied, no network: the runner reports botocore's errors.
        doc = refresh(regions, now=datetime.now(UTC))
    except (RefreshError, CatalogError) as exc:
        raise _unusable(f"no usable catalog: {exc}") from None
    text = dumps(doc)
    out: Path = args.out
    try:
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(text, encoding="utf-8")
    except OSError as exc:
        raise CliError(f"cannot write {out}: {exc.strerror}", exit_code=EXIT_UNEXPECTED) from None
    summary = {"out": str(out), "bytes": len(text.encode()), **summarize(doc)}
    if args.json:
        print_json(summary)
    else:
        print(f"wrote {out} ({summary['bytes'] / 1024:.0f} KiB)")
        print(render(summary))
        print(
            "the bundled catalog (functions/gpufleet/catalog/catalog.json) is unchanged; a "
            "deployed stack refreshes its own daily (CatalogRefresh)"
        )
    return 0


# --- show -------------------------------------------------------------------------------------


def summarize(doc: Mapping[str, Any], region: str | None = None) -> dict[str, Any]:
    """Counts per region, sources and dates of a catalog document."""
    types = {t["name"]: t for t in doc.get("instance_types", [])}
    regions: dict[str, dict[str, Any]] = {}
    for o in doc.get("offerings", []):
        if region and o["region"] != region:
            continue
        r = regions.setdefault(
            o["region"],
            {"instance_types": set(), "rows": 0, "on_demand": 0, "spot": 0, "with_bucket": 0},
        )
        r["instance_types"].add(o["instance_type"])
        r["rows"] += 1
        r["on_demand"] += o.get("on_demand_usd_per_hour") is not None
        r["spot"] += o.get("spot_usd_per_hour") is not None
        r["with_bucket"] += o.get("interruption_bucket") is not None
    accelerated = sum(1 for t in types.values() if t["accelerator"] != "none")
    return {
        "generated": doc.get("generated"),
        "instance_types": len(types),
        "accelerated": accelerated,
        "cpu_only": len(types) - accelerated,
        "offering_rows": sum(r["rows"] for r in regions.values()),
        "priced_offerings": sum(r["on_demand"] + r["spot"] for r in regions.values()),
        "regions": {
            name: {**r, "instance_types": len(r["instance_types"])}
            for name, r in sorted(regions.items())
        },
        "sources": [
            {
                "source": s.get("api") or s.get("file"),
                "date": s.get("date"),
                "used_for": s.get("used_for"),
            }
            for s in doc.get("sources", [])
        ],
        "corrections": len(doc.get("corrections", [])),
    }


def region_detail(doc: Mapping[str, Any], region: str) -> list[dict[str, Any]]:
    """Per instance type in `region`: specs, cheapest on-demand and spot, zones."""
    types = {t["name"]: t for t in doc.get("instance_types", [])}
    rows: dict[str, dict[str, Any]] = {}
    for o in doc.get("offerings", []):
        if o["region"] != region:
            continue
        t = types[o["instance_type"]]
        row = rows.setdefault(
            t["name"],
            {
                "instance_type": t["name"],
                "accelerator": t["accelerator"],
                "gpu_model": t["gpu_model"],
                "gpus": t["gpus"],
                "gpu_memory_gib": t["gpu_memory_gib"],
                "gpu_fraction": t.get("gpu_fraction"),
                "vcpus": t["vcpus"],
                "memory_gib": t["memory_gib"],
                "on_demand_usd_per_hour": None,
                "min_spot_usd_per_hour": None,
                "zones": [],
            },
        )
        od, spot = o.get("on_demand_usd_per_hour"), o.get("spot_usd_per_hour")
        if od is not None:
            row["on_demand_usd_per_hour"] = min(od, row["on_demand_usd_per_hour"] or od)
        if spot is not None:
            row["min_spot_usd_per_hour"] = min(spot, row["min_spot_usd_per_hour"] or spot)
        if o.get("zone"):
            row["zones"].append(o["zone"])
    return [rows[k] for k in sorted(rows)]


def _table(rows: list[list[str]], right: set[int]) -> list[str]:
    widths = [max(len(row[c]) for row in rows) for c in range(len(rows[0]))]
    return [
        "  ".join(
            cell.rjust(widths[c]) if c in right else cell.ljust(widths[c])
            for c, cell in enumerate(row)
        ).rstrip()
        for row in rows
    ]


def render(summary: Mapping[str, Any]) -> str:
    lines = [
        f"catalog generated {summary['generated']}: {summary['instance_types']} instance types "
        f"({summary['accelerated']} accelerated, {summary['cpu_only']} CPU-only), "
        f"{summary['offering_rows']} offering rows ({summary['priced_offerings']} priced "
        f"offerings) in {len(summary['regions'])} regions, {summary['corrections']} corrections",
        "",
        "sources:",
    ]
    lines += [f"  {s['date'] or 'undated':<10}  {s['source']}" for s in summary["sources"]]
    table = [["REGION", "TYPES", "ROWS", "ON-DEMAND", "SPOT", "WITH BUCKET"]]
    table += [
        [
            name,
            str(r["instance_types"]),
            str(r["rows"]),
            str(r["on_demand"]),
            str(r["spot"]),
            str(r["with_bucket"]),
        ]
        for name, r in summary["regions"].items()
    ]
    return "\n".join([*lines, "", *_table(table, {1, 2, 3, 4, 5})])


def _usd(value: float | None) -> str:
    return "-" if value is None else f"{value:.4f}"


def render_region(detail: list[dict[str, Any]]) -> str:
    table = [
        ["INSTANCE TYPE", "ACCELERATOR", "VCPU", "RAM GIB", "ON-DEMAND $/H", "SPOT FROM", "ZONES"]
    ]
    for d in detail:
        if d["gpu_fraction"]:
            acc = f"1/{round(1 / d['gpu_fraction'])} {d['gpu_model']} {d['gpu_memory_gib']:g}G"
        elif d["gpu_model"]:
            acc = f"{d['gpus']}x {d['gpu_model']} {d['gpu_memory_gib']:g}G"
        else:
            acc = "-"
        table.append(
            [
                d["instance_type"],
                acc,
                str(d["vcpus"]),
                f"{d['memory_gib']:g}",
                _usd(d["on_demand_usd_per_hour"]),
                _usd(d["min_spot_usd_per_hour"]),
                str(len(d["zones"])) if d["zones"] else "(region)",
            ]
        )
    return "\n".join(_table(table, {2, 3, 4, 5}))


def run_show(args: argparse.Namespace) -> int:
    from gpufleet.cli.plan import prices_as_of, prices_note

    doc = bundled_document()
    region: str | None = args.price_region
    summary = summarize(doc, region)
    if region and region not in summary["regions"]:
        known = sorted({o["region"] for o in doc["offerings"]})
        raise CliError(
            f"no offerings in {region!r}; regions: {', '.join(known)}", ErrorCode.NOT_FOUND
        )
    detail = region_detail(doc, region) if region else None
    prices = prices_as_of(load_bundled())
    if args.json:
        document = {**summary, "prices_as_of": prices}
        print_json({**document, "detail": detail} if detail else document)
        return 0
    print(render(summary))
    if detail:
        print()
        print(render_region(detail))
    print(prices_note(prices))
    return 0
