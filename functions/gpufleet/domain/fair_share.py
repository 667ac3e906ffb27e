"""Fair share over time: each team's recent GPU-hours, decayed with a half-life, per share.

Within one priority class the admission pass takes the teams in the order of their standing,
`standing`: their decayed usage divided by their share (`TeamQuota.share`; 1 for every team by
default, so equal shares). A team that ran less lately goes first; FIFO orders the jobs of one
team, and the class order (with its aging) is untouched (`queueing.decide_streams`).

Usage is the GPU-hours of a team's runs (the GPUs its share counted, for as long as the run
held its instances), charged when the run is settled (`settlement.ReleaseShare`) and decayed
exponentially: a GPU-hour used one half-life ago counts half (`decayed`).

The ledger. A team's usage is kept as amounts each valued at a fixed moment, the start of an
epoch of `EPOCH_HALF_LIVES` half-lives (`UsageCharge`): a charge at `at` adds its GPU-hours
grown by the decay from the epoch's start to `at`. Charges therefore only ever add to a
number, with no read first, so concurrent settlements (two Lambdas, one DynamoDB item) add up
correctly with an atomic ADD; the epochs keep those numbers bounded (at most 2**32 times the
GPU-hours charged). The usage now is the sum of each epoch's amount decayed from its start to
now (`usage_at`). Each entry names its half-life: changing `fair_share_half_life_hours`
starts every team's usage afresh instead of misreading the old amounts.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass

# How many half-lives one epoch of the ledger spans: its amounts grow at most 2**32-fold.
EPOCH_HALF_LIVES = 32


def decayed(gpu_hours: float, since: float, now: float, half_life_seconds: float) -> float:
    """`gpu_hours` used at `since`, as they count at `now`: halved every half-life. One
    exponential both ways: seen from a moment before `since` (clocks a few seconds apart)
    they count a little more, which keeps the ledger's epochs exact at their edges."""
    return gpu_hours * math.pow(0.5, (now - since) / half_life_seconds)


@dataclass(frozen=True, slots=True)
class UsageCharge:
    """What one settled run adds to its team's ledger: `amount` to the entry `key`."""

    key: str
    amount: float


def _epoch_key(half_life_seconds: float, epoch_start: float) -> str:
    return f"{half_life_seconds:g}@{epoch_start:.0f}"


def charge(gpu_hours: float, at: float, half_life_seconds: float) -> UsageCharge:
    """The ledger entry of `gpu_hours` a run used, settled at `at`."""
    span = EPOCH_HALF_LIVES * half_life_seconds
    epoch_start = math.floor(at / span) * span
    grown = gpu_hours * math.pow(2.0, (at - epoch_start) / half_life_seconds)
    return UsageCharge(_epoch_key(half_life_seconds, epoch_start), grown)


def usage_at(ledger: Mapping[str, float], now: float, half_life_seconds: float) -> float:
    """A team's usage at `now` from its ledger (entry key -> amount): the entries of this
    half-life, each decayed from its epoch's start (entries of another half-life are ignored)."""
    total = 0.0
    prefix = f"{half_life_seconds:g}@"  # once: every pass reads every team's ledger
    for key, amount in ledger.items():
        if key.startswith(prefix):
            total += decayed(amount, float(key[len(prefix) :]), now, half_life_seconds)
    return total


def standing(usage: float, share: float) -> float:
    """Where a team stands for its turn within a class: usage per share, the lowest first."""
    return usage / share


def add_charge(ledgers: dict[str, dict[str, float]], team: str, charge: UsageCharge) -> None:
    """Add a charge of `team` to the ledgers (team -> entry -> amount) kept in memory, as the
    DynamoDB queue's ADD adds it to the team's item."""
    ledger = ledgers.setdefault(team, {})
    ledger[charge.key] = ledger.get(charge.key, 0.0) + charge.amount


def usage_by_team(
    ledgers: Mapping[str, Mapping[str, float]], now: float, half_life_seconds: float
) -> dict[str, float]:
    """Each team's usage at `now` (`usage_at`), what an admission pass orders teams by."""
    return {team: usage_at(ledger, now, half_life_seconds) for team, ledger in ledgers.items()}
