"""EC2's launch rules that moto 5.2.5 does not enforce, for the embedded account.

moto launches what EC2 refuses. Hooks at the SDK's edge (the seam `faults` and
`placement_groups` use) hold CreateFleet, RunInstances and CreateLaunchTemplate to what EC2
documents, so the code under test meets the answers a real account gives:

1. **Tags for what a launch does not create.** A launch template may tag only `instance`,
   `volume`, `network-interface` and `spot-instances-request`, and "if the instance does not
   include the resource type that you specify, the instance launch fails"
   (LaunchTemplateTagSpecificationRequest): a template that tags spot requests fails every
   launch that creates none ("You cannot specify tags for Spot instances requests if there are
   no Spot instances requests being created by the request", karpenter-provider-aws#5850,
   terraform-aws-github-runner#4561). An instant fleet reports it per override in `Errors[]`
   (HTTP 200, no instances); RunInstances refuses the call. CreateFleet's own
   `TagSpecifications` take `fleet` and `instance` only (for an instant fleet).
2. **ClientToken.** The same token with the same parameters answers the first call's response:
   the same fleet id and instances, even if they were terminated since; with other parameters,
   `IdempotentParameterMismatch` ("Ensuring idempotency in Amazon EC2 API requests").
3. **What a launch names must exist.** A placement group that does not exist is
   `InvalidPlacementGroup.Unknown`; a targeted capacity reservation that does not exist is
   `InvalidCapacityReservationId.NotFound`, and one without room of the launch's type in the
   launch's zone `ReservationCapacityExceeded` ("does not have sufficient compatible and
   available capacity"). moto has no capacity reservations: they live here
   (CreateCapacityReservation, DescribeCapacityReservations, and `hold` for the ones a config
   names). A Capacity Block is `scheduled` before its start ("Before a Capacity Block
   reservation begins, the available capacity appears as zero"), `active` until its end,
   then `expired` ("the reserved capacity is no longer available for your use"): outside its
   window it has no room, so a launch into it is `ReservationCapacityExceeded` (EC2 User
   Guide, "View Capacity Blocks"). EC2 ends its instances before its end as EC2 does
   (`capacity_blocks.CapacityBlockEnds`); the control plane drains them before
   (`domain/reserved.py`).

4. **The image and the network interfaces must fit the instance type.** An AMI of another
   architecture than the type's is `InvalidParameterValue` ("The architecture 'arm64' of the
   specified instance type does not match the architecture 'x86_64' of the specified AMI");
   an EFA interface (`efa`, `efa-only`) on a type without EFA, more EFA interfaces than the
   type takes, or a `NetworkCardIndex` past its network cards are refused
   (`InvalidParameterCombination`, `InvalidParameterValue`; EC2 User Guide, "Elastic Fabric
   Adapter" and "Network cards"). What a type has is EC2's DescribeInstanceTypes as moto
   bundles it, not gpufleet's catalog.

5. **TerminateInstances takes up to 1,000 ids** ("Constraints: Up to 1000 instance IDs"); moto
   takes any number. More is refused, and nothing is terminated.

CreateFleet reports what fails for an override in `Errors[]`, as an instant fleet reports a
launch it could not make; the request's own faults (its tags, its token) are HTTP 400.
"""

from __future__ import annotations

import copy
import json
import threading
import uuid
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

import botocore.handlers
from botocore.awsrequest import AWSResponse

if TYPE_CHECKING:
    from gpufleet.domain.config import Reservation
    from gpufleet.emulator.placement_groups import PlacementGroups

HookSpec = tuple[Any, ...]
Answer = tuple[AWSResponse, dict[str, Any]]

SPOT_REQUEST = "spot-instances-request"
# What a launch template may tag (LaunchTemplateTagSpecificationRequest), and what every launch
# from our templates creates: an instance with an EBS root volume and a network interface.
TEMPLATE_TAGGABLE = frozenset({"instance", "volume", "network-interface", SPOT_REQUEST})
ALWAYS_CREATED = frozenset({"instance", "volume", "network-interface"})
INSTANT_FLEET_TAGGABLE = frozenset({"fleet", "instance"})
NO_SPOT_REQUEST_MESSAGE = (
    "You cannot specify tags for Spot instances requests if there are no Spot instances "
    "requests being created by the request."
)
_LIVE_STATES = frozenset({"pending", "running", "stopping", "stopped"})
# TerminateInstances' InstanceIds: "Constraints: Up to 1000 instance IDs".
MAX_TERMINATE_IDS = 1000
_REQUEST = "gpufleet_ec2_request"  # the call's parameters, kept in botocore's request context
_FIRST_CALL = "gpufleet_ec2_first_call"  # the token this call is the first to use
_URL = "https://ec2.us-east-1.amazonaws.com/"


