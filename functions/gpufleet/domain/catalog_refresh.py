"""Rebuild the instance catalog from AWS API responses. Pure: pages in, a document out.

The adapter (`gpufleet.adapters.aws.catalog_source`) reads, per region:

- ec2 DescribeInstanceTypes: specs (`GpuInfo`, `NeuronInfo`, `InferenceAcceleratorInfo`,
  `VCpuInfo`, `MemoryInfo`, `ProcessorInfo`, `NetworkInfo.EfaSupported`,
  `MaximumNetworkCards`, `EfaInfo.MaximumEfaInterfaces`, `InstanceStorageInfo`);
- ec2 DescribeAvailabilityZones: zone name -> zone ID (the catalog records AZ IDs, which are the
  same in every account; spot price history names zones by this account's names);
- ec2 DescribeSpotPriceHistory (`Linux/UNIX`): the latest spot price per (type, zone);
- pricing GetProducts (Linux, shared tenancy, no pre-installed software, capacity status Used):
  the per-region on-demand price, `terms.OnDemand.*.priceDimensions.*.pricePerUnit.USD`.

`build_document` turns those pages into a document in the format `Catalog.from_document` reads
(the same keys as the bundled `catalog.json`). Interruption buckets are in no AWS API (Spot
Instance Advisor only): they are carried over from the previous catalog where the instance
type and region match, and `sources` says so. The fetch date comes from the caller.

This module also holds the pieces `scripts/build_catalog.py` shares with the refresh: the spot
clamp, the price rounding, the region/zone patterns, the spec corrections and the writer.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, date, datetime
from typing import Any

from gpufleet.domain.catalog import INTERRUPTION_BUCKETS, normalize_model
from gpufleet.errors import RefusedInput

SCHEMA_VERSION = 1

# Standard regions and AZ IDs; local zones (`us-east-1-atl-1`, `use1-atl2-az1`) and Wavelength
# zones need opt-in and special subnets and are not used for training.
STD_REGION = re.compile(r"^[a-z]{2}(-gov)?-[a-z]+-\d$")
STD_AZ_ID = re.compile(r"^[a-z]+\d-az\d+$")

# CPU-only families the catalog carries (for CPU stages); every accelerated type is kept.
CPU_FAMILIES = frozenset(
    {"c5", "c6i", "c7i", "m5", "m6i", "m7i", "r6i", "r7i", "c6g", "c7g", "m7g"}
)

# The Price List API is served from these endpoints only; us-east-1 answers for every region.
PRICING_ENDPOINT_REGION = "us-east-1"
SPOT_PRODUCT_DESCRIPTION = "Linux/UNIX"
# Older accounts (and moto) also report the EC2-Classic era name; in a VPC the price is the same.
_LINUX_SPOT = {"Linux/UNIX": 1, "Linux/UNIX (Amazon VPC)": 0}
_PRICING_TERMS = {
    "operatingSystem": "Linux",
    "tenancy": "Shared",
    "preInstalledSw": "NA",
    "capacitystatus": "Used",
}

# DescribeInstanceTypes reports usable GPU memory (after the driver's and ECC's share: an A10G
# is 22888 MiB), a few percent below the nominal size people ask for (24 GiB). Within this
# fraction below the previous catalog's value, the nominal value is kept.
NOMINAL_MEMORY_TOLERANCE = 0.10

# Spec corrections: instance type -> (fields to set, reason). Shared with
# scripts/build_catalog.py (applied there to vantage's data); the refresh applies an entry
# only where DescribeInstanceTypes still disagrees with it.
SPEC_CORRECTIONS: dict[str, tuple[dict[str, Any], str]] = {
    "trn1.2xlarge": (
        {"accelerator": "trainium", "gpu_model": "Trainium"},
        "vantage labels trn1 'AWS Inferentia'; trn1 carries AWS Trainium (training) chips",
    ),
    "trn1.32xlarge": (
        {"accelerator": "trainium", "gpu_model": "Trainium"},
        "vantage labels trn1 'AWS Inferentia'; trn1 carries AWS Trainium (training) chips",
    ),
    "trn1n.32xlarge": (
        {"accelerator": "trainium", "gpu_model": "Trainium"},
        "vantage labels trn1n 'AWS Inferentia'; trn1n carries AWS Trainium (training) chips",
    ),
    "trn2.48xlarge": (
        {"gpu_memory_gib": 96.0},
        "vantage GPU_memory=96 is per Trainium2 chip, not the instance total (16 x 96 GiB)",
    ),
    "p2.8xlarge": (
        {"gpus": 8, "gpu_memory_gib": 12.0},
        "vantage counts 4 K80 boards x 24 GiB; a K80 board is two GPUs: 8 GPUs x 12 GiB",
    ),
    "p2.16xlarge": (
        {"gpus": 16, "gpu_memory_gib": 12.0},
        "vantage counts 8 K80 boards x 24 GiB; a K80 board is two GPUs: 16 GPUs x 12 GiB",
    ),
    "p6e-gb200.36xlarge": (
        {"gpus": 4, "gpu_memory_gib": 185.0, "arch": "arm64", "gpu_model": "GB200"},
        "vantage gives the 36-GPU UltraServer totals (36 GPUs, 6660 GiB) and x86_64; one "
        "instance has 4 Blackwell GPUs (185 GiB each) on NVIDIA Grace (arm64) CPUs",
    ),
}


class RefreshError(RefusedInput, ValueError):
    """The API responses cannot make a catalog (nothing usable, or a bad argument)."""


def price(value: float | None) -> float | None:
    """Prices are kept to 6 decimals (a millionth of a dollar)."""
    return None if value is None else round(value, 6)


def clean_spot(
    spot: float | None, on_demand: float | None, where: str, notes: list[str]
) -> float | None:
    """Spot above on-demand cannot launch at the default max price; a tiny excess is rounding."""
    if spot is None or on_demand is None or spot <= on_demand:
        return spot
    if spot - on_demand <= 0.001:
        notes.append(f"{where}: spot {spot} rounded above on-demand {on_demand}; clamped")
        return on_demand
    notes.append(f"{where}: spot {spot} above on-demand {on_demand}; dropped")
    return None


def dumps(doc: Mapping[str, Any]) -> str:
    """JSON with one instance type / offering per line: small, and diffs stay readable."""
    lines = ["{"]
    keys = list(doc)
    for i, key in enumerate(keys):
        value = doc[key]
        comma = "," if i < len(keys) - 1 else ""
        if isinstance(value, list) and value and isinstance(value[0], dict):
            lines.append(f"{json.dumps(key)}:[")
            lines.extend(
                json.dumps(item, separators=(",", ":"), ensure_ascii=False)
                + ("," if j < len(value) - 1 else "")
                for j, item in enumerate(value)
            )
            lines.append("]" + comma)
        else:
            text = json.dumps(value, separators=(",", ":"), ensure_ascii=False)
            lines.append(f"{json.dumps(key)}:{text}{comma}")
    lines.append("}")
    return "\n".join(lines) + "\n"


def pricing_filters(region: str) -> list[dict[str, str]]:
    """GetProducts filters for the Linux on-demand price of every instance type in `region`."""
    terms = {**_PRICING_TERMS, "regionCode": region}
    return [{"Type": "TERM_MATCH", "Field": k, "Value": v} for k, v in terms.items()]


# --- instance types ---------------------------------------------------------------------------


def _devices(info: Mapping[str, Any]) -> list[Mapping[str, Any]]:
    """The accelerators of a DescribeInstanceTypes entry; Neuron first (never a GPU)."""
    for section, key in (
        ("NeuronInfo", "NeuronDevices"),
        ("InferenceAcceleratorInfo", "Accelerators"),
        ("GpuInfo", "Gpus"),
    ):
        found = (info.get(section) or {}).get(key) or []
        if found:
            return [d for d in found if isinstance(d, Mapping)]
    return []


def is_catalog_type(info: Mapping[str, Any]) -> bool:
    """Accelerated (GPU, Neuron, inference accelerator) or one of the CPU families kept."""
    name = str(info.get("InstanceType", ""))
    return bool(_devices(info)) or name.split(".", 1)[0] in CPU_FAMILIES


def accelerator_kind(manufacturer: str, name: str) -> str | None:
    """The catalog's accelerator kind for an API device, or None when unknown."""
    n, m = name.lower(), manufacturer.lower()
    if n.startswith("trainium"):
        return "trainium"
    if n.startswith("inferentia"):
        return "inferentia"
    if "gaudi" in n or m == "habana":
        return "gaudi"
    if "qualcomm" in n or m == "qualcomm":
        return "qualcomm"
    if m == "nvidia":
        return "nvidia"
    if m == "amd":
        return "amd"
    return None


