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
    TRANSIENT = "transient"  # EC2 itself (a server error, throttling): the same launch, later
    CONFIGURATION = "configuration"  # our setup is wrong: fail loudly, do not retry


# Codes of our own, for launches that fail before or beside EC2.
NO_SUBNET_IN_ZONE = "NoSubnetInZone"  # no configured subnet lies in a zone the offerings name
TOKENS_SPENT = "ClientTokensSpent"  # an attempt's client tokens are all spent: the next attempt
NO_LAUNCH_TEMPLATE = "NoLaunchTemplate"  # no launch template of the deployment boots the type


# EC2's error codes (CreateFleet `Errors[].ErrorCode`, RunInstances and CreateFleet errors), by
# what they mean for the next step. Sources: the EC2 API's error code list (client errors,
# server errors) and the codes instant fleets are seen to return.
_CAPACITY_CODES = frozenset(
    {
        "InsufficientInstanceCapacity",
        "InsufficientHostCapacity",
        "InsufficientCapacity",
        "InsufficientReservedInstanceCapacity",
        "InsufficientVolumeCapacity",  # EBS in that zone: another zone may have it
        "MaxSpotInstanceCountExceeded",
        "SpotMaxPriceTooLow",
        "UnfulfillableCapacity",
        "Unsupported",  # "an Availability Zone that currently has constraints on that type"
        "InsufficientCapacityOnHost",
        "ReservationCapacityExceeded",  # the targeted reservation has no compatible room
    }
)
_QUOTA_CODES = frozenset(
    {
        "VcpuLimitExceeded",
        "MaxFleetCountExceeded",
        "MaxSpotFleetRequestCountExceeded",
        "InsufficientFreeAddressesInSubnet",
        "InstanceLimitExceeded",
        "VolumeLimitExceeded",
        "MaxIOPSLimitExceeded",
        "NetworkInterfaceLimitExceeded",
    }
)
# EC2 says to retry these: its server errors and throttling, a tag write racing another, a
# client token spent by an earlier call (a new attempt has a new one), and a placement group
# created a moment ago that the launch does not see yet (EC2 is eventually consistent).
_TRANSIENT_CODES = frozenset(
    {
        "InternalError",
        "InternalFailure",
        "ServiceUnavailable",
        "Unavailable",
        "RequestLimitExceeded",
        "InsufficientAddressCapacity",
        "ConcurrentTagAccess",
        "IdempotentParameterMismatch",
        "IdempotentInstanceTerminated",
        "InvalidPlacementGroup.Unknown",
        TOKENS_SPENT,
    }
)
# Client errors that say the request itself is wrong: retrying the same request cannot help.
_CONFIGURATION_CODES = frozenset(
    {
        "AuthFailure",
        "Blocked",
        "OptInRequired",
        "PendingVerification",
        "UnauthorizedOperation",
        "UnsupportedOperation",
        "UnknownParameter",
        "ValidationError",
        NO_SUBNET_IN_ZONE,
        NO_LAUNCH_TEMPLATE,
    }
)
_CONFIGURATION_PREFIXES = ("Invalid", "Missing", "Malformed")


def classify_launch_error(code: str) -> ErrorCategory:
    """The category of an EC2 launch error code. Codes EC2 documents as the request's fault
    (`Invalid...`, `Missing...`, an unauthorized call) stop the launch; codes this table does
    not know are retried later like a server error (bounded by the plan's attempts), since EC2
    adds codes and a new capacity or server code must not fail a job at once."""
    for codes, category in (
        (_CAPACITY_CODES, ErrorCategory.CAPACITY),
        (_QUOTA_CODES, ErrorCategory.QUOTA),
        (_TRANSIENT_CODES, ErrorCategory.TRANSIENT),
        (_CONFIGURATION_CODES, ErrorCategory.CONFIGURATION),
    ):
        if code in codes:
            return category
    if code.startswith(_CONFIGURATION_PREFIXES):
        return ErrorCategory.CONFIGURATION
    return ErrorCategory.TRANSIENT


def worst_category(codes: list[str]) -> ErrorCategory:
    """One category for a failed launch: configuration beats quota beats capacity beats a
    transient error, because the more fundamental problem decides what to do next."""
    categories = {classify_launch_error(code) for code in codes}
    for category in (ErrorCategory.CONFIGURATION, ErrorCategory.QUOTA, ErrorCategory.CAPACITY):
        if category in categories:
            return category
    return ErrorCategory.TRANSIENT


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
    zone: str | None = None  # the offering's, as the plan named it (None: priced per region)
    # Where EC2 put the instances (the zone of the subnet it launched into), whatever the plan
    # named: what a job's placement shows.
    availability_zone: str | None = None
    capacity_type: CapacityType
    errors: list[LaunchError] = Field(default_factory=list)
    # Instance id -> private IP of each launched instance (DescribeInstances).
    private_ips: dict[str, str] = Field(default_factory=dict)

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
