"""The instance catalog: EC2 instance types and where, how and at what price they are sold.

Pure data and lookups. The bundled snapshot (`gpufleet/catalog/catalog.json`) is built by
`scripts/build_catalog.py` from dated third-party data; see `gpufleet/catalog/README.md`.
An `Offering` is one way to buy an instance type: (type, region, zone, capacity type) at an
hourly price, with the Spot Advisor interruption bucket for spot.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import date
from functools import lru_cache
from importlib import resources
from typing import Any, Literal, get_args

from gpufleet.errors import RefusedInput

CapacityType = Literal["spot", "on-demand"]
Accelerator = Literal["nvidia", "amd", "trainium", "inferentia", "qualcomm", "gaudi", "none"]
Arch = Literal["x86_64", "arm64"]

CAPACITY_TYPES: tuple[CapacityType, ...] = ("spot", "on-demand")
_ACCELERATORS: frozenset[str] = frozenset(get_args(Accelerator))
_ARCHES: frozenset[str] = frozenset(get_args(Arch))

# Spot Advisor buckets: index -> label ("frequency of interruption" over the trailing month).
INTERRUPTION_BUCKETS: tuple[str, ...] = ("<5%", "5-10%", "10-15%", "15-20%", ">20%")


class CatalogError(RefusedInput, ValueError):
    """The catalog document is malformed."""


def normalize_model(name: str) -> str:
    """Canonical form of a GPU model name for allow-list matching.

    Case-insensitive, ignores vendor words and separators: 'A100', 'a100', 'NVIDIA A100' and
    'nvidia-a100' are equal; 'A10' and 'A10G' are not.
    """
    words = name.lower().replace("-", " ").replace("_", " ").split()
    drop = {"nvidia", "tesla", "tensor", "core", "aws", "amd", "grid"}
    return "".join(w for w in words if w not in drop)


@dataclass(frozen=True, slots=True)
class InstanceType:
    """One EC2 instance type. GPU memory is per GPU; `gpus` counts whole GPUs only."""

    name: str
    accelerator: Accelerator
    gpu_model: str | None
    gpus: int
    gpu_memory_gib: float
    vcpus: int
    memory_gib: float
    arch: Arch
    efa: bool
    # Physical network cards, and how many EFA interfaces the type takes (one per card that
    # carries EFA; 0 without EFA): EC2 DescribeInstanceTypes' MaximumNetworkCards and
    # EfaInfo.MaximumEfaInterfaces.
    network_cards: int = 1
    efa_interfaces: int = 0
    # Instance-store disks, their total size (GB, as AWS states it) and whether they are NVMe:
    # DescribeInstanceTypes' InstanceStorageInfo. A spec's `instance_store` volume needs NVMe
    # disks (what the agent stripes and mounts); 0 / 0 / False for EBS-only types.
    instance_store_disks: int = 0
    instance_store_gb: int = 0
    instance_store_nvme: bool = False
    # Share of one physical GPU for fractional-GPU types (g6f, gr6f); None otherwise.
    gpu_fraction: float | None = None
    model_key: str = field(default="", compare=False, repr=False)

    def __post_init__(self) -> None:
        if not self.model_key and self.gpu_model:
            object.__setattr__(self, "model_key", normalize_model(self.gpu_model))

    @property
    def family(self) -> str:
        return self.name.split(".", 1)[0]

    @property
    def is_cpu_only(self) -> bool:
        return self.accelerator == "none"

    @property
    def has_nvme_instance_store(self) -> bool:
        """Whether the type has the NVMe instance-store disks an `instance_store` volume needs."""
        return self.instance_store_nvme and self.instance_store_disks > 0


@dataclass(frozen=True, slots=True)
class Offering:
    """One way to buy an instance type: in a region (and zone, when known), spot or on-demand."""

    instance_type: InstanceType
    region: str
    zone: str | None
    capacity_type: CapacityType
    hourly_usd: float
    interruption_bucket: int | None  # Spot Advisor bucket 0..4; None for on-demand or unknown

    @property
    def location(self) -> str:
        """The zone, or the region when the price is only known per region."""
        return self.zone or self.region

    @property
    def key(self) -> str:
        """`capacity-type:instance-type:zone` (zone = region when unknown), as capacity memory."""
        return f"{self.capacity_type}:{self.instance_type.name}:{self.location}"


def offering_key(capacity_type: str, instance_type: str, zone: str) -> str:
    """The key `unavailable` sets use; `zone` is the region for region-level offerings."""
    return f"{capacity_type}:{instance_type}:{zone}"


@dataclass(frozen=True, slots=True)
class RegionIndex:
    """A region's offerings grouped by instance type, built once per catalog and region."""

    region: str
    offerings: tuple[Offering, ...]
    # (instance type, its offerings in this region), accelerated and CPU-only types apart.
    accelerated: tuple[tuple[InstanceType, tuple[Offering, ...]], ...]
    cpu_only: tuple[tuple[InstanceType, tuple[Offering, ...]], ...]