def _mib_to_gib(mib: Any) -> float:
    return round(float(mib) / 1024, 3)


def _arch(info: Mapping[str, Any]) -> str | None:
    arches = (info.get("ProcessorInfo") or {}).get("SupportedArchitectures") or []
    if "arm64" in arches:
        return "arm64"
    if "x86_64" in arches:
        return "x86_64"
    return None  # mac types (x86_64_mac, arm64_mac)


def _network(network: Mapping[str, Any]) -> dict[str, Any]:
    """EFA support, network cards and EFA interfaces, as NetworkInfo states them."""
    efa = bool(network.get("EfaSupported", False))
    cards = int(network.get("MaximumNetworkCards") or 1)
    interfaces = int((network.get("EfaInfo") or {}).get("MaximumEfaInterfaces") or 1)
    return {
        "efa": efa,
        "network_cards": cards,
        "efa_interfaces": min(interfaces, cards) if efa else 0,
    }


def instance_storage(storage: Mapping[str, Any] | None) -> dict[str, Any]:
    """Instance-store disks, total GB and NVMe, as InstanceStorageInfo states them (absent for
    EBS-only types). NvmeSupport `supported` or `required` is NVMe; `unsupported` is not."""
    disks = sum(int(d.get("Count", 0)) for d in (storage or {}).get("Disks") or [])
    total = int((storage or {}).get("TotalSizeInGB") or 0) if disks else 0
    nvme = disks > 0 and (storage or {}).get("NvmeSupport") in ("supported", "required")
    return {"instance_store_disks": disks, "instance_store_gb": total, "instance_store_nvme": nvme}


