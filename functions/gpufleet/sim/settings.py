"""The settings a simulation runs with, and the market and engine they make.

`gpufleet simulate` and `scripts/bench_simulator.py` build their runs from here, so that "the
default market" means one thing: measured interruptions, finite spot capacity, durations from
history (`SimSettings()`). `advisor`, `unlimited` and `oracle` are there for comparison: the
Spot Advisor hazard, capacity that never runs out, and plans that know each job's duration.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from gpufleet.domain.catalog import Catalog
from gpufleet.sim.engine import DurationModel, EngineConfig
from gpufleet.sim.market import CapacityModel, InterruptionModel, MarketConfig, MarketModel
from gpufleet.sim.measured import MeasuredSpot, load_measured


class SimSettings(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    interruptions: InterruptionModel = "measured"
    spot_capacity: CapacityModel = "finite"
    durations: DurationModel = "history"
    spot_pool_instances: int = Field(default=16, ge=1)
    hazard_scale: float = Field(default=1.0, ge=0)

    @property
    def needs_data(self) -> bool:
        return self.interruptions == "measured" or self.spot_capacity == "finite"

    def market_config(self) -> MarketConfig:
        return MarketConfig(
            interruptions=self.interruptions,
            spot_capacity=self.spot_capacity,
            spot_pool_instances=self.spot_pool_instances,
            hazard_scale=self.hazard_scale,
        )

    def engine_config(self) -> EngineConfig:
        return EngineConfig(durations=self.durations)

    def load(self, data_dir: str | Path) -> MeasuredSpot | None:
        """The measured traces these settings replay (None when they need none); raises
        `MeasuredDataMissing` saying what is needed and where."""
        if not self.needs_data:
            return None
        return load_measured(
            data_dir,
            preemption=self.interruptions == "measured",
            availability=self.spot_capacity == "finite",
        )

    def market(
        self, catalog: Catalog, region: str, seed: int, measured: MeasuredSpot | None
    ) -> MarketModel:
        """A fresh market (pools start empty) for one policy's run."""
        return MarketModel(catalog, region, self.market_config(), seed=seed, measured=measured)

    def describe(self) -> dict[str, Any]:
        """What the JSON's `settings` holds (the parameters that apply)."""
        out: dict[str, Any] = {
            "interruptions": self.interruptions,
            "spot_capacity": self.spot_capacity,
            "durations": self.durations,
        }
        if self.spot_capacity == "finite":
            out["spot_pool_instances"] = self.spot_pool_instances
        if self.interruptions == "advisor":
            out["hazard_scale"] = self.hazard_scale
        return out