def _answer(status: int, parsed: dict[str, Any]) -> Answer:
    parsed.setdefault("ResponseMetadata", {"HTTPStatusCode": status})
    return AWSResponse(_URL, status, {}, None), parsed


def _refusal(code: str, message: str) -> Answer:
    return _answer(400, {"Error": {"Code": code, "Message": message}})


@dataclass
class _TokenUse:
    """What a client token was first used with, and (once the call ended) what it answered."""

    operation: str
    parameters: str
    answered: threading.Event = field(default_factory=threading.Event)
    parsed: dict[str, Any] | None = None


@dataclass
class _CapacityReservation:
    reservation_id: str
    instance_type: str
    zone: str
    count: int
    reservation_type: str  # "default" (an ODCR) or "capacity-block"
    match: str  # "open" or "targeted"
    instance_ids: set[str] = field(default_factory=set)
    start: datetime | None = None  # a Capacity Block's window
    end: datetime | None = None

    def state(self, now: datetime) -> str:
        if self.start is not None and now < self.start:
            return "scheduled"
        if self.end is not None and now >= self.end:
            return "expired"
        return "active"

    def described(self, available: int, now: datetime) -> dict[str, Any]:
        window = {"StartDate": self.start, "EndDate": self.end} if self.end else {}
        return {
            "CapacityReservationId": self.reservation_id,
            "InstanceType": self.instance_type,
            "InstancePlatform": "Linux/UNIX",
            "AvailabilityZone": self.zone,
            "Tenancy": "default",
            "TotalInstanceCount": self.count,
            "AvailableInstanceCount": available,
            "State": self.state(now),
            "EndDateType": "limited" if self.end else "unlimited",
            "InstanceMatchCriteria": self.match,
            "ReservationType": self.reservation_type,
            **window,
        }