def _req(row: Mapping[str, Any], key: str, where: str) -> Any:
    if key not in row:
        raise CatalogError(f"{where}: missing '{key}'")
    return row[key]


def _instance_type(row: Mapping[str, Any]) -> InstanceType:
    name = str(_req(row, "name", "instance type"))
    where = f"instance type {name}"
    accelerator = str(_req(row, "accelerator", where))
    arch = str(_req(row, "arch", where))
    if accelerator not in _ACCELERATORS:
        raise CatalogError(f"{where}: unknown accelerator {accelerator!r}")
    if arch not in _ARCHES:
        raise CatalogError(f"{where}: unknown arch {arch!r}")
    gpu_model = row.get("gpu_model")
    fraction = row.get("gpu_fraction")
    try:
        it = InstanceType(
            name=name,
            accelerator=accelerator,  # type: ignore[arg-type]
            gpu_model=None if gpu_model is None else str(gpu_model),
            gpus=int(_req(row, "gpus", where)),
            gpu_memory_gib=float(_req(row, "gpu_memory_gib", where)),
            vcpus=int(_req(row, "vcpus", where)),
            memory_gib=float(_req(row, "memory_gib", where)),
            arch=arch,  # type: ignore[arg-type]
            efa=bool(_req(row, "efa", where)),
            network_cards=int(row.get("network_cards", 1)),
            efa_interfaces=int(row.get("efa_interfaces", 0)),
            instance_store_disks=int(row.get("instance_store_disks", 0)),
            instance_store_gb=int(row.get("instance_store_gb", 0)),
            instance_store_nvme=bool(row.get("instance_store_nvme", False)),
            gpu_fraction=None if fraction is None else float(fraction),
        )
    except (TypeError, ValueError) as exc:
        raise CatalogError(f"{where}: {exc}") from None
    if it.gpus < 0 or it.vcpus < 1 or it.memory_gib <= 0 or it.gpu_memory_gib < 0:
        raise CatalogError(f"{where}: impossible sizes")
    efa_fits = 1 <= it.efa_interfaces <= it.network_cards if it.efa else it.efa_interfaces == 0
    if it.network_cards < 1 or not efa_fits:
        raise CatalogError(f"{where}: its EFA interfaces do not fit its network cards")
    if it.instance_store_disks < 0 or (it.instance_store_disks > 0) != (it.instance_store_gb > 0):
        raise CatalogError(f"{where}: instance-store disks and size disagree")
    if it.instance_store_nvme and not it.instance_store_disks:
        raise CatalogError(f"{where}: NVMe instance store without disks")
    if it.is_cpu_only and it.gpus:
        raise CatalogError(f"{where}: CPU-only type with GPUs")
    return it


def _offerings(row: Mapping[str, Any], types: Mapping[str, InstanceType]) -> list[Offering]:
    name = str(_req(row, "instance_type", "offering"))
    region = str(_req(row, "region", f"offering {name}"))
    zone = row.get("zone")
    where = f"offering {name} {zone or region}"
    if name not in types:
        raise CatalogError(f"{where}: unknown instance type")
    it = types[name]
    out = []
    on_demand = row.get("on_demand_usd_per_hour")
    spot = row.get("spot_usd_per_hour")
    bucket = row.get("interruption_bucket")
    if bucket is not None and (
        not isinstance(bucket, int) or not 0 <= bucket < len(INTERRUPTION_BUCKETS)
    ):
        raise CatalogError(f"{where}: interruption_bucket must be 0..4 or null")
    zone_s = None if zone is None else str(zone)
    for capacity_type, price, b in (("on-demand", on_demand, None), ("spot", spot, bucket)):
        if price is None:
            continue
        hourly = float(price)
        if not hourly > 0:
            raise CatalogError(f"{where}: {capacity_type} price must be positive")
        out.append(Offering(it, region, zone_s, capacity_type, hourly, b))  # type: ignore[arg-type]
    return out


