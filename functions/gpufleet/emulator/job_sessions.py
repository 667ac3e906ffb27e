"""IAM for job sessions in the embedded account: what a job's container may do with the keys the
node agent serves it, judged as IAM judges the stack's job role.

moto answers any request signed with any keys (its optional IAM checks read no session tags and
no conditions). The agent opens each job's session with `sts:AssumeRole` on the job role, tagged
with the job and its team (`domain/tenancy.py`), and serves its keys at the container
credentials endpoint (`agent/credentials.py`). Here the account:

- refuses an AssumeRole of the job role whose tags are not exactly the two session tags, each
  with a value, as the role's trust policy does (`infra/constructs/job_role.py`);
- remembers each session's access key and tags;
- answers a request signed with a session's key as IAM does: allowed only when a statement of
  the job role's policy (`tenancy.job_session_statements`, the one the stack deploys) allows
  its action on its resource, with the session's tags read into `${aws:PrincipalTag/...}`;
  else `AccessDenied`, and nothing is read or changed.

Requests signed with any other key (the control plane, the emulator, the nodes' instance role)
pass as before. The hooks sit at the SDK's edge (`before-call`, the seam `cloudwatch_rules` uses),
so every client in the process is judged, whoever made it.

The evaluation is IAM's for identity policies of Allow statements only (the job role has no
Deny and no resource policy grants it anything): an action is allowed when a statement's action
and resource patterns match (`*` and `?`, actions case-insensitive) and its conditions hold.
https://docs.aws.amazon.com/IAM/latest/UserGuide/reference_policies_evaluation-logic.html
"""

from __future__ import annotations

import re
import threading
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from fnmatch import fnmatchcase
from typing import Any

from botocore.awsrequest import AWSResponse

from gpufleet.domain.tenancy import SESSION_TAG_KEYS

_VARIABLE = re.compile(r"\$\{aws:PrincipalTag/([^}]+)\}")
# S3's operations as IAM names the permission each needs on an object (the S3 user guide,
# "Amazon S3 actions"; HeadObject and the multipart steps need the object's Get and Put).
_S3_OBJECT_ACTIONS = {
    "GetObject": "s3:GetObject",
    "HeadObject": "s3:GetObject",
    "PutObject": "s3:PutObject",
    "CreateMultipartUpload": "s3:PutObject",
    "UploadPart": "s3:PutObject",
    "CompleteMultipartUpload": "s3:PutObject",
    "AbortMultipartUpload": "s3:AbortMultipartUpload",
    "DeleteObject": "s3:DeleteObject",
}
_S3_LISTINGS = ("ListObjects", "ListObjectsV2")
# What needs no permission at all (IAM: "No permissions are required").
_UNGOVERNED = {("sts", "GetCallerIdentity")}
_IAM_PREFIXES = {"sfn": "states", "eventbridge": "events", "cloudwatch-logs": "logs"}


@dataclass(frozen=True)
class SessionPolicy:
    """An identity policy's Allow statements, as they apply to one session (its tags)."""

    statements: Sequence[Mapping[str, Any]]
    tags: Mapping[str, str]

    def allows(self, action: str, resource: str, context: Mapping[str, str] | None = None) -> bool:
        return any(
            _matches(action, _listify(s["Action"]), case=False)
            and _matches(resource, [self._resolve(r) for r in _listify(s["Resource"])])
            and _conditions_hold(self._resolved(s.get("Condition", {})), context or {})
            for s in self.statements
            if s["Effect"] == "Allow"
        )

    def _resolved(self, conditions: Mapping[str, Mapping[str, Any]]) -> dict[str, Any]:
        """Conditions with the session's tags read into their values (IAM does so too)."""
        return {
            operator: {
                key: [self._resolve(v) for v in _listify(values)] for key, values in keys.items()
            }
            for operator, keys in conditions.items()
        }

    def _resolve(self, pattern: str) -> str:
        # A variable of a tag the session lacks makes the statement match nothing (IAM).
        return _VARIABLE.sub(lambda m: self.tags.get(m.group(1), "\0"), pattern)


def _listify(value: Any) -> list[Any]:
    return value if isinstance(value, list) else [value]


def _matches(value: str, patterns: list[str], *, case: bool = True) -> bool:
    if not case:
        return any(fnmatchcase(value.lower(), p.lower()) for p in patterns)
    return any(fnmatchcase(value, p) for p in patterns)


def _conditions_hold(
    conditions: Mapping[str, Mapping[str, Any]], context: Mapping[str, str]
) -> bool:
    for operator, keys in conditions.items():
        if operator not in ("StringLike", "StringEquals"):
            raise ValueError(f"the embedded account does not evaluate {operator} conditions")
        for key, expected in keys.items():
            if key not in context:
                return False
            if operator == "StringLike" and not _matches(context[key], _listify(expected)):
                return False
            if operator == "StringEquals" and context[key] not in _listify(expected):
                return False
    return True


@dataclass(frozen=True)
class Needed:
    """One permission a request needs: its action, on its resource, in its context."""

    action: str
    resource: str
    context: Mapping[str, str]


