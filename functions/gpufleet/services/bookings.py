"""Bookings: GPUs held for a team over a window (`gpufleet book`)."""

from __future__ import annotations

import uuid

from gpufleet.domain.queueing import Booking, BookingNotFound, QueuePolicy, check_booking
from gpufleet.ports import Ports


def book(
    ports: Ports, policy: QueuePolicy, team: str, gpus: int, start: float, end: float
) -> Booking:
    """Book `gpus` for `team` from `start` to `end` (epoch seconds). Raises BookingRefused,
    with nothing booked, for a booking the fleet could never honour."""
    booking = Booking(f"b-{uuid.uuid4().hex[:12]}", team, gpus, start, end)
    now = ports.clock.now()
    ports.queue.book(booking, lambda booked: check_booking(booking, booked, now, policy))
    return booking


def cancel(ports: Ports, booking_id: str) -> Booking:
    """Cancel a booking; BookingNotFound when there is none by that id."""
    cancelled = ports.queue.cancel_booking(booking_id)
    if cancelled is None:
        raise BookingNotFound(booking_id)
    return cancelled


def expire(ports: Ports) -> list[Booking]:
    """Remove the bookings whose window has ended (the reconciler, every pass)."""
    return ports.queue.expire_bookings(ports.clock.now())
