"""Suite-wide: the collection order, and what the whole session shares."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

import pytest

from tests.helpers import shared

if TYPE_CHECKING:
    from tests.infrastructure.conftest import Synth


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """The modules marked `long` first, each in its place otherwise: xdist hands whole modules
    to its workers in this order, and a minutes-long module handed out last would leave the
    other workers idle while it runs alone."""
    items.sort(key=lambda item: item.get_closest_marker("long") is None)


@pytest.fixture(scope="session")
def session_folder(tmp_path_factory: pytest.TempPathFactory, testrun_uid: str) -> Path:
    """This session's folder for what its processes share (`tests.helpers.shared`): the same
    for every xdist worker, and no other session's."""
    folder = tmp_path_factory.getbasetemp().parent / f"shared-{testrun_uid}"
    folder.mkdir(exist_ok=True)
    return folder


@pytest.fixture(scope="session")
def synth(session_folder: Path) -> Synth:
    """The stack as `cdk synth` makes it with the repository's config: synthesized once per
    session (a synth is ten seconds of CDK's CPU) and read by every process from its folder."""
    # Imported here: CDK starts its node process on import, which unit-only runs never need.
    from tests.infrastructure.conftest import synthesize, synthesized

    def make() -> Path:
        outdir = session_folder / "cdk.out"
        synthesize(outdir)
        return outdir

    return synthesized(shared(session_folder, "synth", make))
