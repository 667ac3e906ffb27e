#!/usr/bin/env python3
"""Build the bundled instance catalog, `functions/gpufleet/catalog/catalog.json`.

Reads the third-party snapshots in `../shared/data` (or `--data DIR`):

- prices/ec2instances-vantage-2025-11-30/gpu_instances_raw.json: GPU/accelerator specs and
  per-region Linux on-demand + spot prices + Spot Advisor bucket (Nov 2025);
- prices/skypilot-catalog-aws-p-family/aws_p_family_vms_by_az.csv: per-AZ prices of the P family;
- prices/cpu-instances/cpu_spot_by_az_skypilot_rows.csv: per-AZ prices of CPU-only types;
- spot-advisor/aws-spot-advisor-2024-02-28/spot-advisor-data.json: interruption buckets where the
  2025 crawl has none (and for every CPU type);
- moto 5.2.5's moto/ec2/resources/instance_types.json.gz (EC2 DescribeInstanceTypes): the
  instance-store disks of every type it has.

The output is deterministic: same inputs, same bytes (no wall clock; `generated` is the newest
source date). Every place where we overrule a source is listed in the document's `corrections`.

Usage: python scripts/build_catalog.py [--data DIR] [--out FILE] [--check]
"""

from __future__ import annotations

import argparse
import csv
import gzip
import json
import sys
from importlib import metadata, resources
from pathlib import Path
from typing import Any

# Shared with `gpufleet catalog refresh`: the spot clamp, price rounding, region/zone patterns,
# spec corrections (applied here after reading vantage) and the writer.
from gpufleet.domain.catalog_refresh import (
    SCHEMA_VERSION,
    SPEC_CORRECTIONS,
    dumps,
    instance_storage,
)
from gpufleet.domain.catalog_refresh import STD_AZ_ID as _STD_AZ_ID
from gpufleet.domain.catalog_refresh import STD_REGION as _STD_REGION
from gpufleet.domain.catalog_refresh import clean_spot as _clean_spot
from gpufleet.domain.catalog_refresh import price as _price

REPO = Path(__file__).resolve().parent.parent
DEFAULT_DATA = REPO.parent / "shared" / "data"
DEFAULT_OUT = REPO / "functions" / "gpufleet" / "catalog" / "catalog.json"

VANTAGE_DIR = "prices/ec2instances-vantage-2025-11-30"
VANTAGE_JSON = f"{VANTAGE_DIR}/gpu_instances_raw.json"
SKYPILOT_P_DIR = "prices/skypilot-catalog-aws-p-family"
SKYPILOT_P_CSV = f"{SKYPILOT_P_DIR}/aws_p_family_vms_by_az.csv"
CPU_DIR = "prices/cpu-instances"
CPU_AZ_CSV = f"{CPU_DIR}/cpu_spot_by_az_skypilot_rows.csv"
ADVISOR_DIR = "spot-advisor/aws-spot-advisor-2024-02-28"
ADVISOR_JSON = f"{ADVISOR_DIR}/spot-advisor-data.json"

