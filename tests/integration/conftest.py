"""Integration tests run against moto, in-process. One embedded account per module."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from gpufleet.emulator.account import Account, embedded_account
from gpufleet.emulator.demo import DemoResult
from tests.integration.demo_runs import SpotRun, preemption_run, shared, spot_run, stages_run


@pytest.fixture(scope="module")
def account() -> Iterator[Account]:
    with embedded_account() as created:
        yield created


@pytest.fixture(scope="module")
def aws_env() -> Iterator[None]:
    """Fake credentials for tests that start moto themselves."""
    saved = dict(os.environ)
    os.environ.update(
        {
            "AWS_ACCESS_KEY_ID": "testing",
            "AWS_SECRET_ACCESS_KEY": "testing",
            "AWS_DEFAULT_REGION": "us-east-1",
            "AWS_ACCOUNT_ID_ENDPOINT_MODE": "disabled",
        }
    )
    yield
    os.environ.clear()
    os.environ.update(saved)


@pytest.fixture(scope="session")
def demo_runs(tmp_path_factory: pytest.TempPathFactory, testrun_uid: str) -> Path:
    """This session's folder of shared demo runs, the same for every xdist worker."""
    folder = tmp_path_factory.getbasetemp().parent / f"demo-runs-{testrun_uid}"
    folder.mkdir(exist_ok=True)
    return folder


@pytest.fixture(scope="session")
def spot_demo(demo_runs: Path) -> SpotRun:
    return shared(demo_runs, "spot", spot_run)


@pytest.fixture(scope="session")
def preemption_demo(demo_runs: Path) -> DemoResult:
    return shared(demo_runs, "preemption", preemption_run)


@pytest.fixture(scope="session")
def stages_demo(demo_runs: Path) -> DemoResult:
    return shared(demo_runs, "stages", stages_run)