def permissions_needed(service: str, operation: str, params: Mapping[str, Any]) -> list[Needed]:
    """What IAM checks for a call of `operation` (botocore's service id) with `params`."""
    if service == "s3":
        bucket = f"arn:aws:s3:::{params.get('Bucket', '')}"
        if operation in _S3_OBJECT_ACTIONS:
            action = _S3_OBJECT_ACTIONS[operation]
            if "VersionId" in params:  # a version's read or delete has permissions of its own
                action = action.replace("Object", "ObjectVersion", 1)
            return [Needed(action, f"{bucket}/{params.get('Key', '')}", {})]
        if operation in _S3_LISTINGS:
            return [Needed("s3:ListBucket", bucket, {"s3:prefix": params.get("Prefix", "")})]
        if operation == "CopyObject":
            source = params.get("CopySource", "")
            if isinstance(source, Mapping):
                source = f"{source.get('Bucket', '')}/{source.get('Key', '')}"
            return [
                Needed("s3:GetObject", f"arn:aws:s3:::{str(source).lstrip('/')}", {}),
                Needed("s3:PutObject", f"{bucket}/{params.get('Key', '')}", {}),
            ]
        return [Needed(f"s3:{operation}", bucket, {})]
    return [Needed(f"{_IAM_PREFIXES.get(service, service)}:{operation}", "*", {})]


@dataclass(frozen=True)
class _Session:
    arn: str  # arn:aws:sts::ACCOUNT:assumed-role/ROLE/SESSION, as AccessDenied names it
    policy: SessionPolicy


class JobSessions:
    """The job role's sessions of one embedded account, and the hooks that judge them."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._role_arn = ""
        self._statements: list[Mapping[str, Any]] = []
        self._sessions: dict[str, _Session] = {}

    def govern(self, role_arn: str, statements: Sequence[Mapping[str, Any]]) -> None:
        """Sessions of `role_arn` are held to `statements` (the job role's policy)."""
        self._role_arn = role_arn
        self._statements = list(statements)

    def hooks(self) -> list[tuple[str, Any]]:
        return [
            ("before-parameter-build", _keep_params),
            ("before-call", self._judge),
            ("after-call.sts.AssumeRole", self._remember),
        ]

    def _judge(
        self,
        event_name: str,
        request_signer: Any = None,
        context: dict[str, Any] | None = None,
        **_: Any,
    ) -> tuple[AWSResponse, dict[str, Any]] | None:
        service, operation = event_name.split(".")[1:3]
        params: Mapping[str, Any] = (context or {}).get(_PARAMS, {})
        assumes_the_job_role = (service, operation) == ("sts", "AssumeRole") and params.get(
            "RoleArn"
        ) == (self._role_arn or None)
        if assumes_the_job_role and not _tagged_as_a_job(params):
            return _denied(
                "AccessDenied",
                f"not authorized to perform: sts:AssumeRole on resource: {self._role_arn} "
                "(the role's trust policy needs the tags "
                f"{', '.join(SESSION_TAG_KEYS)} and no others)",
            )
        session = self._session_of(request_signer)
        if session is None or (service, operation) in _UNGOVERNED:
            return None
        for needed in permissions_needed(service, operation, params):
            if not session.policy.allows(needed.action, needed.resource, needed.context):
                return _denied(
                    "AccessDenied",
                    f"User: {session.arn} is not authorized to perform: {needed.action} on "
                    f"resource: {needed.resource} because no identity-based policy allows the "
                    f"{needed.action} action",
                )
        return None

    def _remember(
        self, parsed: Mapping[str, Any], context: dict[str, Any] | None = None, **_: Any
    ) -> None:
        params: Mapping[str, Any] = (context or {}).get(_PARAMS, {})
        credentials = parsed.get("Credentials")
        if params.get("RoleArn") != self._role_arn or not credentials:
            return
        tags = {t["Key"]: t["Value"] for t in params.get("Tags", [])}
        arn = parsed.get("AssumedRoleUser", {}).get("Arn", self._role_arn)
        with self._lock:
            self._sessions[credentials["AccessKeyId"]] = _Session(
                arn, SessionPolicy(self._statements, tags)
            )

    def _session_of(self, request_signer: Any) -> _Session | None:
        # botocore hands the hook the client's signer, not its keys: they are its credentials.
        credentials = getattr(request_signer, "_credentials", None)
        if credentials is None:
            return None
        access_key = credentials.get_frozen_credentials().access_key
        with self._lock:
            return self._sessions.get(access_key)


_PARAMS = "gpufleet_api_params"


def _keep_params(params: dict[str, Any], context: dict[str, Any], **_: Any) -> None:
    """The call's own parameters, kept for the judge (at `before-call` they are serialized)."""
    context[_PARAMS] = dict(params)


def _tagged_as_a_job(params: Mapping[str, Any]) -> bool:
    tags = {t.get("Key"): t.get("Value") for t in params.get("Tags", [])}
    return set(tags) == set(SESSION_TAG_KEYS) and all(tags.values())


def _denied(code: str, message: str) -> tuple[AWSResponse, dict[str, Any]]:
    parsed = {
        "Error": {"Code": code, "Message": message},
        "ResponseMetadata": {"HTTPStatusCode": 403},
    }
    return AWSResponse("https://embedded.amazonaws.com/", 403, {}, None), parsed