# Provenance, transcribed from each folder's SOURCE.md. `must_mention` is checked against the
# SOURCE.md text at build time so this table cannot silently drift from the data it describes.
SOURCES: list[dict[str, Any]] = [
    {
        "file": VANTAGE_JSON,
        "origin": "github.com/tsaol/aws-gpu data/gpu_instances_raw.json @ 2d0108c7 "
        "(instances.vantage.sh / ec2instances.info dataset; AWS Price List, spot feed, "
        "Spot Advisor)",
        "date": "2025-11-30",
        "used_for": "GPU/accelerator specs; per-region on-demand, spot (avg) and interruption "
        "bucket where no per-AZ row exists",
        "source_md": f"{VANTAGE_DIR}/SOURCE.md",
        "must_mention": ["2d0108c7bd261c8e40493fbd35135437bd6c9099", "tsaol/aws-gpu"],
    },
    {
        "file": SKYPILOT_P_CSV,
        "origin": "github.com/skypilot-org/skypilot-catalog catalogs/v8/aws/vms.csv @ 00148f2a "
        "(AWS Price List + DescribeSpotPriceHistory)",
        "date": None,
        "date_note": "commit date not resolvable offline; contents date it to late 2025 or later",
        "used_for": "per-AZ on-demand and spot prices of p3/p3dn/p4d/p4de/p5/p5e/p5en/p6",
        "source_md": f"{SKYPILOT_P_DIR}/SOURCE.md",
        "must_mention": ["00148f2af3672e2229b4f7bf8157d5a3f36e3c35"],
    },
    {
        "file": CPU_AZ_CSV,
        "origin": "github.com/skypilot-org/skypilot-catalog catalogs/v8/aws/vms.csv @ 00148f2a "
        "(us-east-1 and us-west-2 rows; on-demand cross-checked with "
        "aws/karpenter-provider-aws pricing)",
        "date": None,
        "date_note": "commit date not resolvable offline; contents date it to late 2025 or later",
        "used_for": "CPU-only types: specs and per-AZ on-demand and spot prices",
        "source_md": f"{CPU_DIR}/SOURCE.md",
        "must_mention": ["00148f2af3672e2229b4f7bf8157d5a3f36e3c35"],
    },
    {
        "file": ADVISOR_JSON,
        "origin": "github.com/ETOgaosion/bamboo data/spot-advisor-data.json @ 0faa479f "
        "(AWS Spot Instance Advisor feed)",
        "date": "2024-02-28",
        "date_note": "data date is on or before the commit date",
        "used_for": "interruption buckets for CPU types and where the 2025 crawl has none",
        "source_md": f"{ADVISOR_DIR}/SOURCE.md",
        "must_mention": ["0faa479fbca26f06d74fa8e356ca06d88ab1f862"],
    },
]

BUCKET_LABELS = ["<5%", "5-10%", "10-15%", "15-20%", ">20%"]

# vantage `GPU_model` -> (accelerator kind, short model name). Unknown labels fail the build.
ACCELERATORS: dict[str, tuple[str, str]] = {
    "NVIDIA GRID K520": ("nvidia", "K520"),
    "NVIDIA Tesla M60": ("nvidia", "M60"),
    "NVIDIA Tesla K80": ("nvidia", "K80"),
    "NVIDIA Tesla V100": ("nvidia", "V100"),
    "NVIDIA T4 Tensor Core": ("nvidia", "T4"),
    "NVIDIA T4G Tensor Core": ("nvidia", "T4G"),
    "NVIDIA A10G": ("nvidia", "A10G"),
    "NVIDIA A100": ("nvidia", "A100"),
    "NVIDIA L4": ("nvidia", "L4"),
    "NVIDIA L40S": ("nvidia", "L40S"),
    "NVIDIA H100": ("nvidia", "H100"),
    "NVIDIA H200": ("nvidia", "H200"),
    "NVIDIA B200": ("nvidia", "B200"),
    "NVIDIA B300": ("nvidia", "B300"),
    "AMD Radeon Pro V520": ("amd", "Radeon Pro V520"),
    "AWS Inferentia": ("inferentia", "Inferentia"),
    "AWS Inferentia2": ("inferentia", "Inferentia2"),
    "AWS Trainium2": ("trainium", "Trainium2"),
    "Qualcomm AI 100 Accelerators": ("qualcomm", "Qualcomm AI 100"),
}

# EFA is not in any of the sources. Transcribed from the AWS EC2 User Guide, "Elastic Fabric
# Adapter - supported instance types" (accelerated computing). CPU-only types are recorded as
# efa=false: gpufleet only runs multi-node jobs on accelerated types.
EFA_TYPES = frozenset(
    {
        "dl2q.24xlarge",
        "g4dn.8xlarge",
        "g4dn.12xlarge",
        "g4dn.16xlarge",
        "g4dn.metal",
        "g5.8xlarge",
        "g5.12xlarge",
        "g5.16xlarge",
        "g5.24xlarge",
        "g5.48xlarge",
        "g6.8xlarge",
        "g6.12xlarge",
        "g6.16xlarge",
        "g6.24xlarge",
        "g6.48xlarge",
        "g6e.8xlarge",
        "g6e.12xlarge",
        "g6e.16xlarge",
        "g6e.24xlarge",
        "g6e.48xlarge",
        "gr6.8xlarge",
        "inf1.24xlarge",
        "inf2.48xlarge",
        "p3dn.24xlarge",
        "p4d.24xlarge",
        "p4de.24xlarge",
        "p5.48xlarge",
        "p5e.48xlarge",
        "p5en.48xlarge",
        "p6-b200.48xlarge",
        "p6-b300.48xlarge",
        "p6e-gb200.36xlarge",
        "trn1.32xlarge",
        "trn1n.32xlarge",
        "trn2.48xlarge",
    }
)

