"""Launching and releasing a job's instances with EC2 CreateFleet (type `instant`).

Each instance type launches from the launch template of its boot target (architecture and
accelerator family) and, for a multi-node job on an EFA type, of its EFA width: one EFA per
network card (`domain/boot.py`). CreateFleet overrides cannot name network interfaces, so a
request has one launch template config per template, each with the overrides that launch from
it. With a warm pool, a single-node launch that may use the pool's type and capacity type
takes an idle warm instance instead of calling CreateFleet (`warm_pool.DynamoWarmPool` makes
the claim exclusive).

A launch is idempotent across retries of the same attempt: its ClientToken is the attempt's
first one, so a Launch that died after CreateFleet asks again and gets (and keeps) the
instances it launched; a token whose instances ended since, or whose parameters changed
(`IdempotentParameterMismatch`), is spent and the next one is used. Whatever else the job
holds then is a leftover of such a launch and is terminated: a job never keeps two fleets.
"""

from __future__ import annotations

import hashlib
import json
import time
from collections.abc import Callable, Iterator, Mapping
from functools import cached_property
from typing import Any

from botocore.exceptions import ClientError

from gpufleet.adapters.aws.transactions import BACKOFF
from gpufleet.adapters.aws.warm_pool import DynamoWarmPool
from gpufleet.domain.boot import template_key
from gpufleet.domain.catalog import InstanceType, load_bundled
from gpufleet.domain.launch import (
    NO_LAUNCH_TEMPLATE,
    NO_SUBNET_IN_ZONE,
    TOKENS_SPENT,
    CapacityType,
    LaunchError,
    LaunchOverride,
    LaunchRequest,
    LaunchResult,
)
from gpufleet.errors import TransientError
from gpufleet.ports import ManagedInstance, WarmPoolStatus
from gpufleet.topology import TAG_JOB_ID, TAG_MANAGED, TAG_WARM, WARM_CLAIMED, WARM_IDLE

_LIVE_STATES = ["pending", "running", "stopping", "stopped"]
_UP_STATES = ["pending", "running"]
# TerminateInstances takes at most 1,000 ids a call (more: the call fails, nothing ends).
TERMINATE_BATCH = 1000
# Instances just launched may not be known yet to the terminate (eventual consistency: its
# NotFound "does not mean that the instance was or will be terminated"): waits between tries.
_UNSEEN_INSTANCE_WAITS = (0.5, 1.0, 2.0, 4.0)
# How many client tokens one attempt may spend (each a Launch retried after its fleet ended or
# its overrides changed); past them the launch fails as transient and the next attempt starts
# over with its own tokens.
MAX_CLIENT_TOKENS = 8
# A call with a spent token: EC2 will not launch under it again.
_SPENT_TOKEN_CODES = frozenset({"IdempotentParameterMismatch", "IdempotentInstanceTerminated"})


class LaunchIpsUnknown(TransientError):
    """EC2 does not tell the private IPs of instances it launched (yet): the Launch step is
    retried, and the launch, idempotent per attempt, finds the same instances."""

    def __init__(self, instance_ids: list[str]) -> None:
        super().__init__(f"no private IP known yet for some of {', '.join(instance_ids)}")


