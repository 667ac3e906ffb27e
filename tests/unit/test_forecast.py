"""Next week's GPU-hours per team from the daily and weekly profile, and its backtest."""

from __future__ import annotations

import pytest

from gpufleet.domain.forecast import (
    DAY_HOURS,
    WEEK_HOURS,
    backtest,
    forecast,
    forecast_days,
    hourly_gpu_hours,
)

T0 = 1_764_633_600.0  # on an hour


def weekly(weeks: int) -> list[float]:
    """8 GPUs busy 9:00-17:00 on weekdays, idle at the weekend, every week the same."""
    return [
        8.0 if (i // DAY_HOURS) % 7 < 5 and 9 <= i % DAY_HOURS < 17 else 0.0
        for i in range(weeks * WEEK_HOURS)
    ]


def test_a_run_is_spread_over_the_hours_it_held_its_gpus() -> None:
    series = hourly_gpu_hours([("vision", T0 + 1800, T0 + 2 * 3600, 4)], T0, T0 + 3 * 3600)
    assert series == {"vision": [2.0, 4.0, 0.0]}


def test_a_steady_weekly_pattern_is_forecast_exactly_and_backtests_without_error() -> None:
    history = weekly(3)
    assert forecast_days(history) == [64.0] * 5 + [0.0, 0.0]  # 8 GPUs x 8 h on weekdays
    checked = backtest({"vision": weekly(5)})
    assert checked.cuts == 4 and checked.team_days == 28 and checked.wape == 0.0


def test_a_change_of_level_shows_in_the_backtest_error() -> None:
    doubled = weekly(2) + [2 * v for v in weekly(1)]
    checked = backtest({"vision": doubled}, min_weeks=2)
    assert checked.wape == pytest.approx(0.5)  # forecast half of what came


def test_no_history_forecasts_nothing_and_cannot_be_backtested() -> None:
    assert forecast({"vision": []}) == {"vision": [0.0] * 7}
    assert backtest({"vision": weekly(1)}).wape is None