# Network cards and EFA interfaces of the EFA types with more than one network card (every other
# EFA type has one card and takes one EFA), transcribed from EC2 DescribeInstanceTypes
# (`NetworkInfo.MaximumNetworkCards`, `NetworkInfo.EfaInfo.MaximumEfaInterfaces`) as moto 5.2.5
# bundles it (moto/ec2/resources/instance_types.json.gz, a snapshot of the AWS API), checked
# 2026-12-02. p6e-gb200.36xlarge is not in that snapshot: recorded with one card (it has no
# Linux price, so no offering, and is never selected).
NETWORK_CARDS: dict[str, tuple[int, int]] = {
    "g6e.24xlarge": (2, 2),
    "g6e.48xlarge": (4, 4),
    "p4d.24xlarge": (4, 4),
    "p4de.24xlarge": (4, 4),
    "p5.48xlarge": (32, 32),
    "p5e.48xlarge": (32, 32),
    "p5en.48xlarge": (16, 16),
    "p6-b200.48xlarge": (8, 8),
    "p6-b300.48xlarge": (17, 16),  # card 0 carries the ENA only
    "trn1.32xlarge": (8, 8),
    "trn1n.32xlarge": (16, 16),
    "trn2.48xlarge": (16, 16),
}


# Instance-store disks come from EC2 DescribeInstanceTypes (`InstanceStorageInfo`) as moto bundles
# it (moto/ec2/resources/instance_types.json.gz, a snapshot of the AWS API; read 2026-12-02 from
# moto 5.2.5, the version the project pins). The types that snapshot lacks (older generations,
# g4ad, p6e-gb200) take vantage's `storage` record (devices, size per device, nvme_ssd).
MOTO_VERSION = "5.2.5"
MOTO_INSTANCE_TYPES = "moto/ec2/resources/instance_types.json.gz"
STORAGE_SOURCE: dict[str, Any] = {
    "file": f"moto {MOTO_VERSION}: {MOTO_INSTANCE_TYPES}",
    "origin": "EC2 DescribeInstanceTypes InstanceStorageInfo (Disks, TotalSizeInGB, "
    "NvmeSupport), the snapshot of the AWS API moto bundles",
    "date": None,
    "date_note": f"the snapshot moto {MOTO_VERSION} ships; read 2026-12-02",
    "used_for": "instance-store disks, total GB and NVMe (vantage `storage` for the types the "
    "snapshot lacks)",
}


def _moto_instance_types() -> dict[str, dict[str, Any]]:
    version = metadata.version("moto")
    if version != MOTO_VERSION:
        raise SystemExit(f"moto {version} installed; the catalog reads moto {MOTO_VERSION}")
    packed = resources.files("moto").joinpath(MOTO_INSTANCE_TYPES.removeprefix("moto/"))
    types: dict[str, dict[str, Any]] = json.loads(gzip.decompress(packed.read_bytes()))
    return types


def _storage_from_api(info: dict[str, Any]) -> dict[str, Any]:
    return instance_storage(info.get("InstanceStorageInfo"))


def _storage_from_vantage(record: dict[str, Any]) -> dict[str, Any]:
    storage = record.get("storage")
    if not storage:
        return instance_storage(None)
    if storage.get("size_unit") != "GB":
        raise SystemExit(f"{record['instance_type']}: storage size in {storage.get('size_unit')}")
    devices = int(storage["devices"])
    return {
        "instance_store_disks": devices,
        "instance_store_gb": devices * int(storage["size"]),
        "instance_store_nvme": bool(storage.get("nvme_ssd")),
    }