class Ec2Fleet:
    def __init__(
        self,
        client: Any,
        launch_templates: Mapping[str, str],
        subnet_ids: list[str],
        *,
        instance_type_of: Callable[[str], InstanceType] | None = None,
        warm_pool: DynamoWarmPool | None = None,
    ) -> None:
        """`launch_templates`: template id by template key (`boot.TemplateKey.name`);
        `instance_type_of`: what a type is (the bundled catalog's, by default)."""
        self._client = client
        self._launch_templates = dict(launch_templates)
        self._subnet_ids = subnet_ids
        self._instance_type_of = instance_type_of or load_bundled().instance_type
        self._warm = warm_pool

    @cached_property
    def _subnets(self) -> list[dict[str, Any]]:
        subnets: list[dict[str, Any]] = self._client.describe_subnets(SubnetIds=self._subnet_ids)[
            "Subnets"
        ]
        return subnets

    @cached_property
    def _subnet_by_zone(self) -> dict[str, str]:
        # Offerings name a zone by name (us-east-1a) or, in per-AZ price data, by its id
        # (use1-az6), which is the same physical zone in every account: accept both.
        by_zone: dict[str, str] = {}
        for subnet in self._subnets:
            by_zone.setdefault(subnet["AvailabilityZone"], subnet["SubnetId"])
            if subnet.get("AvailabilityZoneId"):
                by_zone.setdefault(subnet["AvailabilityZoneId"], subnet["SubnetId"])
        return by_zone

    @cached_property
    def _zone_of_subnet(self) -> dict[str, str]:
        return {subnet["SubnetId"]: subnet["AvailabilityZone"] for subnet in self._subnets}

    @cached_property
    def _zone_names(self) -> list[str]:
        return sorted({subnet["AvailabilityZone"] for subnet in self._subnets})

    def _zone_aliases(self, zone_name: str) -> set[str]:
        """A zone's name and id, as offerings may name it either way."""
        return {zone_name} | {
            s["AvailabilityZoneId"]
            for s in self._subnets
            if s["AvailabilityZone"] == zone_name and s.get("AvailabilityZoneId")
        }

    def launch(self, request: LaunchRequest) -> LaunchResult:
        """The job's instances, all or none; after it the job holds no others."""
        held = self._job_instances(request.job_id)
        result = self._launch(request, held)
        # Anything else the job holds is what an earlier call launched and nobody recorded.
        self._end_held(held, keep=result.instance_ids)
        if result.launched:
            result = result.model_copy(update={"private_ips": self._private_ips(result)})
        return result

    def _private_ips(self, result: LaunchResult) -> dict[str, str]:
        """Each launched instance's private IP: how its peers reach it. EC2 assigns it at
        launch; DescribeInstances can miss an instance it just launched (eventual
        consistency), so a miss is asked again after a short backoff."""
        for retry in range(BACKOFF.tries):
            try:
                response = self._client.describe_instances(InstanceIds=result.instance_ids)
            except ClientError as exc:
                if exc.response.get("Error", {}).get("Code") != "InvalidInstanceID.NotFound":
                    raise
            else:
                ips = {
                    instance["InstanceId"]: instance["PrivateIpAddress"]
                    for reservation in response["Reservations"]
                    for instance in reservation["Instances"]
                    if instance.get("PrivateIpAddress")
                }
                if len(ips) == len(result.instance_ids):
                    return ips
            BACKOFF.wait(retry)
        raise LaunchIpsUnknown(result.instance_ids)

    def _end_held(self, held: dict[str, str], keep: list[str] | None = None) -> None:
        """Terminate the live instances of `held` but `keep`, and note them ended."""
        ending = [i for i, state in held.items() if state in _LIVE_STATES and i not in (keep or [])]
        self.terminate_instances(ending)
        held.update(dict.fromkeys(ending, "shutting-down"))

    def _launch(self, request: LaunchRequest, held: dict[str, str]) -> LaunchResult:
        if request.capacity_type is CapacityType.RESERVED and request.overrides[0].capacity_block:
            return self._launch_capacity_block(request, held)
        if self._warm is not None:
            warm = self._claim_warm(self._warm, request)
            if warm is not None:
                return warm
        # (instance type, subnet) -> the zone as the plan named it, to price what EC2 chose.
        planned_zone: dict[tuple[str, str], str | None] = {}
        overrides: list[dict[str, Any]] = []
        for override in request.overrides:
            if self._template_id(override.instance_type, request.nodes) is None:
                continue  # selection never plans such a type; a stale plan may
            zones = [override.zone] if override.zone else self._zone_names
            for zone in zones:
                subnet = self._subnet_by_zone.get(zone or "")
                if subnet is None or (override.instance_type, subnet) in planned_zone:
                    continue
                planned_zone[(override.instance_type, subnet)] = override.zone
                overrides.append({"InstanceType": override.instance_type, "SubnetId": subnet})
        if request.nodes > 1:
            # Multi-node jobs talk NCCL between their nodes: one cluster placement group each.
            group = self._placement_group(request.job_id)
            for override_entry in overrides:
                override_entry["Placement"] = {"GroupName": group}
        if not overrides:
            return LaunchResult(
                capacity_type=request.capacity_type, errors=[self._unlaunchable(request)]
            )
        parameters = self._fleet_parameters(request, overrides)
        return self._first_live_launch(
            request,
            held,
            lambda token: self._client.create_fleet(**parameters, ClientToken=token),
            lambda response: self._fleet_result(request, response, planned_zone),
        )

    def _fleet_result(
        self,
        request: LaunchRequest,
        response: dict[str, Any],
        planned_zone: dict[tuple[str, str], str | None],
    ) -> LaunchResult:
        launched = [
            (group, instance_id)
            for group in response.get("Instances", [])
            for instance_id in group.get("InstanceIds", [])
        ]
        errors = [
            LaunchError(
                code=str(error.get("ErrorCode", "Unknown")),
                message=str(error.get("ErrorMessage", "")),
                instance_type=error.get("LaunchTemplateAndOverrides", {})
                .get("Overrides", {})
                .get("InstanceType"),
                zone=_zone_of(error.get("LaunchTemplateAndOverrides", {}), planned_zone),
            )
            for error in response.get("Errors", [])
        ]
        instance_ids = [instance_id for _, instance_id in launched]
        if len(instance_ids) < request.nodes:
            # All or nothing: a partial multi-node launch is useless and costs money.
            self._terminate_just_launched(instance_ids)
            return LaunchResult(
                capacity_type=request.capacity_type,
                errors=errors
                or [LaunchError(code="UnfulfillableCapacity", message="partial launch")],
            )
        first_group = launched[0][0]
        chosen = first_group.get("LaunchTemplateAndOverrides", {})
        return LaunchResult(
            instance_ids=instance_ids,
            instance_type=first_group.get("InstanceType"),
            zone=_zone_of(chosen, planned_zone),
            availability_zone=self._zone_of_subnet.get(
                chosen.get("Overrides", {}).get("SubnetId", "")
            ),
            capacity_type=request.capacity_type,
            errors=errors,
        )

    def _fleet_parameters(
        self, request: LaunchRequest, overrides: list[dict[str, Any]]
    ) -> dict[str, Any]:
        tags = _tags(request.job_id)
        # One type in one zone for every node: a multi-node job must share a network.
        all_or_nothing = {
            "SingleInstanceType": True,
            "SingleAvailabilityZone": True,
            "MinTargetCapacity": request.nodes,
        }
        parameters: dict[str, Any] = {
            "Type": "instant",
            "LaunchTemplateConfigs": self._launch_template_configs(request.nodes, overrides),
            "TargetCapacitySpecification": {
                "TotalTargetCapacity": request.nodes,
                "DefaultTargetCapacityType": "spot"
                if request.capacity_type is CapacityType.SPOT
                else "on-demand",
            },
            "TagSpecifications": [
                {"ResourceType": "instance", "Tags": tags},
                {"ResourceType": "fleet", "Tags": tags},
            ],
        }
        if request.capacity_type is CapacityType.SPOT:
            parameters["SpotOptions"] = {
                "AllocationStrategy": "price-capacity-optimized",
                **all_or_nothing,
            }
        else:
            parameters["OnDemandOptions"] = {"AllocationStrategy": "lowest-price", **all_or_nothing}
        if request.capacity_type is CapacityType.RESERVED:
            # Open ODCRs that match the type and zone are used before plain on-demand.
            parameters["OnDemandOptions"]["CapacityReservationOptions"] = {
                "UsageStrategy": "use-capacity-reservations-first"
            }
        return parameters

    def _template_id(self, instance_type: str, nodes: int) -> str | None:
        """The template `nodes` nodes of the type launch from; None: the deployment has none."""
        key = template_key(self._instance_type_of(instance_type), nodes)
        return None if key is None else self._launch_templates.get(key.name)

    def _unlaunchable(self, request: LaunchRequest) -> LaunchError:
        """Why no override of `request` could be asked of EC2."""
        unbooted = sorted(
            {
                o.instance_type
                for o in request.overrides
                if self._template_id(o.instance_type, request.nodes) is None
            }
        )
        if len(unbooted) == len({o.instance_type for o in request.overrides}):
            return LaunchError(
                code=NO_LAUNCH_TEMPLATE,
                message=f"no launch template of this deployment boots {', '.join(unbooted)}",
            )
        return LaunchError(
            code=NO_SUBNET_IN_ZONE, message="no configured subnet lies in a zone the offerings name"
        )

    def _launch_template_configs(
        self, nodes: int, overrides: list[dict[str, Any]]
    ) -> list[dict[str, Any]]:
        """One config per launch template, each with the overrides that launch from it."""
        by_template: dict[str, list[dict[str, Any]]] = {}
        for override in overrides:
            template = self._template_id(override["InstanceType"], nodes)
            if template is None:
                raise RuntimeError(f"no launch template boots {override['InstanceType']}")
            by_template.setdefault(template, []).append(override)
        return [
            {
                "LaunchTemplateSpecification": {"LaunchTemplateId": template, "Version": "$Latest"},
                "Overrides": template_overrides,
            }
            for template, template_overrides in by_template.items()
        ]

    def _launch_capacity_block(self, request: LaunchRequest, held: dict[str, str]) -> LaunchResult:
        """Capacity Blocks are targeted by id, which CreateFleet overrides cannot do:
        RunInstances with all nodes at once (MinCount = nodes) keeps it all or nothing."""
        override = request.overrides[0]
        subnet = self._subnet_by_zone.get(override.zone or "")
        if subnet is None:
            return LaunchResult(
                capacity_type=request.capacity_type,
                errors=[
                    LaunchError(code=NO_SUBNET_IN_ZONE, message=f"no subnet in {override.zone}")
                ],
            )
        template = self._template_id(override.instance_type, request.nodes)
        if template is None:
            return LaunchResult(
                capacity_type=request.capacity_type, errors=[self._unlaunchable(request)]
            )
        return self._first_live_launch(
            request,
            held,
            lambda token: self._client.run_instances(
                LaunchTemplate={"LaunchTemplateId": template, "Version": "$Latest"},
                InstanceType=override.instance_type,
                SubnetId=subnet,
                MinCount=request.nodes,
                MaxCount=request.nodes,
                InstanceMarketOptions={"MarketType": "capacity-block"},
                CapacityReservationSpecification={
                    "CapacityReservationTarget": {"CapacityReservationId": override.reservation_id}
                },
                TagSpecifications=[{"ResourceType": "instance", "Tags": _tags(request.job_id)}],
                ClientToken=token,
            ),
            lambda response: LaunchResult(
                instance_ids=[i["InstanceId"] for i in response["Instances"]],
                instance_type=override.instance_type,
                zone=override.zone,
                capacity_type=request.capacity_type,
            ),
            failing=override,
        )

    def _first_live_launch(
        self,
        request: LaunchRequest,
        held: dict[str, str],
        call: Callable[[str], dict[str, Any]],
        result_of: Callable[[dict[str, Any]], LaunchResult],
        failing: LaunchOverride | None = None,
    ) -> LaunchResult:
        """The first of the attempt's tokens that EC2 launches under (again) with instances
        alive.

        `held` is what DescribeInstances said of the job's instances before the call: a token's
        instances that had ended by then are not recorded (EC2 answers a token with its first
        call's instances, terminated or not); instances it did not list yet are a launch so new
        that the listing does not show it (EC2 is eventually consistent), alive. Before a token
        that may launch anew, what the job still holds ends: never two fleets alive at once. An
        error EC2 answers a call with is the launch's error (at `failing`, the override it was
        for)."""
        for n, token in enumerate(_client_tokens(request)):
            if n:
                self._end_held(held)
            try:
                result = result_of(call(token))
            except ClientError as exc:
                result = LaunchResult(
                    capacity_type=request.capacity_type, errors=[_launch_error(exc, failing)]
                )
            if not result.launched and any(e.code in _SPENT_TOKEN_CODES for e in result.errors):
                continue
            if result.launched and any(
                held.get(i, "pending") not in _UP_STATES for i in result.instance_ids
            ):
                continue
            return result
        return LaunchResult(
            capacity_type=request.capacity_type,
            errors=[
                LaunchError(
                    code=TOKENS_SPENT,
                    message=f"each of the attempt's {MAX_CLIENT_TOKENS} client tokens is spent",
                )
            ],
        )

    def job_of(self, instance_id: str) -> str | None:
        try:
            response = self._client.describe_instances(InstanceIds=[instance_id])
        except ClientError as exc:
            if exc.response.get("Error", {}).get("Code") == "InvalidInstanceID.NotFound":
                return None
            raise
        for reservation in response["Reservations"]:
            for instance in reservation["Instances"]:
                if _tag_value(instance, TAG_MANAGED) == "true":
                    return _tag_value(instance, TAG_JOB_ID)
        return None

    def _placement_group(self, job_id: str) -> str:
        name = placement_group_name(job_id)
        try:
            self._client.create_placement_group(
                GroupName=name,
                Strategy="cluster",
                TagSpecifications=[{"ResourceType": "placement-group", "Tags": _tags(job_id)}],
            )
        except ClientError as exc:
            if exc.response.get("Error", {}).get("Code") != "InvalidPlacementGroup.Duplicate":
                raise
        return name

    def delete_placement_group(self, job_id: str) -> bool:
        """Best effort: a group cannot be deleted while its instances are still shutting down;
        the reconciler deletes it later. Empty groups cost nothing meanwhile."""
        try:
            self._client.delete_placement_group(GroupName=placement_group_name(job_id))
        except ClientError as exc:
            code = exc.response.get("Error", {}).get("Code", "")
            if code in ("InvalidPlacementGroup.Unknown", "InvalidPlacementGroup.InUse"):
                return False
            raise
        return True

    def placement_group_jobs(self) -> list[str]:
        response = self._client.describe_placement_groups(
            Filters=[{"Name": f"tag:{TAG_MANAGED}", "Values": ["true"]}]
        )
        return [
            job_id
            for group in response.get("PlacementGroups", [])
            if (job_id := _tag_value(group, TAG_JOB_ID))
        ]

    def managed_instances(self) -> list[ManagedInstance]:
        claims = self._warm.claims() if self._warm is not None else {}
        managed = []
        for instance in self._instances([{"Name": f"tag:{TAG_MANAGED}", "Values": ["true"]}]):
            instance_id = instance["InstanceId"]
            job_id = _tag_value(instance, TAG_JOB_ID)
            launched_at = instance["LaunchTime"].timestamp()
            claim = claims.get(instance_id)
            if claim is not None:
                # A warm instance counts from its claim; its job is the claim's even before the
                # launch that claimed it got to tag it.
                job_id, launched_at = job_id or claim.job_id, claim.claimed_at
            warm = job_id is None and _tag_value(instance, TAG_WARM) == WARM_IDLE
            managed.append(ManagedInstance(instance_id, job_id, launched_at, warm=warm))
        return managed

    def _instances(self, filters: list[dict[str, Any]]) -> list[dict[str, Any]]:
        """Pending and running instances matching the filters."""
        paginator = self._client.get_paginator("describe_instances")
        up = {"Name": "instance-state-name", "Values": _UP_STATES}
        return [
            instance
            for page in paginator.paginate(Filters=[*filters, up])
            for reservation in page["Reservations"]
            for instance in reservation["Instances"]
        ]

    # -- warm pool -----------------------------------------------------------------------------

    def _warm_instances(self, pool: DynamoWarmPool) -> list[dict[str, Any]]:
        """The pool's live instances, idle or claimed."""
        return self._instances(
            [
                {"Name": f"tag:{TAG_MANAGED}", "Values": ["true"]},
                {"Name": f"tag:{TAG_WARM}", "Values": [WARM_IDLE, WARM_CLAIMED]},
                {"Name": "instance-type", "Values": [pool.pool.instance_type]},
            ]
        )

    def _claim_warm(self, pool: DynamoWarmPool, request: LaunchRequest) -> LaunchResult | None:
        """A warm instance for a single-node launch that may use the pool's type, in a zone the
        launch allows and of the capacity type it asks for; None to launch as usual."""
        if request.nodes != 1 or request.capacity_type.value != pool.pool.capacity_type:
            return None
        wanted = [o for o in request.overrides if o.instance_type == pool.pool.instance_type]
        if not wanted:
            return None
        pool.note_demand()
        claimed_by = {instance_id: c.job_id for instance_id, c in pool.claims().items()}
        live = self._warm_instances(pool)
        # A retried launch of the same job finds the instance it claimed before.
        mine = [i for i in live if claimed_by.get(i["InstanceId"]) == request.job_id]
        idle = sorted(
            (
                i
                for i in live
                if i["InstanceId"] not in claimed_by and _tag_value(i, TAG_WARM) == WARM_IDLE
            ),
            key=lambda i: (i["LaunchTime"], i["InstanceId"]),
        )
        for instance in [*mine, *idle]:
            aliases = self._zone_aliases(instance["Placement"]["AvailabilityZone"])
            override = next((o for o in wanted if o.zone is None or o.zone in aliases), None)
            if override is None or not pool.claim(instance["InstanceId"], request.job_id):
                continue
            self._client.create_tags(
                Resources=[instance["InstanceId"]],
                Tags=[
                    {"Key": TAG_JOB_ID, "Value": request.job_id},
                    {"Key": TAG_WARM, "Value": WARM_CLAIMED},
                ],
            )
            return LaunchResult(
                instance_ids=[instance["InstanceId"]],
                instance_type=pool.pool.instance_type,
                zone=override.zone,
                capacity_type=request.capacity_type,
            )
        return None

    def warm_pool(self) -> WarmPoolStatus:
        pool = self._require_warm_pool()
        live = self._warm_instances(pool)
        claims = pool.claims()
        pool.forget(sorted(set(claims) - {i["InstanceId"] for i in live}))
        idle = [
            ManagedInstance(i["InstanceId"], None, i["LaunchTime"].timestamp(), warm=True)
            for i in live
            if i["InstanceId"] not in claims and _tag_value(i, TAG_WARM) == WARM_IDLE
        ]
        return WarmPoolStatus(idle=idle, demand_at=pool.demand_at())

    def add_warm_instances(self, count: int) -> list[str]:
        pool = self._require_warm_pool()
        tags = [{"Key": TAG_MANAGED, "Value": "true"}, {"Key": TAG_WARM, "Value": WARM_IDLE}]
        spot = pool.pool.capacity_type == CapacityType.SPOT.value
        parameters: dict[str, Any] = {
            "Type": "instant",
            # One subnet per zone, as for a job's launch: a fleet spans no two of one zone.
            "LaunchTemplateConfigs": self._launch_template_configs(
                1,
                [
                    {
                        "InstanceType": pool.pool.instance_type,
                        "SubnetId": self._subnet_by_zone[zone],
                    }
                    for zone in self._zone_names
                ],
            ),
            "TargetCapacitySpecification": {
                "TotalTargetCapacity": count,
                "DefaultTargetCapacityType": pool.pool.capacity_type,
            },
            "TagSpecifications": [
                {"ResourceType": "instance", "Tags": tags},
                {"ResourceType": "fleet", "Tags": tags},
            ],
        }
        if spot:
            parameters["SpotOptions"] = {"AllocationStrategy": "price-capacity-optimized"}
        else:
            parameters["OnDemandOptions"] = {"AllocationStrategy": "lowest-price"}
        response = self._client.create_fleet(
            **parameters, ClientToken=self._warm_client_token(pool, count)
        )
        # Whatever EC2 could not fill now is asked for again at the next pass.
        return [i for group in response.get("Instances", []) for i in group.get("InstanceIds", [])]

    def _warm_client_token(self, pool: DynamoWarmPool, count: int) -> str:
        """The same for a pass retried on the same pool (its live instances, the last demand, the
        top-up), so that EC2 answers the first call's instances instead of launching again; a
        later pass sees the pool changed (instances launched, claimed or ended, a new demand)."""
        live = sorted(i["InstanceId"] for i in self._warm_instances(pool))
        seen = json.dumps([pool.pool.model_dump(), pool.demand_at(), count, live])
        return "warm-" + hashlib.sha256(seen.encode()).hexdigest()[:40]

    def _require_warm_pool(self) -> DynamoWarmPool:
        if self._warm is None:
            raise RuntimeError("this fleet has no warm pool configured")
        return self._warm

    def terminate_instances(self, instance_ids: list[str]) -> None:
        for start in range(0, len(instance_ids), TERMINATE_BATCH):
            self._client.terminate_instances(
                InstanceIds=instance_ids[start : start + TERMINATE_BATCH]
            )

    def _terminate_just_launched(self, instance_ids: list[str]) -> None:
        """Terminate instances CreateFleet answered a moment ago, which EC2 may not list yet."""
        for wait in (*_UNSEEN_INSTANCE_WAITS, None):
            try:
                self.terminate_instances(instance_ids)
                return
            except ClientError as exc:
                unseen = exc.response.get("Error", {}).get("Code") == "InvalidInstanceID.NotFound"
                if not unseen or wait is None:
                    raise
            time.sleep(wait)

    def terminate_job_instances(self, job_id: str) -> list[str]:
        live = [i for i, state in self._job_instances(job_id).items() if state in _LIVE_STATES]
        self.terminate_instances(live)
        return live

    def _job_instances(self, job_id: str) -> dict[str, str]:
        """Every instance tagged with the job that EC2 still lists, ended ones too: its state."""
        paginator = self._client.get_paginator("describe_instances")
        return {
            instance["InstanceId"]: instance["State"]["Name"]
            for page in paginator.paginate(
                Filters=[
                    {"Name": f"tag:{TAG_JOB_ID}", "Values": [job_id]},
                    {"Name": f"tag:{TAG_MANAGED}", "Values": ["true"]},
                ]
            )
            for reservation in page["Reservations"]
            for instance in reservation["Instances"]
        }


