"""The catalog refresh: the AWS APIs' prices into the stack's bucket, daily.

`CatalogRefreshService` (the CatalogRefresh function, on a daily schedule) rebuilds the
deployment region's catalog from the AWS APIs, as `gpufleet catalog refresh` does, and writes it
under `topology.CATALOG_KEY`, where `services.catalog.current_catalog` finds it.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from gpufleet import topology
from gpufleet.domain.catalog import Catalog, bundled_document
from gpufleet.domain.catalog_refresh import RegionPages, build_document
from gpufleet.ports import Clock, ObjectStore

# The API pages of some regions read at a moment (the adapter: `catalog_source`).
Fetch = Callable[[Sequence[str], datetime], list[RegionPages]]


def refreshed_document(
    pages: list[RegionPages], *, now: datetime, previous: Mapping[str, Any]
) -> dict[str, Any]:
    """A catalog document from API pages read at `now`, checked to load. Raises RefreshError
    or CatalogError."""
    document = build_document(pages, fetched=now.astimezone(UTC).date(), previous=previous)
    Catalog.from_document(document)
    return document


@dataclass(frozen=True)
class RefreshResult:
    key: str
    generated: str
    offerings: int


class CatalogRefreshService:
    def __init__(self, objects: ObjectStore, clock: Clock, fetch: Fetch, region: str) -> None:
        self._objects = objects
        self._clock = clock
        self._fetch = fetch
        self._region = region

    def run(self) -> RefreshResult:
        """Rebuild the region's catalog and write it; a failure writes nothing (the readers
        keep the last one while it is fresh, then the bundled one)."""
        now = datetime.fromtimestamp(self._clock.now(), UTC)
        document = refreshed_document(
            self._fetch([self._region], now), now=now, previous=bundled_document()
        )
        self._objects.put_json(topology.CATALOG_KEY, document)
        return RefreshResult(
            topology.CATALOG_KEY, document["generated"], len(document["offerings"])
        )
