"""Next week's GPU-hours per team, from the history's daily and weekly profile; and its error,
by backtesting.

The profile is the mean GPU-hours of each hour of the week (168 slots: the hour of the day
within the day of the week) over the last `PROFILE_WEEKS` weeks of the history; the forecast of
each of the next 7 days adds up its 24 slots. A backtest cuts the history at whole weeks, trains
on what came before and compares each forecast day with what came: its error is the weighted
absolute percentage error (WAPE: sum of |forecast - actual| over sum of actual, team-days
together). Pure: the caller gives the usage as (team, start, end, gpus) intervals.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

HOUR = 3600.0
DAY_HOURS = 24
WEEK_HOURS = 7 * DAY_HOURS
PROFILE_WEEKS = 4

Interval = tuple[str, float, float, int]  # team, start, end (epoch seconds), GPUs


def hourly_gpu_hours(
    intervals: Iterable[Interval], start: float, end: float
) -> dict[str, list[float]]:
    """Each team's GPU-hours in each hour of [start, end), `start` on an hour."""
    hours = max(0, int((end - start) // HOUR))
    series: dict[str, list[float]] = defaultdict(lambda: [0.0] * hours)
    for team, begin, finish, gpus in intervals:
        bins = series[team]
        t = max(begin, start)
        stop = min(finish, end)
        while t < stop:
            index = int((t - start) // HOUR)
            if index >= hours:
                break
            upto = min(stop, start + (index + 1) * HOUR)
            bins[index] += gpus * (upto - t) / HOUR
            t = upto
    return dict(series)


def forecast_days(history: Sequence[float], days: int = 7) -> list[float]:
    """The GPU-hours of each of the `days` days after `history` (hourly, its first hour the
    first of a week slot 0 counts from), from the mean of each hour-of-week slot over the last
    PROFILE_WEEKS weeks it covers (all of it when shorter; nothing known: 0)."""
    span = min(len(history), PROFILE_WEEKS * WEEK_HOURS)
    recent_start = len(history) - span
    sums = [0.0] * WEEK_HOURS
    counts = [0] * WEEK_HOURS
    for index in range(recent_start, len(history)):
        slot = index % WEEK_HOURS
        sums[slot] += history[index]
        counts[slot] += 1
    profile = [s / c if c else 0.0 for s, c in zip(sums, counts, strict=True)]
    first = len(history)
    return [
        sum(profile[(first + day * DAY_HOURS + h) % WEEK_HOURS] for h in range(DAY_HOURS))
        for day in range(days)
    ]


def forecast(series: Mapping[str, Sequence[float]], days: int = 7) -> dict[str, list[float]]:
    return {team: [round(v, 2) for v in forecast_days(h, days)] for team, h in series.items()}


@dataclass(frozen=True)
class Backtest:
    cuts: int  # forecasts made (weeks)
    team_days: int
    actual_gpu_hours: float
    wape: float | None  # None: nothing to compare


def backtest(series: Mapping[str, Sequence[float]], min_weeks: int = 1) -> Backtest:
    """Forecast each week after the first `min_weeks` from the weeks before it, and compare."""
    length = min((len(h) for h in series.values()), default=0)
    error = actual = 0.0
    cuts = team_days = 0
    cut = min_weeks * WEEK_HOURS
    while cut + WEEK_HOURS <= length:
        cuts += 1
        for history in series.values():
            predicted = forecast_days(history[:cut])
            for day in range(7):
                start = cut + day * DAY_HOURS
                came = sum(history[start : start + DAY_HOURS])
                error += abs(predicted[day] - came)
                actual += came
                team_days += 1
        cut += WEEK_HOURS
    return Backtest(cuts, team_days, round(actual, 1), round(error / actual, 4) if actual else None)