def parse_instance_type(info: Mapping[str, Any]) -> tuple[dict[str, Any] | None, str]:
    """One DescribeInstanceTypes entry as a catalog row, as the API states it.

    Returns (row, "") or (None, why it was skipped).
    """
    name = str(info.get("InstanceType", ""))
    arch = _arch(info)
    if arch is None:
        return None, "no x86_64/arm64 architecture"
    try:
        vcpus = int(info["VCpuInfo"]["DefaultVCpus"])
        memory = _mib_to_gib(info["MemoryInfo"]["SizeInMiB"])
    except (KeyError, TypeError, ValueError):
        return None, "no VCpuInfo.DefaultVCpus or MemoryInfo.SizeInMiB"
    row: dict[str, Any] = {
        "name": name,
        "accelerator": "none",
        "gpu_model": None,
        "gpus": 0,
        "gpu_memory_gib": 0.0,
        "vcpus": vcpus,
        "memory_gib": memory,
        "arch": arch,
        **_network(info.get("NetworkInfo") or {}),
        **instance_storage(info.get("InstanceStorageInfo")),
    }
    devices = _devices(info)
    if not devices:
        return row, ""
    names = {str(d.get("Name", "")) for d in devices}
    if len(names) != 1:
        return None, f"mixed accelerators {sorted(names)}"
    first = devices[0]
    model = str(first.get("Name", ""))
    kind = accelerator_kind(str(first.get("Manufacturer", "AWS")), model)
    if kind is None:
        return None, f"unknown accelerator {first.get('Manufacturer')!r} {model!r}"
    count = sum(int(d.get("Count", 0)) for d in devices)
    mem_mib = (first.get("MemoryInfo") or {}).get("SizeInMiB", 0)
    partition = first.get("GpuPartitionSize")
    row.update(accelerator=kind, gpu_model=model, gpus=count, gpu_memory_gib=_mib_to_gib(mem_mib))
    if partition is not None and 0 < float(partition) < 1:
        # A slice of one GPU (g6f, gr6f): 0 whole GPUs, so whole-GPU jobs never land on it.
        row.update(gpus=0, gpu_fraction=float(partition))
    elif count < 1:
        return None, "accelerator count 0 and no GPU partition size"
    return row, ""