def _zone_of(
    template_and_overrides: dict[str, Any], planned_zone: dict[tuple[str, str], str | None]
) -> str | None:
    overrides = template_and_overrides.get("Overrides", {})
    return planned_zone.get((overrides.get("InstanceType", ""), overrides.get("SubnetId", "")))


def placement_group_name(job_id: str) -> str:
    return f"gpufleet-{job_id}"


def _tag_value(resource: dict[str, Any], key: str) -> str | None:
    return next((t["Value"] for t in resource.get("Tags", []) if t["Key"] == key), None)


def _tags(job_id: str) -> list[dict[str, str]]:
    return [{"Key": TAG_MANAGED, "Value": "true"}, {"Key": TAG_JOB_ID, "Value": job_id}]


def _client_tokens(request: LaunchRequest) -> Iterator[str]:
    """The attempt's client tokens, in the order its calls use them. Same job, attempt and
    capacity type -> same first token: a call retried after a crash asks EC2 again for the
    first call's instances instead of launching more. A new attempt has tokens of its own."""
    first = f"{request.job_id}-{request.attempt}-{request.capacity_type.value}"
    yield first
    for spent in range(1, MAX_CLIENT_TOKENS):
        yield f"{first}-{spent}"


def _launch_error(exc: ClientError, failing: LaunchOverride | None) -> LaunchError:
    error = exc.response.get("Error", {})
    return LaunchError(
        code=str(error.get("Code", "Unknown")),
        message=str(error.get("Message", "")),
        instance_type=failing.instance_type if failing else None,
        zone=failing.zone if failing else None,
    )
