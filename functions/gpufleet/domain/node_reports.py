"""Node reports that a job cannot forge: each run's secret key, the canonical encoding of a
report, and its HMAC-SHA256 signature.

The control plane makes a key of `NODE_KEY_BYTES` random bytes when it launches a run and puts
it in the run's `runs/<job>/node-key` object, which the instance role reads and a job's
container (the job role) cannot; it is never in the job's item, a log, an event or the
container's environment. The node agent signs each report it sends (its start, heartbeats and
finish) with it; the NodeReport function verifies the signature, in constant time, before a
report may change anything. A report without a signature, of another run, or whose signature
does not match (another job's key, a field changed) is refused: `ReportNotAuthentic`.

The signature covers the report's whole detail but the signature itself, encoded canonically
(JSON, keys sorted, no spaces, ASCII): the job, the run, the instance, the phase (the report's
kind), when it was sent (`sent_ms`) and everything else it says. A report of job A's agent is
no report of job B's: B's key verifies it, and the job id is signed.

Standard library only: the agent imports it on the node, the control plane in its functions.
"""

from __future__ import annotations

import hashlib
import hmac
import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from gpufleet.errors import RefusedInput
from gpufleet.topology import NODE_KEY_NAME, RUNS_PREFIX

NODE_KEY_BYTES = 32
# A node-key document is a few dozen bytes: a larger object is no key.
NODE_KEY_DOCUMENT_MAX_BYTES = 1024
# The fields a signed report adds to what it says.
RUN_FIELD = "run"  # the run the key was made for (the job's launch count)
SENT_FIELD = "sent_ms"  # when the agent signed it, epoch milliseconds
SIGNATURE_FIELD = "signature"  # hex HMAC-SHA256 of the canonical encoding

# Why a report was refused (the `Problem` of the NodeReportsDropped metric).
UNSIGNED = "unsigned"
OTHER_RUN = "other-run"  # signed for a run that is not the job's current one (or no run)
BAD_SIGNATURE = "bad-signature"

_HEX_DIGITS = frozenset("0123456789abcdef")


def node_key_object(job_id: str) -> str:
    """Where a job's current run's key is (the instance role reads it, the job role cannot)."""
    return f"{RUNS_PREFIX}{job_id}/{NODE_KEY_NAME}"


class ReportNotAuthentic(RefusedInput):
    """A node report that does not prove it comes from the agent holding its run's key."""

    def __init__(self, problem: str, job_id: str) -> None:
        super().__init__(f"a node report for {job_id} is not authentic: {problem}")
        self.problem = problem
        self.job_id = job_id


class InvalidNodeKey(RefusedInput):
    """A node-key document that is not one (the object was damaged or replaced)."""


@dataclass(frozen=True)
class NodeKey:
    """One run's secret: the run it was made for and its bytes."""

    run: int
    secret: bytes

    def __post_init__(self) -> None:
        if len(self.secret) != NODE_KEY_BYTES or self.run < 1:
            raise InvalidNodeKey(f"a node key is {NODE_KEY_BYTES} bytes for a run >= 1")

    def __repr__(self) -> str:  # never the secret, in a log or a traceback
        return f"NodeKey(run={self.run})"

    def document(self) -> dict[str, Any]:
        return {"run": self.run, "key": self.secret.hex()}

    @classmethod
    def from_document(cls, raw: bytes) -> NodeKey:
        try:
            document = json.loads(raw)
            run, key = document["run"], document["key"]
            if not isinstance(run, int) or isinstance(run, bool) or not isinstance(key, str):
                raise TypeError("run must be an integer and key a string")
            return cls(run=run, secret=bytes.fromhex(key))
        except (ValueError, KeyError, TypeError) as exc:
            raise InvalidNodeKey(f"not a node key document: {type(exc).__name__}") from exc


def canonical_report(detail: Mapping[str, Any]) -> bytes:
    """What is signed: every field of the report but its signature, in one encoding."""
    unsigned = {name: value for name, value in detail.items() if name != SIGNATURE_FIELD}
    return json.dumps(
        unsigned, sort_keys=True, separators=(",", ":"), ensure_ascii=True, allow_nan=False
    ).encode("ascii")


def _mac(detail: Mapping[str, Any], key: NodeKey) -> str:
    return hmac.new(key.secret, canonical_report(detail), hashlib.sha256).hexdigest()


def sign_report(detail: Mapping[str, Any], key: NodeKey, sent_ms: int) -> dict[str, Any]:
    """The report, naming its run and when it was sent, and signed."""
    signed = {**detail, RUN_FIELD: key.run, SENT_FIELD: sent_ms}
    signed.pop(SIGNATURE_FIELD, None)
    signed[SIGNATURE_FIELD] = _mac(signed, key)
    return signed


def verify_report(detail: Mapping[str, Any], key: NodeKey) -> None:
    """Raise ReportNotAuthentic unless `detail` is signed with `key` for its run."""
    job_id = str(detail.get("job_id", ""))[:64]
    signature = detail.get(SIGNATURE_FIELD)
    if not isinstance(signature, str) or not signature:
        raise ReportNotAuthentic(UNSIGNED, job_id)
    if detail.get(RUN_FIELD) != key.run or isinstance(detail.get(RUN_FIELD), bool):
        raise ReportNotAuthentic(OTHER_RUN, job_id)
    if not set(signature) <= _HEX_DIGITS or not isinstance(detail.get(SENT_FIELD), int):
        raise ReportNotAuthentic(BAD_SIGNATURE, job_id)
    try:
        expected = _mac(detail, key)
    except (TypeError, ValueError) as exc:  # not JSON's data model: nothing the agent signs
        raise ReportNotAuthentic(BAD_SIGNATURE, job_id) from exc
    if not hmac.compare_digest(expected, signature):
        raise ReportNotAuthentic(BAD_SIGNATURE, job_id)