# --- prices -----------------------------------------------------------------------------------


def zone_ids(responses: Iterable[Mapping[str, Any]]) -> dict[str, str]:
    """Zone name -> zone ID from DescribeAvailabilityZones responses."""
    out: dict[str, str] = {}
    for response in responses:
        for zone in response.get("AvailabilityZones", []):
            if zone.get("ZoneName") and zone.get("ZoneId"):
                out[str(zone["ZoneName"])] = str(zone["ZoneId"])
    return out


_FRACTION = re.compile(r"(\.\d{6})\d+")


def _timestamp(value: Any) -> datetime:
    if isinstance(value, datetime):
        return value if value.tzinfo else value.replace(tzinfo=UTC)
    text = _FRACTION.sub(r"\1", str(value)).replace("Z", "+00:00")
    parsed = datetime.fromisoformat(text)
    return parsed if parsed.tzinfo else parsed.replace(tzinfo=UTC)


def latest_spot_prices(pages: Iterable[Mapping[str, Any]]) -> dict[tuple[str, str], float]:
    """(instance type, zone name) -> the latest Linux spot price in DescribeSpotPriceHistory."""
    latest: dict[tuple[str, str], tuple[datetime, int, float]] = {}
    for page in pages:
        for rec in page.get("SpotPriceHistory", []):
            rank = _LINUX_SPOT.get(str(rec.get("ProductDescription")))
            if rank is None:
                continue
            key = (str(rec["InstanceType"]), str(rec["AvailabilityZone"]))
            seen = (_timestamp(rec["Timestamp"]), rank, float(rec["SpotPrice"]))
            if key not in latest or seen[:2] > latest[key][:2]:
                latest[key] = seen
    return {k: v[2] for k, v in latest.items()}


def _on_demand_usd(terms: Mapping[str, Any]) -> float | None:
    for term in (terms.get("OnDemand") or {}).values():
        for dim in (term.get("priceDimensions") or {}).values():
            if dim.get("unit") not in ("Hrs", "Hours"):
                continue
            usd = float((dim.get("pricePerUnit") or {}).get("USD", 0) or 0)
            if usd > 0:
                return usd
    return None


def on_demand_prices(
    pages: Iterable[Mapping[str, Any]], region: str, notes: list[str]
) -> dict[str, float]:
    """Instance type -> Linux on-demand USD/hour in `region`, from GetProducts pages.

    `PriceList` items are JSON strings (dicts are accepted too). The server-side filters are
    checked again, so a wider query cannot leak Windows, dedicated or reservation prices.
    """
    found: dict[str, set[float]] = {}
    for page in pages:
        for item in page.get("PriceList", []):
            product = json.loads(item) if isinstance(item, str | bytes) else item
            attrs = (product.get("product") or {}).get("attributes") or {}
            itype = attrs.get("instanceType")
            if not itype or attrs.get("regionCode", region) != region:
                continue
            if any(attrs.get(k, v) != v for k, v in _PRICING_TERMS.items()):
                continue
            if attrs.get("marketoption", "OnDemand") != "OnDemand":
                continue  # capacity blocks
            if attrs.get("operation", "RunInstances") != "RunInstances":
                continue  # licensed variants
            usd = _on_demand_usd(product.get("terms") or {})
            if usd is not None:
                found.setdefault(str(itype), set()).add(usd)
    out: dict[str, float] = {}
    for itype, prices in sorted(found.items()):
        out[itype] = min(prices)
        if len(prices) > 1:
            notes.append(f"{itype} {region}: {len(prices)} on-demand prices {sorted(prices)}")
    return out


