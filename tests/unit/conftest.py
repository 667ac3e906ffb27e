"""Unit tests are pure: no network, no AWS (not even moto)."""

from __future__ import annotations

import pytest
from pytest_socket import disable_socket, enable_socket


@pytest.fixture(autouse=True)
def _no_network() -> object:
    disable_socket(allow_unix_socket=True)
    yield
    enable_socket()