class Catalog:
    """Instance types and offerings, indexed by name and by region. Treat as immutable."""

    def __init__(
        self,
        instance_types: Sequence[InstanceType],
        offerings: Sequence[Offering],
        *,
        generated: str | None = None,
        sources: Sequence[Mapping[str, Any]] = (),
        corrections: Sequence[Mapping[str, Any]] = (),
    ) -> None:
        self._types: dict[str, InstanceType] = {}
        for it in instance_types:
            if it.name in self._types:
                raise CatalogError(f"instance type {it.name} listed twice")
            self._types[it.name] = it
        by_region: dict[str, list[Offering]] = {}
        seen: set[str] = set()
        for o in offerings:
            if o.instance_type.name not in self._types:
                raise CatalogError(f"offering for unknown instance type {o.instance_type.name}")
            key = f"{o.region}|{o.key}"
            if key in seen:
                raise CatalogError(f"offering {o.key} in {o.region} listed twice")
            seen.add(key)
            by_region.setdefault(o.region, []).append(o)
        self._index: dict[str, RegionIndex] = {
            region: _build_index(region, offs) for region, offs in sorted(by_region.items())
        }
        self.generated = generated
        self.sources: tuple[Mapping[str, Any], ...] = tuple(sources)
        self.corrections: tuple[Mapping[str, Any], ...] = tuple(corrections)

    @classmethod
    def from_document(cls, document: Mapping[str, Any]) -> Catalog:
        """Build from the catalog JSON document (see scripts/build_catalog.py)."""
        if not isinstance(document, Mapping):
            raise CatalogError("a catalog document is a JSON object")
        types = [_instance_type(r) for r in _req(document, "instance_types", "catalog")]
        by_name = {t.name: t for t in types}
        offerings = [
            o for r in _req(document, "offerings", "catalog") for o in _offerings(r, by_name)
        ]
        return cls(
            types,
            offerings,
            generated=document.get("generated"),
            sources=document.get("sources", ()),
            corrections=document.get("corrections", ()),
        )

    def instance_type(self, name: str) -> InstanceType:
        """The instance type called `name`; KeyError if the catalog has none."""
        try:
            return self._types[name]
        except KeyError:
            raise KeyError(f"unknown instance type {name!r}") from None

    def instance_types(self) -> list[InstanceType]:
        return list(self._types.values())

    def regions(self) -> list[str]:
        """Regions with at least one offering, sorted."""
        return list(self._index)

    def offerings(self, region: str) -> list[Offering]:
        """Every offering in `region` (empty for an unknown region)."""
        index = self._index.get(region)
        return list(index.offerings) if index else []

    def region_index(self, region: str) -> RegionIndex | None:
        """The precomputed per-region grouping selection works from; None if unknown."""
        return self._index.get(region)

    def __len__(self) -> int:
        return sum(len(i.offerings) for i in self._index.values())

    def __repr__(self) -> str:
        return (
            f"Catalog({len(self._types)} instance types, {len(self)} offerings, "
            f"{len(self._index)} regions, generated={self.generated!r})"
        )


def _build_index(region: str, offerings: list[Offering]) -> RegionIndex:
    offerings.sort(key=lambda o: (o.instance_type.name, o.zone or "", o.capacity_type))
    grouped: dict[str, list[Offering]] = {}
    for o in offerings:
        grouped.setdefault(o.instance_type.name, []).append(o)
    groups = [(offs[0].instance_type, tuple(offs)) for offs in grouped.values()]
    return RegionIndex(
        region=region,
        offerings=tuple(offerings),
        accelerated=tuple(g for g in groups if not g[0].is_cpu_only),
        cpu_only=tuple(g for g in groups if g[0].is_cpu_only),
    )


def bundled_document() -> dict[str, Any]:
    """The bundled snapshot as its JSON document (a fresh copy each call)."""
    text = resources.files("gpufleet").joinpath("catalog/catalog.json").read_text("utf-8")
    document: dict[str, Any] = json.loads(text)
    return document


@lru_cache(maxsize=1)
def load_bundled() -> Catalog:
    """The catalog snapshot shipped in the package (parsed once per process)."""
    return Catalog.from_document(bundled_document())


@dataclass(frozen=True, slots=True)
class CatalogChoice:
    """The catalog a deployment plans with, and why that one (said once in the log)."""

    catalog: Catalog
    source: Literal["refreshed", "bundled"]
    reason: str


def choose_catalog(
    refreshed: Mapping[str, Any] | None,
    *,
    region: str,
    today: date,
    max_age_days: int,
    bundled: Catalog,
    absent_reason: str = "no refreshed catalog",
) -> CatalogChoice:
    """The refreshed catalog document when it loads, prices `region` and was read from the AWS
    APIs at most `max_age_days` before `today`; else the bundled snapshot, with the reason.

    A stale refresh is refused rather than trusted: prices that stopped being refreshed are
    no better than the bundled ones, and the bundled ones are reviewed.
    """
    if refreshed is None:
        return CatalogChoice(bundled, "bundled", absent_reason)
    try:
        catalog = Catalog.from_document(refreshed)
    except (CatalogError, KeyError, TypeError, ValueError) as exc:
        return CatalogChoice(bundled, "bundled", f"refreshed catalog does not load: {exc}")
    try:
        generated = date.fromisoformat(str(catalog.generated))
    except ValueError:
        return CatalogChoice(
            bundled, "bundled", f"refreshed catalog has no date: {catalog.generated!r}"
        )
    age = (today - generated).days
    if age > max_age_days:
        return CatalogChoice(
            bundled,
            "bundled",
            f"refreshed catalog of {generated} is {age} days old (more than {max_age_days})",
        )
    if age < 0:
        return CatalogChoice(bundled, "bundled", f"refreshed catalog is dated ahead: {generated}")
    if not catalog.offerings(region):
        return CatalogChoice(bundled, "bundled", f"refreshed catalog has no offering in {region}")
    return CatalogChoice(catalog, "refreshed", f"refreshed catalog of {generated}")