# --- the document -----------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class RegionPages:
    """The raw API responses for one region, as the adapter read them."""

    region: str
    instance_types: Sequence[Mapping[str, Any]] = ()  # DescribeInstanceTypes pages
    availability_zones: Sequence[Mapping[str, Any]] = ()  # DescribeAvailabilityZones
    spot_price_history: Sequence[Mapping[str, Any]] = ()  # DescribeSpotPriceHistory pages
    products: Sequence[Mapping[str, Any]] = ()  # pricing GetProducts pages


@dataclass
class _Previous:
    """What a refresh keeps from the previous catalog."""

    types: dict[str, Mapping[str, Any]]
    buckets: dict[tuple[str, str], int]
    model_names: dict[str, str]  # normalized model -> spelling
    model_memory: dict[str, float]  # normalized model -> per-GPU GiB, whole-GPU types only
    generated: str | None
    origins: list[str]

    @classmethod
    def of(cls, doc: Mapping[str, Any] | None) -> _Previous:
        doc = doc or {}
        types = {str(t["name"]): t for t in doc.get("instance_types", [])}
        buckets: dict[tuple[str, str], int] = {}
        for o in doc.get("offerings", []):
            if o.get("interruption_bucket") is not None:
                buckets.setdefault((o["instance_type"], o["region"]), int(o["interruption_bucket"]))
        names: dict[str, str] = {}
        memory: dict[str, set[float]] = {}
        for t in sorted(types.values(), key=lambda t: str(t["name"])):
            if t.get("gpu_model"):
                key = normalize_model(str(t["gpu_model"]))
                names.setdefault(key, str(t["gpu_model"]))
                if t.get("gpu_fraction") is None and t.get("gpus"):
                    memory.setdefault(key, set()).add(float(t["gpu_memory_gib"]))
        origins = [
            str(s.get("origin") or s.get("api") or s.get("file"))
            for s in doc.get("sources", [])
            if isinstance(s, Mapping)
        ]
        return cls(
            types=types,
            buckets=buckets,
            model_names=names,
            model_memory={k: next(iter(v)) for k, v in memory.items() if len(v) == 1},
            generated=doc.get("generated"),
            origins=origins,
        )

    def nominal_memory(self, row: Mapping[str, Any]) -> float | None:
        """The previous per-GPU memory of this type (or, for a new type, of its model)."""
        key = normalize_model(str(row["gpu_model"]))
        prev = self.types.get(str(row["name"]))
        if prev is not None and prev.get("gpu_model"):
            if normalize_model(str(prev["gpu_model"])) != key:
                return None
            if (prev.get("gpu_fraction") is None) != (row.get("gpu_fraction") is None):
                return None
            return float(prev["gpu_memory_gib"])
        if row.get("gpu_fraction") is not None:
            return None
        return self.model_memory.get(key)


class _Corrections:
    """Corrections grouped by (field change, reason), so 8 g5 sizes make one entry."""

    def __init__(self) -> None:
        self._groups: dict[tuple[str, str], tuple[dict[str, list[Any]], list[str]]] = {}

    def add(self, name: str, fields: dict[str, list[Any]], reason: str) -> None:
        key = (json.dumps(fields, sort_keys=True), reason)
        self._groups.setdefault(key, (fields, []))[1].append(name)

    def entries(self) -> list[dict[str, Any]]:
        return [
            {"instance_type": ", ".join(sorted(names)), "fields": fields, "reason": reason}
            for (_, reason), (fields, names) in sorted(
                self._groups.items(), key=lambda kv: (sorted(kv[1][1])[0], kv[0])
            )
        ]


