"""Each emulated instance's private IP is a loopback address of its own.

The embedded account's nodes are local processes (the fake docker runs each container's command
on this machine), so the address EC2 gives an instance, and the run manifest names for its
peers, must be one this machine answers on: Linux routes all of 127.0.0.0/8 to the loopback
interface. Addresses are handed out in order from a block chosen by the process id, so that
two emulators on one machine (parallel test workers) do not share addresses, and never
127.0.0.1 (what a process binds to that means "this machine" already).
"""

from __future__ import annotations

import ipaddress
import itertools
import os
import threading
from collections.abc import Callable, Iterator
from typing import Any

# 127.<block>.0.2 onwards: 250 blocks of 65,534 addresses, one block per emulator process.
_BLOCKS = 250


def _addresses(block: int) -> Iterator[str]:
    network = ipaddress.ip_network(f"127.{block}.0.0/16")
    for address in itertools.islice(network.hosts(), 1, None):  # from .0.2
        yield str(address)


class LoopbackAddresses:
    """Hands out loopback addresses, each once, thread-safely."""

    def __init__(self, block: int | None = None) -> None:
        self._next = _addresses(1 + (os.getpid() % _BLOCKS) if block is None else block)
        self._lock = threading.Lock()

    def take(self) -> str:
        with self._lock:
            return next(self._next)


ADDRESSES = LoopbackAddresses()


def loopback_subnet_ips(_original: Any) -> Callable[[Any, Any], str]:
    """moto's `Subnet.get_available_subnet_ip`, giving out loopback addresses (booked in the
    subnet as moto books its own, so that a release frees it)."""

    def get_available_subnet_ip(self: Any, instance: Any) -> str:
        address = ADDRESSES.take()
        self._subnet_ips[address] = instance
        return address

    return get_available_subnet_ip
