"""Reserved capacity over time: how long a reservation can still hold a run, which runs on a
Capacity Block must stop before it ends, and what an hour on a reservation costs.

A Capacity Block for ML ends at its `end`, but EC2 begins terminating the instances in it 30
minutes earlier: its "Capacity Block Reservation Expiration Warning" event comes 40 minutes
before the end and says that the instances "will begin to terminate in 10 minutes"
(docs.aws.amazon.com/AWSEC2/latest/UserGuide/capacity-blocks-monitor.html). A run on a block is
therefore asked to checkpoint `drain_lead` before that (the reconciler's period, which looks,
plus the checkpoint grace, which the dispatcher then enforces), and a job is only launched into
a block when its expected run ends before that moment. An ODCR has no end but the one the
config names, and no lead. A run whose node is lost once EC2 has begun terminating its block's
instances (its drain missed, or it did not stop in time) lost it to the block's end
(`ended_with_block`), not to a fault of its own.

Once EC2 warned of a block's end, the block takes no new run, whatever the config says of its
end: its drain time is past (`drain_at` with `warned`). The warning is kept in the capacity
memory under `warned_block_key` (beside the offerings' keys, which it never matches), until
the block has ended by the config's word and EC2's, so that every Launch plans without it.
"""

from __future__ import annotations

import math
from collections.abc import Collection, Iterable, Mapping
from dataclasses import dataclass

from gpufleet.domain.catalog import Catalog, CatalogError
from gpufleet.domain.config import Reservation, ReservationKind

# EC2 begins terminating a Capacity Block's instances this long before the block's end.
BLOCK_TERMINATION_LEAD_SECONDS = 30 * 60
# The capacity memory's keys of warned blocks start so (an offering's is `type:instance:zone`).
WARNED_BLOCK_PREFIX = "warned-block:"


@dataclass(frozen=True, slots=True)
class FreeReservation:
    """A reservation as a plan sees it: instances no live job holds, and how long a run
    launched into it may last (None: no end); `starts_at` for a Capacity Block that has not
    started yet (None: active now), which a job that asks to may wait for."""

    reservation: Reservation
    free: int
    seconds_left: float | None = None
    starts_at: float | None = None


def drain_lead_seconds(check_period_seconds: int, grace_seconds: int) -> int:
    """How long before EC2 begins terminating a block's instances its runs are asked to
    checkpoint: the check that notices may come a period late, and the run then has the
    checkpoint grace to stop."""
    return check_period_seconds + grace_seconds


def warned_block_key(reservation_id: str) -> str:
    """The capacity memory's key that says EC2 warned of the block's end."""
    return WARNED_BLOCK_PREFIX + reservation_id


def warned_blocks(remembered: Iterable[str]) -> frozenset[str]:
    """The blocks (reservation ids) EC2 warned of, among the capacity memory's keys."""
    return frozenset(
        key.removeprefix(WARNED_BLOCK_PREFIX)
        for key in remembered
        if key.startswith(WARNED_BLOCK_PREFIX)
    )


def warning_kept_until(
    reservation_id: str, reservations: Iterable[Reservation], warned_end: float
) -> float:
    """Until when a block's warning is kept: its end by EC2's word (`warned_end`, the
    warning's end date), or by the config's if that is later (else planning would take the
    block again, ended, until the config's end)."""
    ends = [r.end.timestamp() for r in reservations if r.id == reservation_id and r.end is not None]
    return max([warned_end, *ends])


def drain_at(
    reservation: Reservation, drain_lead: float, warned: Collection[str] = ()
) -> float | None:
    """When the runs on the reservation must be asked to checkpoint (None: never); already
    past (-inf) for a block EC2 `warned` of, which takes no new run either."""
    if reservation.id in warned:
        return -math.inf
    if reservation.end is None:
        return None
    terminates = block_terminates_at(reservation)
    end = reservation.end.timestamp() if terminates is None else terminates
    return end - drain_lead