def _correct(row: dict[str, Any], previous: _Previous, corrections: _Corrections) -> None:
    name = str(row["name"])
    if row["gpu_model"]:
        spelling = previous.model_names.get(normalize_model(str(row["gpu_model"])))
        if spelling and spelling != row["gpu_model"]:
            row["gpu_model"] = spelling  # 'T4g' -> 'T4G': the same model, as before
        nominal = previous.nominal_memory(row)
        api_mem = float(row["gpu_memory_gib"])
        if nominal and api_mem < nominal and api_mem >= nominal * (1 - NOMINAL_MEMORY_TOLERANCE):
            row["gpu_memory_gib"] = nominal
            corrections.add(
                name,
                {"gpu_memory_gib": [api_mem, nominal]},
                f"DescribeInstanceTypes reports usable {row['gpu_model']} memory "
                f"({api_mem:g} GiB); the catalog records the nominal size ({nominal:g} GiB) that "
                "job specs ask for, as the previous catalog did",
            )
    if name in SPEC_CORRECTIONS:
        fields, reason = SPEC_CORRECTIONS[name]
        changed = {k: [row.get(k), v] for k, v in fields.items() if row.get(k) != v}
        if changed:
            row.update({k: v for k, v in fields.items() if k in changed})
            corrections.add(
                name,
                changed,
                "DescribeInstanceTypes disagrees with a correction kept from "
                f"scripts/build_catalog.py: {reason}",
            )
    if row["accelerator"] == "none" and row["efa"]:
        row["efa"] = False
        row["efa_interfaces"] = 0
        corrections.add(
            name,
            {"efa": [True, False]},
            "CPU-only types are recorded as efa=false: gpufleet runs multi-node jobs on "
            "accelerated types only (as scripts/build_catalog.py does)",
        )


def _instance_types(
    regions: Sequence[RegionPages], previous: _Previous, corrections: _Corrections
) -> dict[str, dict[str, Any]]:
    types: dict[str, dict[str, Any]] = {}
    skipped: dict[str, list[str]] = {}
    for pages in regions:
        for page in pages.instance_types:
            for info in page.get("InstanceTypes", []):
                name = str(info.get("InstanceType", ""))
                if name in types or not is_catalog_type(info):
                    continue
                row, why = parse_instance_type(info)
                if row is None:
                    skipped.setdefault(why, []).append(name)
                    continue
                _correct(row, previous, corrections)
                types[name] = row
    for why, names in sorted(skipped.items()):
        for name in sorted(set(names)):
            corrections.add(name, {"instance_type": ["listed", "skipped"]}, why)
    return types


def _source_entries(
    regions: list[str], fetched: str, previous: _Previous, carried: int
) -> list[dict[str, Any]]:
    common = {"regions": regions, "date": fetched}
    return [
        {
            "api": "ec2:DescribeInstanceTypes",
            **common,
            "used_for": "instance types: accelerator kind, model, count and memory (GpuInfo, "
            "NeuronInfo, InferenceAcceleratorInfo), vCPUs, memory, architecture, EFA",
        },
        {
            "api": "ec2:DescribeAvailabilityZones",
            **common,
            "used_for": "zone name -> zone ID (offerings name zones by ID)",
        },
        {
            "api": "ec2:DescribeSpotPriceHistory",
            **common,
            "product_description": SPOT_PRODUCT_DESCRIPTION,
            "used_for": "per-AZ spot price: the latest price per instance type and zone",
        },
        {
            "api": "pricing:GetProducts",
            **common,
            "endpoint": PRICING_ENDPOINT_REGION,
            "filters": {**_PRICING_TERMS, "regionCode": "<region>"},
            "used_for": "per-region Linux on-demand price (OnDemand term, USD per hour)",
        },
        {
            "file": "previous catalog",
            "origin": "interruption buckets are in no AWS API (Spot Instance Advisor only); "
            "carried over from the previous catalog where instance type and region match",
            "date": previous.generated,
            "date_note": "the previous catalog's `generated`; its buckets may be older still",
            "previous_sources": previous.origins,
            "carried_rows": carried,
            "used_for": "interruption_bucket (null where the previous catalog has none)",
        },
    ]


