"""What a launch asks of EC2, what comes back, and what a failure means."""

from __future__ import annotations

from enum import StrEnum

from pydantic import BaseModel, ConfigDict, Field


class CapacityType(StrEnum):
    RESERVED = "reserved"  # an ODCR or Capacity Block named in the config
    SPOT = "spot"
    ON_DEMAND = "on-demand"


class ErrorCategory(StrEnum):
    CAPACITY = "capacity"  # try other offerings, another capacity type, or later
    QUOTA = "quota"  # an account limit: waiting or another type may help, retrying now will not
    CONFIGURATION = "configuration"  # our setup is wrong: fail loudly, do not retry


# CreateFleet `Errors[].ErrorCode` values, by what they mean for the next step.
_CAPACITY_CODES = frozenset(
    {
        "InsufficientInstanceCapacity",
        "InsufficientHostCapacity",
        "InsufficientCapacity",
        "MaxSpotInstanceCountExceeded",
        "SpotMaxPriceTooLow",
        "UnfulfillableCapacity",
        "Unsupported",
        "InsufficientCapacityOnHost",
        "ReservationCapacityExceeded",
    }
)
_QUOTA_CODES = frozenset(
    {
        "VcpuLimitExceeded",
        "MaxFleetCountExceeded",
        "InsufficientFreeAddressesInSubnet",
        "InstanceLimitExceeded",
        "RequestLimitExceeded",
    }
)


def classify_launch_error(code: str) -> ErrorCategory:
    """The category of a CreateFleet error code; unknown codes are configuration errors, which
    stop the launch rather than retry something we do not understand."""
    if code in _CAPACITY_CODES:
        return ErrorCategory.CAPACITY
    if code in _QUOTA_CODES:
        return ErrorCategory.QUOTA
    return ErrorCategory.CONFIGURATION


def worst_category(codes: list[str]) -> ErrorCategory:
    """One category for a failed launch: configuration beats quota beats capacity, because the
    more fundamental problem decides what to do next."""
    categories = {classify_launch_error(code) for code in codes}
    for category in (ErrorCategory.CONFIGURATION, ErrorCategory.QUOTA):
        if category in categories:
            return category
    return ErrorCategory.CAPACITY


class LaunchOverride(BaseModel):
    """One (instance type, zone) a fleet may use, with its price per node-hour."""

    model_config = ConfigDict(frozen=True)

    instance_type: str
    zone: str | None = None
    hourly_usd: float = Field(ge=0)
    # Reserved capacity only: which reservation, and whether it is a Capacity Block.
    reservation_id: str | None = None
    capacity_block: bool = False


class LaunchRequest(BaseModel):
    model_config = ConfigDict(frozen=True)

    job_id: str
    attempt: int = Field(ge=0)
    capacity_type: CapacityType
    nodes: int = Field(ge=1)
    overrides: list[LaunchOverride] = Field(min_length=1)


class LaunchError(BaseModel):
    model_config = ConfigDict(frozen=True)

    code: str
    message: str = ""
    instance_type: str | None = None
    zone: str | None = None


class LaunchResult(BaseModel):
    """All-or-nothing: either every node is up (`instance_ids` has `nodes` entries) or none is."""

    model_config = ConfigDict(frozen=True)

    instance_ids: list[str] = Field(default_factory=list)
    instance_type: str | None = None
    zone: str | None = None
    capacity_type: CapacityType
    errors: list[LaunchError] = Field(default_factory=list)

    @property
    def launched(self) -> bool:
        return bool(self.instance_ids)

    @property
    def error_category(self) -> ErrorCategory | None:
        if self.launched:
            return None
        return worst_category([error.code for error in self.errors] or ["UnfulfillableCapacity"])


def shortage_keys(result: LaunchResult, region: str) -> list[str]:
    """Capacity-memory keys (`capacity-type:instance-type:zone`, the region when the offering
    has no zone) of the offerings a failed launch found without capacity."""
    return sorted(
        {
            f"{result.capacity_type.value}:{error.instance_type}:{error.zone or region}"
            for error in result.errors
            if error.instance_type and classify_launch_error(error.code) is ErrorCategory.CAPACITY
        }
    )