def block_terminates_at(reservation: Reservation) -> float | None:
    """When EC2 begins terminating the reservation's instances (None: it never does, as an
    ODCR, or a block with no end)."""
    if reservation.kind is not ReservationKind.CAPACITY_BLOCK or reservation.end is None:
        return None
    return reservation.end.timestamp() - BLOCK_TERMINATION_LEAD_SECONDS


def ended_with_block(
    reservation_id: str | None, reservations: Iterable[Reservation], at: float
) -> bool:
    """Whether a node lost at `at` on the reservation `reservation_id` went with its Capacity
    Block: EC2 had begun terminating the block's instances by then."""
    for reservation in reservations:
        if reservation.id == reservation_id:
            terminates = block_terminates_at(reservation)
            return terminates is not None and at >= terminates
    return False


def seconds_left(
    reservation: Reservation, now: float, drain_lead: float, warned: Collection[str] = ()
) -> float | None:
    """How long a run launched into the reservation now may last before it is drained (None:
    no end; never below 0: none on a block EC2 `warned` of)."""
    at = drain_at(reservation, drain_lead, warned)
    return None if at is None else max(0.0, at - now)


def free_reservations(
    reservations: Iterable[Reservation],
    held: Mapping[str, int],
    now: float,
    drain_lead: float,
    warned: Collection[str] = (),
) -> list[FreeReservation]:
    """The reservations active now, with the instances `held` (per reservation id) leaves free
    and the time left to a run launched into each (none on a block EC2 `warned` of); then the
    Capacity Blocks that start later, with the time a run launched at their start has."""
    listed = list(reservations)
    active = [
        FreeReservation(r, r.count - held.get(r.id, 0), seconds_left(r, now, drain_lead, warned))
        for r in listed
        if r.active_at(now)
    ]
    upcoming = [
        FreeReservation(r, r.count, seconds_left(r, start, drain_lead), starts_at=start)
        for r in listed
        if r.kind is ReservationKind.CAPACITY_BLOCK
        and r.start is not None
        and (start := r.start.timestamp()) > now
    ]
    return active + upcoming


def fits_in_time(free: FreeReservation, expected_seconds: float) -> bool:
    """Whether a run expected to last `expected_seconds` ends before the reservation's runs
    are drained."""
    return free.seconds_left is None or expected_seconds <= free.seconds_left


def runs_to_drain(
    placements: Iterable[tuple[str, str]],
    reservations: Iterable[Reservation],
    now: float,
    drain_lead: float,
    warned: Collection[str] = (),
) -> list[str]:
    """The jobs (of `placements`: job id, reservation id) whose reservation's end is near
    enough that they must checkpoint and go back to the queue now: by the config's end date,
    or because EC2 warned of the block's end (`warned`: its "Capacity Block Reservation
    Expiration Warning", whatever the config says of the block, or if it names none)."""
    due = {
        r.id
        for r in reservations
        if (at := drain_at(r, drain_lead, warned)) is not None and now >= at
    }
    due |= set(warned)  # a block the config does not list: EC2's word is enough
    return sorted(job_id for job_id, reservation_id in placements if reservation_id in due)


def reservation_hourly_usd(reservation: Reservation, catalog: Catalog, region: str) -> float:
    """What one instance-hour on the reservation costs: the price the config gives it (a
    Capacity Block's, its fee over its hours; the catalog has none), else the catalog's
    on-demand price of its type in the region, which is what AWS bills an ODCR at (used or
    not). Raises CatalogError when neither is known."""
    if reservation.hourly_usd is not None:
        return reservation.hourly_usd
    prices = [
        o.hourly_usd
        for o in catalog.offerings(region)
        if o.instance_type.name == reservation.instance_type and o.capacity_type == "on-demand"
    ]
    if not prices:
        raise CatalogError(
            f"reservation {reservation.id}: the catalog has no on-demand price of "
            f"{reservation.instance_type} in {region}; give its hourly_usd in the config"
        )
    return max(prices)