class Ec2Rules:
    def __init__(self, placement_groups: PlacementGroups) -> None:
        self._groups = placement_groups
        self._lock = threading.Lock()
        self._tokens: dict[str, _TokenUse] = {}
        self._reservations: dict[str, _CapacityReservation] = {}

    def hooks(self) -> list[HookSpec]:
        launches = ("CreateFleet", "RunInstances")
        read = (
            *launches,
            "CreateLaunchTemplate",
            "CreateLaunchTemplateVersion",
            "CreateCapacityReservation",
            "DescribeCapacityReservations",
            "TerminateInstances",
        )
        return [
            *((f"before-parameter-build.ec2.{op}", _keep_request) for op in read),
            ("before-call.ec2.CreateFleet", self._launch("CreateFleet", self._create_fleet)),
            ("before-call.ec2.RunInstances", self._launch("RunInstances", self._run_instances)),
            ("before-call.ec2.TerminateInstances", _check_terminate_size),
            ("before-call.ec2.CreateLaunchTemplate", _check_template_tags),
            ("before-call.ec2.CreateLaunchTemplateVersion", _check_template_tags),
            ("before-call.ec2.CreateCapacityReservation", self._create_reservation),
            ("before-call.ec2.DescribeCapacityReservations", self._describe_reservations),
            # First: the token's answer is kept before any other hook can raise after the call
            # (an injected crash), as EC2 keeps it whatever happens to the caller.
            *(
                (f"after-call.ec2.{op}", self._keep_answer, botocore.handlers.REGISTER_FIRST)
                for op in launches
            ),
            *((f"after-call-error.ec2.{op}", self._forget_first_call) for op in launches),
        ]

    def hold(self, reservations: Iterable[Reservation]) -> None:
        """Capacity reservations the account holds already, by the ids a config names."""
        with self._lock:
            for r in reservations:
                block = r.kind.value == "capacity-block"
                self._reservations[r.id] = _CapacityReservation(
                    r.id,
                    r.instance_type,
                    r.zone,
                    r.count,
                    "capacity-block" if block else "default",
                    "targeted" if block else "open",
                    start=r.start,
                    end=r.end,
                )

    def capacity_blocks(self) -> list[tuple[str, datetime, frozenset[str]]]:
        """Each Capacity Block with an end: its id, its end, and the instances launched into
        it."""
        with self._lock:
            return [
                (r.reservation_id, r.end, frozenset(r.instance_ids))
                for r in self._reservations.values()
                if r.reservation_type == "capacity-block" and r.end is not None
            ]

    # -- CreateFleet and RunInstances ------------------------------------------------------------

    def _launch(
        self, operation: str, refusal: Callable[[dict[str, Any], Any], Answer | None]
    ) -> Callable[..., Answer | None]:
        """The `before-call` hook of a launch: its token's first answer if it has one, else
        `refusal(request, backend)`: what EC2 answers instead of launching (None: launch)."""

        def hook(params: dict[str, Any], context: dict[str, Any], **kwargs: Any) -> Answer | None:
            replayed = self._replay_or_claim(operation, params, context)
            if replayed is not None:
                return replayed
            return refusal(context.get(_REQUEST, {}), _backend(kwargs))

        return hook

    def _create_fleet(self, request: dict[str, Any], backend: Any) -> Answer | None:
        if request.get("Type") == "instant":
            refused = _tags_only(request, INSTANT_FLEET_TAGGABLE, "An instant fleet")
            if refused is not None:
                return refused
        target = request.get("TargetCapacitySpecification", {})
        spot = target.get("DefaultTargetCapacityType") == "spot" or bool(
            target.get("SpotTargetCapacity")
        )
        errors = []
        for config in request.get("LaunchTemplateConfigs", []):
            specification = config.get("LaunchTemplateSpecification", {})
            data = _template_data(backend, specification)
            for override in config.get("Overrides") or [{}]:
                fault = self._launch_fault(
                    data,
                    spot=spot,
                    group=override.get("Placement", {}).get("GroupName"),
                ) or _instance_fault(backend, {**data, **override}, override.get("InstanceType"))
                if fault is not None:
                    code, message = fault
                    errors.append(
                        {
                            "LaunchTemplateAndOverrides": {
                                "LaunchTemplateSpecification": specification,
                                "Overrides": override,
                            },
                            "Lifecycle": "spot" if spot else "on-demand",
                            "ErrorCode": code,
                            "ErrorMessage": message,
                        }
                    )
        if not errors:
            return None
        return _answer(200, {"FleetId": f"fleet-{uuid.uuid4()}", "Instances": [], "Errors": errors})

    def _run_instances(self, request: dict[str, Any], backend: Any) -> Answer | None:
        data = _template_data(backend, request.get("LaunchTemplate") or {})
        merged = {**data, **request}
        market = merged.get("InstanceMarketOptions", {}).get("MarketType")
        requested = [s.get("ResourceType") for s in request.get("TagSpecifications", [])]
        if SPOT_REQUEST in requested and market != "spot":
            return _refusal("InvalidParameterValue", NO_SPOT_REQUEST_MESSAGE)
        fault = self._launch_fault(
            data, spot=market == "spot", group=merged.get("Placement", {}).get("GroupName")
        ) or _instance_fault(backend, merged, merged.get("InstanceType"))
        if fault is not None:
            return _refusal(*fault)
        target = (
            merged.get("CapacityReservationSpecification", {})
            .get("CapacityReservationTarget", {})
            .get("CapacityReservationId")
        )
        if target is None:
            return None
        subnet = merged.get("SubnetId")
        zone = (
            backend.get_subnet(subnet).availability_zone
            if subnet
            else merged.get("Placement", {}).get("AvailabilityZone")
        )
        return self._reservation_fault(
            backend, target, merged.get("InstanceType"), zone, int(merged.get("MinCount", 1))
        )

    def _launch_fault(
        self, template: Mapping[str, Any], *, spot: bool, group: str | None
    ) -> tuple[str, str] | None:
        """Why EC2 would not launch from `template` (None: it would)."""
        tagged = {s.get("ResourceType") for s in template.get("TagSpecifications", [])}
        if SPOT_REQUEST in tagged and not spot:
            return "InvalidParameterValue", NO_SPOT_REQUEST_MESSAGE
        group = group or template.get("Placement", {}).get("GroupName")
        if group and not self._groups.exists(group):
            return "InvalidPlacementGroup.Unknown", f"The Placement Group '{group}' is unknown."
        return None

    def _replay_or_claim(
        self, operation: str, params: dict[str, Any], context: dict[str, Any]
    ) -> Answer | None:
        """The first call's answer to a token used before with the same parameters (waiting for
        it if that call is still under way); None for a token's first call, which then owns it."""
        body = dict(params.get("body") or {})
        token = str(body.pop("ClientToken", ""))
        if not token:
            return None
        parameters = json.dumps(body, sort_keys=True, default=str)
        while True:
            with self._lock:
                use = self._tokens.get(token)
                if use is None:
                    self._tokens[token] = _TokenUse(operation, parameters)
                    context[_FIRST_CALL] = token
                    return None
            if use.operation != operation or use.parameters != parameters:
                return _refusal(
                    "IdempotentParameterMismatch",
                    "Arguments on this idempotent request are inconsistent with arguments used "
                    "in previous request(s).",
                )
            use.answered.wait(timeout=30)
            if use.parsed is not None:
                return _answer(200, copy.deepcopy(use.parsed))
            # The first call failed (EC2 keeps no answer for it): this one is the first now.

    def _keep_answer(
        self, http_response: Any, parsed: dict[str, Any], context: dict[str, Any], **_: Any
    ) -> None:
        token = context.pop(_FIRST_CALL, None)
        if token is None:
            return
        with self._lock:
            use = self._tokens[token]
            if http_response.status_code < 300:
                use.parsed = copy.deepcopy(parsed)
                self._note_reserved(context.get(_REQUEST, {}), parsed)
            else:
                del self._tokens[token]
        use.answered.set()

    def _forget_first_call(self, context: dict[str, Any], **_: Any) -> None:
        token = context.pop(_FIRST_CALL, None)
        if token is None:
            return
        with self._lock:
            use = self._tokens.pop(token)
        use.answered.set()

    # -- capacity reservations -------------------------------------------------------------------

    def _note_reserved(self, request: Mapping[str, Any], parsed: Mapping[str, Any]) -> None:
        target = (
            request.get("CapacityReservationSpecification", {})
            .get("CapacityReservationTarget", {})
            .get("CapacityReservationId")
        )
        if target in self._reservations:
            self._reservations[target].instance_ids.update(
                i["InstanceId"] for i in parsed.get("Instances", [])
            )

    def _available(self, backend: Any, reservation: _CapacityReservation) -> int:
        """Its instances not in use; none outside its window (a Capacity Block's)."""
        if reservation.state(ec2_now()) != "active":
            return 0
        live = sum(
            1
            for instance in backend.all_instances()
            if instance.id in reservation.instance_ids and instance.state in _LIVE_STATES
        )
        return reservation.count - live

    def _reservation_fault(
        self, backend: Any, reservation_id: str, instance_type: Any, zone: Any, count: int
    ) -> Answer | None:
        with self._lock:
            reservation = self._reservations.get(reservation_id)
            if reservation is None:
                return _refusal(
                    "InvalidCapacityReservationId.NotFound",
                    f"The capacity reservation ID '{reservation_id}' does not exist",
                )
            fits = (
                reservation.instance_type == instance_type
                and reservation.zone == zone
                and self._available(backend, reservation) >= count
            )
        if fits:
            return None
        return _refusal(
            "ReservationCapacityExceeded",
            "The requested reservation does not have sufficient compatible and available "
            "capacity for this request.",
        )

    def _create_reservation(self, context: dict[str, Any], **_: Any) -> Answer:
        request = context.get(_REQUEST) or {}
        reservation = _CapacityReservation(
            f"cr-{uuid.uuid4().hex[:17]}",
            str(request.get("InstanceType", "")),
            str(request.get("AvailabilityZone", "")),
            int(request.get("InstanceCount", 1)),
            "default",
            str(request.get("InstanceMatchCriteria", "open")),
        )
        with self._lock:
            self._reservations[reservation.reservation_id] = reservation
        described = reservation.described(reservation.count, ec2_now())
        return _answer(200, {"CapacityReservation": described})

    def _describe_reservations(self, context: dict[str, Any], **kwargs: Any) -> Answer:
        wanted = (context.get(_REQUEST) or {}).get("CapacityReservationIds") or []
        backend = _backend(kwargs)
        with self._lock:
            unknown = [i for i in wanted if i not in self._reservations]
            if unknown:
                return _refusal(
                    "InvalidCapacityReservationId.NotFound",
                    f"The capacity reservation ID '{unknown[0]}' does not exist",
                )
            described = [
                r.described(self._available(backend, r), ec2_now())
                for r in self._reservations.values()
                if not wanted or r.reservation_id in wanted
            ]
        return _answer(200, {"CapacityReservations": described})


