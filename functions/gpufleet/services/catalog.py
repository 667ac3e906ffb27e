"""The catalog the functions plan with: the one refreshed into the stack's bucket, else bundled.

`current_catalog` is what every planning function reads, once per process and only when it
first needs the catalog (`services.factory`): the refreshed document (`topology.CATALOG_KEY`,
written daily by `services.catalog_refresh`) when `domain.catalog.choose_catalog` accepts it,
else the bundled snapshot.
"""

from __future__ import annotations

import json
import logging
from datetime import UTC, datetime
from typing import Any

from gpufleet import topology
from gpufleet.domain.catalog import CatalogChoice, choose_catalog, load_bundled
from gpufleet.ports import Clock, ObjectMissing, ObjectStore

# A one-region catalog is a few hundred KiB; anything far larger is not one.
MAX_CATALOG_BYTES = 16 * 1024 * 1024

_log = logging.getLogger(__name__)


def current_catalog(
    objects: ObjectStore, clock: Clock, *, region: str, max_age_days: int
) -> CatalogChoice:
    """The refreshed catalog if present, valid and fresh, else the bundled one; logs which."""
    document: Any = None
    absent = "no refreshed catalog"
    try:
        document = json.loads(objects.get_bytes(topology.CATALOG_KEY, MAX_CATALOG_BYTES))
    except ObjectMissing:
        pass
    except Exception as exc:
        # Any failure to read the refreshed catalog falls back to the bundled one.
        # Without s3:ListBucket, S3 answers a missing key with AccessDenied, not NoSuchKey;
        # a throttled or unreadable object is no reason to fail a launch either.
        absent = f"refreshed catalog unreadable: {type(exc).__name__}: {exc}"
    choice = choose_catalog(
        document,
        region=region,
        today=datetime.fromtimestamp(clock.now(), UTC).date(),
        max_age_days=max_age_days,
        bundled=load_bundled(),
        absent_reason=absent,
    )
    _log.info(
        "planning with the %s catalog",
        choice.source,
        extra={"catalog": choice.source, "reason": choice.reason, "key": topology.CATALOG_KEY},
    )
    return choice