def _network(name: str, efa: bool) -> dict[str, int]:
    cards, efa_interfaces = NETWORK_CARDS.get(name, (1, 1))
    if not efa and name in NETWORK_CARDS:
        raise SystemExit(f"{name}: NETWORK_CARDS names a type without EFA")
    return {"network_cards": cards, "efa_interfaces": efa_interfaces if efa else 0}


_FRACTIONAL_REASON = (
    "vantage gives a fractional GPU count ({count}) and its CSV flattening a per-device memory "
    "of 24 GiB; the instance gets a {share} slice of one L4 with {mem} GiB. Recorded as 0 whole "
    "GPUs with gpu_fraction={count} and gpu_memory_gib={mem}, so it is never chosen for a job "
    "that asks for whole GPUs"
)


def _num(value: str | float | int | None) -> float | None:
    if value is None or value == "":
        return None
    return float(value)


def _load_advisor(data: Path) -> dict[tuple[str, str], int]:
    doc = json.loads((data / ADVISOR_JSON).read_text())
    labels = [r["label"] for r in sorted(doc["ranges"], key=lambda r: r["index"])]
    if labels != BUCKET_LABELS:
        raise SystemExit(f"unexpected Spot Advisor ranges: {labels}")
    out: dict[tuple[str, str], int] = {}
    for region, by_os in doc["spot_advisor"].items():
        for itype, entry in by_os.get("Linux", {}).items():
            out[(itype, region)] = int(entry["r"])
    return out


def _check_sources(data: Path) -> list[dict[str, Any]]:
    out = []
    for src in SOURCES:
        text = (data / src["source_md"]).read_text()
        for needle in src["must_mention"]:
            if needle not in text:
                raise SystemExit(f"{src['source_md']} no longer mentions {needle!r}")
        if not (data / src["file"]).is_file():
            raise SystemExit(f"missing source file {src['file']}")
        out.append({k: v for k, v in src.items() if k not in ("source_md", "must_mention")})
    return out


def _gpu_types(
    raw: list[dict[str, Any]], corrections: list[dict[str, Any]]
) -> dict[str, dict[str, Any]]:
    types: dict[str, dict[str, Any]] = {}
    for rec in sorted(raw, key=lambda r: r["instance_type"]):
        name = rec["instance_type"]
        label = rec["GPU_model"]
        if label not in ACCELERATORS:
            raise SystemExit(f"{name}: unknown accelerator label {label!r}; extend ACCELERATORS")
        kind, model = ACCELERATORS[label]
        count = float(rec["GPU"])
        total_mem = float(rec["GPU_memory"])
        arch = rec["arch"]
        if arch != ["x86_64"] and arch != ["arm64"]:
            raise SystemExit(f"{name}: unexpected arch {arch!r}")
        entry: dict[str, Any] = {
            "name": name,
            "accelerator": kind,
            "gpu_model": model,
            "gpus": int(count),
            "gpu_memory_gib": round(total_mem / count, 3) if count else 0.0,
            "vcpus": int(rec["vCPU"]),
            "memory_gib": float(rec["memory"]),
            "arch": arch[0],
            "efa": name in EFA_TYPES,
            **_network(name, name in EFA_TYPES),
        }
        if count != int(count):
            entry["gpus"] = 0
            entry["gpu_fraction"] = count
            entry["gpu_memory_gib"] = total_mem
            share = f"1/{round(1 / count)}"
            corrections.append(
                {
                    "instance_type": name,
                    "fields": {
                        "gpus": [count, 0],
                        "gpu_fraction": [None, count],
                        "gpu_memory_gib": [round(total_mem / count, 3), total_mem],
                    },
                    "reason": _FRACTIONAL_REASON.format(count=count, share=share, mem=total_mem),
                }
            )
        if name in SPEC_CORRECTIONS:
            fields, reason = SPEC_CORRECTIONS[name]
            changed = {k: [entry[k], v] for k, v in fields.items() if entry[k] != v}
            if not changed:
                raise SystemExit(f"{name}: correction no longer needed; remove it ({reason})")
            entry.update(fields)
            corrections.append({"instance_type": name, "fields": changed, "reason": reason})
        types[name] = entry
    return types