def ec2_now() -> datetime:
    """EC2's own clock: the embedded account's timestamps are the wall clock's."""
    return datetime.now(UTC)


def put_ec2_event(
    events: Any, detail_type: str, detail: Mapping[str, str], resource_arn: str
) -> None:
    """An event of EC2's own (`aws.ec2`), on the default bus, as EC2 sends it."""
    events.put_events(
        Entries=[
            {
                "Source": "aws.ec2",
                "DetailType": detail_type,
                "Detail": json.dumps(dict(detail)),
                "Resources": [resource_arn],
            }
        ]
    )


def _keep_request(params: dict[str, Any], context: dict[str, Any], **_: Any) -> None:
    # The same dict botocore goes on to fill (the ClientToken it generates included).
    context[_REQUEST] = params


def _check_template_tags(context: dict[str, Any], **_: Any) -> Answer | None:
    data = (context.get(_REQUEST) or {}).get("LaunchTemplateData", {})
    return _tags_only(data, TEMPLATE_TAGGABLE, "A launch template")


def _check_terminate_size(context: dict[str, Any], **_: Any) -> Answer | None:
    ids = (context.get(_REQUEST) or {}).get("InstanceIds", [])
    if len(ids) <= MAX_TERMINATE_IDS:
        return None
    # The limit is documented; the error code for passing it is not (the request is invalid).
    return _refusal(
        "InvalidParameterValue",
        f"TerminateInstances takes up to {MAX_TERMINATE_IDS} instance IDs, not {len(ids)}.",
    )


