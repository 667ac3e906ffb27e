"""Bookings: GPUs held for a team over a window (`gpufleet book`)."""

from __future__ import annotations

import uuid

from gpufleet.domain.queueing import Booking, QueuePolicy, check_booking
from gpufleet.ports import Ports


def book(
    ports: Ports, policy: QueuePolicy, team: str, gpus: int, start: float, end: float
) -> Booking:
    """Book `gpus` for `team` from `start` to `end` (epoch seconds). Raises BookingRefused,
    with nothing booked, for a booking the fleet could never honour."""
    booking = Booking(f"b-{uuid.uuid4().hex[:12]}", team, gpus, start, end)
    check_booking(booking, ports.queue.bookings(), ports.clock.now(), policy)
    ports.queue.book(booking)
    return booking
