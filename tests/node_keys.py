"""A run's node key for tests of the agent and of node reports (domain/node_reports.py)."""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from gpufleet.domain.node_reports import (
    RUN_FIELD,
    SENT_FIELD,
    SIGNATURE_FIELD,
    NodeKey,
    node_key_object,
)

NODE_KEY = NodeKey(run=1, secret=bytes(range(32)))
NODE_KEY_DOCUMENT = json.dumps(NODE_KEY.document()).encode()


def is_node_key(key: str) -> bool:
    """Whether an object key names a run's node key (which the fakes serve by default)."""
    job_id = key.split("/")[1] if key.count("/") == 2 else ""
    return key == node_key_object(job_id)


def unsigned(detail: Mapping[str, Any]) -> dict[str, Any]:
    """What a signed report says, without what signing added."""
    return {k: v for k, v in detail.items() if k not in (RUN_FIELD, SENT_FIELD, SIGNATURE_FIELD)}