def _tags_only(request: Mapping[str, Any], taggable: frozenset[str], what: str) -> Answer | None:
    """The refusal of `request`'s TagSpecifications when they name a type outside `taggable`."""
    for spec in request.get("TagSpecifications", []):
        if spec.get("ResourceType") not in taggable:
            return _refusal(
                "InvalidParameterValue",
                f"{what} can tag only {sorted(taggable)} at creation, "
                f"not '{spec.get('ResourceType')}'.",
            )
    return None


_EFA_INTERFACES = frozenset({"efa", "efa-only"})


def _instance_fault(
    backend: Any, launch: Mapping[str, Any], instance_type: str | None
) -> tuple[str, str] | None:
    """Why EC2 would not start `instance_type` from `launch` (a template's data, merged with a
    RunInstances request): its image's architecture, its network interfaces (None: it would)."""
    from moto.ec2.models.instance_types import INSTANCE_TYPES

    described = INSTANCE_TYPES.get(instance_type or "")
    if described is None:
        return None  # moto refuses unknown types itself
    arches = described.get("ProcessorInfo", {}).get("SupportedArchitectures", [])
    image_id = launch.get("ImageId")
    if image_id:
        images = backend.describe_images(ami_ids=[image_id])
        image_arch = images[0].architecture if images else None
        if image_arch and image_arch not in arches:
            return (
                "InvalidParameterValue",
                f"The architecture '{arches[0] if arches else 'unknown'}' of the specified "
                f"instance type does not match the architecture '{image_arch}' of the specified "
                "AMI. Specify an instance type and an AMI that have matching architectures, and "
                "try again.",
            )
    network = described.get("NetworkInfo", {})
    interfaces = launch.get("NetworkInterfaces") or []
    efa = [i for i in interfaces if i.get("InterfaceType") in _EFA_INTERFACES]
    if efa and not network.get("EfaSupported"):
        return (
            "InvalidParameterCombination",
            f"The specified instance type {instance_type} does not support Elastic Fabric "
            "Adapter (EFA) interfaces.",
        )
    most = int(network.get("EfaInfo", {}).get("MaximumEfaInterfaces", 0))
    if len(efa) > most:
        return (
            "InvalidParameterValue",
            f"You can attach at most {most} EFA interfaces to a {instance_type} instance, "
            f"not {len(efa)}.",
        )
    cards = int(network.get("MaximumNetworkCards", 1))
    for interface in interfaces:
        card = int(interface.get("NetworkCardIndex", 0))
        if not 0 <= card < cards:
            return (
                "InvalidParameterValue",
                f"Network card index {card} is out of range for instance type {instance_type}, "
                f"which has {cards} network card{'s' if cards > 1 else ''}.",
            )
    return None


def _backend(kwargs: Mapping[str, Any]) -> Any:
    """moto's EC2 backend of the region the call went to (read directly: not an API call)."""
    from moto.ec2.models import ec2_backends

    from gpufleet.emulator.account import ACCOUNT_ID

    return ec2_backends[ACCOUNT_ID][kwargs["request_signer"].region_name]


def _template_data(backend: Any, specification: Mapping[str, Any]) -> dict[str, Any]:
    template_id = specification.get("LaunchTemplateId")
    if template_id:
        template = backend.get_launch_template(template_id)
    elif specification.get("LaunchTemplateName"):
        template = backend.get_launch_template_by_name(specification["LaunchTemplateName"])
    else:
        return {}
    data: dict[str, Any] = template.get_version(specification.get("Version", "$Default")).data
    return data