def build_document(
    regions: Sequence[RegionPages],
    *,
    fetched: date,
    previous: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    """A catalog document from the API pages of `regions`, read on `fetched`.

    `previous` (normally the bundled catalog) supplies interruption buckets, the nominal GPU
    memory and model spellings; without it buckets are null.
    """
    names = [p.region for p in regions]
    if not regions:
        raise RefreshError("no regions to refresh")
    if len(set(names)) != len(names):
        raise RefreshError(f"a region is listed twice: {names}")
    for region in names:
        if not STD_REGION.match(region):
            raise RefreshError(f"not a standard AWS region: {region!r}")
    prev = _Previous.of(previous)
    corrections = _Corrections()
    types = _instance_types(regions, prev, corrections)
    if not types:
        raise RefreshError("DescribeInstanceTypes returned no catalog instance types")

    notes: list[str] = []
    dropped_zones: set[str] = set()
    offerings: dict[tuple[str, str, str | None], list[Any]] = {}
    for pages in sorted(regions, key=lambda p: p.region):
        region = pages.region
        od_prices = on_demand_prices(pages.products, region, notes)
        ids = zone_ids(pages.availability_zones)
        spot_by_type: dict[str, dict[str, float]] = {}
        for (itype, zone_name), usd in latest_spot_prices(pages.spot_price_history).items():
            if itype not in types:
                continue
            zone = ids.get(zone_name)
            if zone is None or not STD_AZ_ID.match(zone):
                dropped_zones.add(zone or zone_name)
                continue
            spot_by_type.setdefault(itype, {})[zone] = usd
        for itype in sorted(types):
            od = od_prices.get(itype)
            bucket = prev.buckets.get((itype, region))
            zones = spot_by_type.get(itype, {})
            for zone in sorted(zones):
                spot = clean_spot(zones[zone], od, f"{itype} {zone}", notes)
                if od is not None or spot is not None:
                    offerings[(itype, region, zone)] = [od, spot, bucket]
            if not zones and od is not None:
                offerings[(itype, region, None)] = [od, None, None]

    extra: list[dict[str, Any]] = []
    if notes:
        extra.append(
            {
                "instance_type": "*",
                "fields": {"spot_usd_per_hour": ["above on-demand", "clamped or null"]},
                "reason": "price notes: " + "; ".join(sorted(notes)),
            }
        )
    if dropped_zones:
        extra.append(
            {
                "instance_type": "*",
                "fields": {"zone": ["local/Wavelength or unknown zone", "excluded"]},
                "reason": "local zones and Wavelength zones need opt-in and special subnets and "
                "are not used for training; excluded: " + ", ".join(sorted(dropped_zones)),
            }
        )
    rows = [
        {
            "instance_type": t,
            "region": r,
            "zone": z,
            "on_demand_usd_per_hour": price(v[0]),
            "spot_usd_per_hour": price(v[1]),
            "interruption_bucket": v[2] if v[1] is not None else None,
        }
        for (t, r, z), v in sorted(
            offerings.items(), key=lambda kv: (kv[0][0], kv[0][1], kv[0][2] or "")
        )
    ]
    carried = sum(1 for r in rows if r["interruption_bucket"] is not None)
    return {
        "schema_version": SCHEMA_VERSION,
        "generated": fetched.isoformat(),
        "generated_note": "the date the AWS APIs were read (given by the caller); interruption "
        "buckets come from the previous catalog and are older, see sources",
        "sources": _source_entries(sorted(names), fetched.isoformat(), prev, carried),
        "interruption_buckets": list(INTERRUPTION_BUCKETS),
        "corrections": corrections.entries() + extra,
        "instance_types": [types[k] for k in sorted(types)],
        "offerings": rows,
    }