def _cpu_types(rows: list[dict[str, str]]) -> dict[str, dict[str, Any]]:
    types: dict[str, dict[str, Any]] = {}
    for row in rows:
        name = row["InstanceType"]
        entry = {
            "name": name,
            "accelerator": "none",
            "gpu_model": None,
            "gpus": 0,
            "gpu_memory_gib": 0.0,
            "vcpus": int(float(row["vCPUs"])),
            "memory_gib": float(row["MemoryGiB"]),
            "arch": row["Arch"],
            "efa": False,
            **_network(name, False),
        }
        if types.setdefault(name, entry) != entry:
            raise SystemExit(f"{name}: inconsistent specs across AZ rows")
    return types


def build(data: Path) -> dict[str, Any]:
    sources = _check_sources(data)
    advisor = _load_advisor(data)
    corrections: list[dict[str, Any]] = []
    notes: list[str] = []

    raw = json.loads((data / VANTAGE_JSON).read_text())
    types = _gpu_types(raw, corrections)
    cpu_rows = list(csv.DictReader((data / CPU_AZ_CSV).open(newline="")))
    for name, entry in _cpu_types(cpu_rows).items():
        if name in types:
            raise SystemExit(f"{name} is both a GPU and a CPU type")
        types[name] = entry

    api = _moto_instance_types()
    vantage_records = {rec["instance_type"]: rec for rec in raw}
    storage_from_vantage = []
    for name, entry in types.items():
        if name in api:
            entry.update(_storage_from_api(api[name]))
        elif name in vantage_records:
            entry.update(_storage_from_vantage(vantage_records[name]))
            storage_from_vantage.append(name)
        else:
            raise SystemExit(f"{name}: no source states its instance storage")

    # (type, region, zone) -> [on_demand, spot, bucket]
    offerings: dict[tuple[str, str, str | None], list[Any]] = {}
    dropped_local: set[str] = set()

    def bucket_for(itype: str, region: str, vantage_bucket: int | None) -> int | None:
        if vantage_bucket is not None:
            return vantage_bucket
        return advisor.get((itype, region))

    # 1. Per-AZ rows (SkyPilot): P family and CPU types.
    vantage_bucket: dict[tuple[str, str], int] = {}
    for rec in raw:
        for region, prices in rec["pricing"].items():
            label = prices.get("linux", {}).get("pct_interrupt")
            if label:
                vantage_bucket[(rec["instance_type"], region)] = BUCKET_LABELS.index(label)

    p_rows = list(csv.DictReader((data / SKYPILOT_P_CSV).open(newline="")))
    for row in [*p_rows, *cpu_rows]:
        itype, region, zone = row["InstanceType"], row["Region"], row["AvailabilityZone"]
        if itype not in types:
            raise SystemExit(f"{itype}: per-AZ price for an unknown type")
        if not _STD_AZ_ID.match(zone):
            dropped_local.add(zone)
            continue
        od = _num(row["Price"])
        spot = _clean_spot(_num(row["SpotPrice"]), od, f"{itype} {zone}", notes)
        if od is None and spot is None:
            continue
        bucket = bucket_for(itype, region, vantage_bucket.get((itype, region)))
        offerings[(itype, region, zone)] = [od, spot, bucket]
    per_az = {(t, r) for (t, r, _z) in offerings}

    # 2. Per-region rows (vantage) where no per-AZ row exists.
    for rec in sorted(raw, key=lambda r: r["instance_type"]):
        itype = rec["instance_type"]
        for region in sorted(rec["pricing"]):
            linux = rec["pricing"][region].get("linux")
            if not linux:
                continue
            if not _STD_REGION.match(region):
                dropped_local.add(region)
                continue
            if (itype, region) in per_az:
                continue
            od = _num(linux.get("ondemand"))
            spot = _clean_spot(_num(linux.get("spot_avg")), od, f"{itype} {region}", notes)
            if od is None and spot is None:
                continue
            bucket = bucket_for(itype, region, vantage_bucket.get((itype, region)))
            offerings[(itype, region, None)] = [od, spot, bucket]

    if notes:
        corrections.append(
            {
                "instance_type": "*",
                "fields": {"spot_usd_per_hour": ["above on-demand", "clamped or null"]},
                "reason": "spot price above on-demand: " + "; ".join(sorted(notes)),
            }
        )
    corrections.append(
        {
            "instance_type": "*",
            "fields": {"region": ["local/Wavelength zone", "excluded"]},
            "reason": "local zones and Wavelength zones need opt-in and special subnets and are "
            "not used for training; excluded: " + ", ".join(sorted(dropped_local)),
        }
    )
    corrections.append(
        {
            "instance_type": "*",
            "fields": {
                "network_cards": [None, "EC2 DescribeInstanceTypes"],
                "efa_interfaces": [None, "EC2 DescribeInstanceTypes"],
            },
            "reason": "no price source has network cards: transcribed from EC2 "
            "DescribeInstanceTypes (MaximumNetworkCards, EfaInfo.MaximumEfaInterfaces) as moto "
            "5.2.5 bundles it; one card and one EFA for every other EFA type",
        }
    )
    corrections.append(
        {
            "instance_type": "*",
            "fields": {
                field: [None, "EC2 DescribeInstanceTypes"]
                for field in ("instance_store_disks", "instance_store_gb", "instance_store_nvme")
            },
            "reason": "no price source has the instance store: InstanceStorageInfo from EC2 "
            f"DescribeInstanceTypes as moto {MOTO_VERSION} bundles it; vantage's storage record "
            "for the types that snapshot lacks: " + ", ".join(sorted(storage_from_vantage)),
        }
    )
    corrections.append(
        {
            "instance_type": "*",
            "fields": {"efa": [None, "AWS EFA list"]},
            "reason": "no source has EFA support; set from the AWS EC2 User Guide list of "
            "EFA-supported accelerated instance types (p5.4xlarge conservatively false; CPU "
            "types false)",
        }
    )
    corrections.append(
        {
            "instance_type": "g4ad.*, inf*, trn*, dl2q.24xlarge",
            "fields": {"accelerator": ["GPU", "amd|inferentia|trainium|qualcomm"]},
            "reason": "vantage lists every accelerator under GPU; g4ad is AMD (no CUDA), inf* "
            "Inferentia, trn* Trainium, dl2q Qualcomm AI 100: only 'nvidia' types are chosen "
            "unless gpu_models names another model. dl1 (Gaudi) is in no source",
        }
    )

    offering_rows = [
        {
            "instance_type": t,
            "region": r,
            "zone": z,
            "on_demand_usd_per_hour": _price(v[0]),
            "spot_usd_per_hour": _price(v[1]),
            "interruption_bucket": v[2] if v[1] is not None else None,
        }
        for (t, r, z), v in sorted(
            offerings.items(), key=lambda kv: (kv[0][0], kv[0][1], kv[0][2] or "")
        )
    ]
    dates = [s["date"] for s in sources if s["date"]]
    return {
        "schema_version": SCHEMA_VERSION,
        "generated": max(dates),
        "generated_note": "the newest source date, not the build time, so rebuilds are "
        "byte-identical; rebuild with scripts/build_catalog.py",
        "sources": [*sources, STORAGE_SOURCE],
        "interruption_buckets": BUCKET_LABELS,
        "corrections": corrections,
        "instance_types": [types[k] for k in sorted(types)],
        "offerings": offering_rows,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data", type=Path, default=DEFAULT_DATA, help="shared data folder")
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT, help="catalog JSON to write")
    parser.add_argument(
        "--check", action="store_true", help="exit 1 if the file on disk is not up to date"
    )
    args = parser.parse_args(argv)
    text = dumps(build(args.data))
    if args.check:
        current = args.out.read_text() if args.out.exists() else ""
        if current != text:
            print(f"{args.out} is out of date; run scripts/build_catalog.py", file=sys.stderr)
            return 1
        print(f"{args.out} is up to date")
        return 0
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(text)
    doc = json.loads(text)
    print(
        f"wrote {args.out} ({len(text.encode()) / 1024:.0f} KiB): "
        f"{len(doc['instance_types'])} instance types, {len(doc['offerings'])} offerings, "
        f"{len({o['region'] for o in doc['offerings']})} regions, "
        f"{len(doc['corrections'])} corrections"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
