"""EC2 placement groups for the embedded account: moto 5.2.5 does not implement them.

`before-call` hooks answer CreatePlacementGroup, DescribePlacementGroups and
DeletePlacementGroup with the real response and error shapes, keeping the groups in memory.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

from botocore.awsrequest import AWSResponse

_OK = 200


def _response(status: int, parsed: dict[str, Any]) -> tuple[AWSResponse, dict[str, Any]]:
    parsed.setdefault("ResponseMetadata", {"HTTPStatusCode": status})
    return AWSResponse("https://ec2.us-east-1.amazonaws.com/", status, {}, None), parsed


def _error(code: str, message: str) -> tuple[AWSResponse, dict[str, Any]]:
    return _response(400, {"Error": {"Code": code, "Message": message}})


class PlacementGroups:
    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._groups: dict[str, dict[str, Any]] = {}

    def hooks(self) -> list[tuple[str, Callable[..., Any]]]:
        return [
            ("before-call.ec2.CreatePlacementGroup", self._create),
            ("before-call.ec2.DescribePlacementGroups", self._describe),
            ("before-call.ec2.DeletePlacementGroup", self._delete),
        ]

    def exists(self, name: str) -> bool:
        with self._lock:
            return name in self._groups

    def _create(self, params: dict[str, Any], **_: Any) -> tuple[AWSResponse, dict[str, Any]]:
        body = params["body"]
        name = str(body["GroupName"])
        tags = []
        index = 1
        while f"TagSpecification.1.Tag.{index}.Key" in body:
            tags.append(
                {
                    "Key": body[f"TagSpecification.1.Tag.{index}.Key"],
                    "Value": body[f"TagSpecification.1.Tag.{index}.Value"],
                }
            )
            index += 1
        with self._lock:
            if name in self._groups:
                return _error("InvalidPlacementGroup.Duplicate", f"{name} already exists")
            group = {
                "GroupName": name,
                "Strategy": str(body.get("Strategy", "cluster")),
                "State": "available",
                "GroupId": f"pg-{abs(hash(name)) % 16**17:017x}",
                "Tags": tags,
            }
            self._groups[name] = group
        return _response(_OK, {"PlacementGroup": group})

    def _describe(self, params: dict[str, Any], **_: Any) -> tuple[AWSResponse, dict[str, Any]]:
        body = params["body"]
        names = {v for k, v in body.items() if k.startswith("GroupName.")}
        wanted_tags = {
            body[key.replace(".Name", ".Value.1")]: body[key][len("tag:") :]
            for key in body
            if key.startswith("Filter.") and key.endswith(".Name") and body[key].startswith("tag:")
        }
        with self._lock:
            groups = [
                g
                for g in self._groups.values()
                if (not names or g["GroupName"] in names)
                and all(
                    {"Key": key, "Value": value} in g["Tags"] for value, key in wanted_tags.items()
                )
            ]
        return _response(_OK, {"PlacementGroups": groups})

    def _delete(self, params: dict[str, Any], **_: Any) -> tuple[AWSResponse, dict[str, Any]]:
        name = str(params["body"]["GroupName"])
        with self._lock:
            if self._groups.pop(name, None) is None:
                return _error("InvalidPlacementGroup.Unknown", f"{name} does not exist")
        return _response(_OK, {})
