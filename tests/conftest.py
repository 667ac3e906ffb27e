"""Suite-wide collection order."""

from __future__ import annotations

import pytest


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """The modules marked `long` first, each in its place otherwise: xdist hands whole modules
    to its workers in this order, and a minutes-long module handed out last would leave the
    other workers idle while it runs alone."""
    items.sort(key=lambda item: item.get_closest_marker("long") is None)
