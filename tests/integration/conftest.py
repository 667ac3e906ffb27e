"""Integration tests run against moto, in-process. One embedded account per module."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from gpufleet.emulator.account import Account, embedded_account
from gpufleet.emulator.demo import DemoResult
from tests.helpers import shared
from tests.integration.demo_runs import (
    SpotRun,
    SweepRun,
    preemption_run,
    spot_run,
    stages_run,
    sweep_run,
)


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
def spot_demo(session_folder: Path) -> SpotRun:
    return shared(session_folder, "spot", spot_run)


@pytest.fixture(scope="session")
def preemption_demo(session_folder: Path) -> DemoResult:
    return shared(session_folder, "preemption", preemption_run)


@pytest.fixture(scope="session")
def stages_demo(session_folder: Path) -> DemoResult:
    return shared(session_folder, "stages", stages_run)


@pytest.fixture(scope="session")
def sweep_demo(session_folder: Path) -> SweepRun:
    return shared(session_folder, "sweep", sweep_run)
