"""Hypothesis strategies for job specs as submitters send them: valid specs, mutations of valid
ones (a field replaced by any JSON value, a count retyped, a duration too large for a float, a
spec padded with one character up to the size limits, duplicate keys, a YAML error that quotes
the whole document, ...), and the bytes an upload carries (JSON, YAML in its styles, broken).

Shared by the pure intake tests (many examples) and the embedded account's (a few).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

import yaml
from hypothesis import strategies as st

from gpufleet.domain.spec import MAX_ENV, MAX_RUN_SECONDS, MAX_SPEC_BYTES
from gpufleet.domain.submitters import spec_upload_key, upload_key

NAME = st.from_regex(r"[a-z0-9][a-z0-9._-]{0,20}", fullmatch=True)
ENV_NAME = st.from_regex(r"[A-Za-z_][A-Za-z0-9_]{0,15}", fullmatch=True)
IMAGE = st.sampled_from(["img:1", "public.ecr.aws/pytorch/pytorch:2.4.0", "a/b@sha256:00ff"])
# Any text a file or an event can carry: control characters, emoji, other scripts.
TEXT = st.text(st.characters(codec="utf-8", exclude_characters="\x00"), max_size=24)
DURATION = st.one_of(
    st.integers(60, MAX_RUN_SECONDS), st.sampled_from(["90m", "4h", "1.5d", "3600", 7200.0])
)
JSON_VALUES = st.recursive(
    st.none()
    | st.booleans()
    | st.integers()
    | st.floats()
    | st.text(st.characters(codec="utf-8"), max_size=24),
    lambda children: st.lists(children, max_size=3) | st.dictionaries(TEXT, children, max_size=3),
    max_leaves=10,
)

RESOURCES = st.fixed_dictionaries(
    {},
    optional={
        "gpus": st.integers(1, 8),
        "gpu_memory_gib": st.sampled_from([0, 16, 24.0, 80]),
        "gpu_models": st.lists(st.sampled_from(["A10G", "L4", "H100", "A100"]), max_size=2),
        "vcpus": st.integers(1, 64),
        "memory_gib": st.integers(1, 512),
        "nodes": st.integers(1, 2),
        "arch": st.just("x86_64"),
    },
)
STAGE = st.fixed_dictionaries(
    {"name": NAME},
    optional={
        "command": st.lists(TEXT, min_size=1, max_size=3),
        "env": st.dictionaries(ENV_NAME, TEXT, max_size=3),
        "timeout": DURATION,
        "resources": RESOURCES,
    },
)
SPECS = st.fixed_dictionaries(
    {"name": NAME, "team": NAME, "image": IMAGE, "command": st.lists(TEXT, min_size=1, max_size=4)},
    optional={
        "priority": st.sampled_from(["critical", "high", "normal", "low"]),
        "env": st.dictionaries(ENV_NAME, TEXT, max_size=4),
        "resources": RESOURCES,
        "spot": st.sampled_from(["auto", "required", "never"]),
        "checkpoint": st.just("s3://ckpt-bucket/runs/"),
        "max_retries": st.integers(0, 20),
        "retry_exit_codes": st.lists(st.integers(1, 255), max_size=3),
        "timeout": DURATION,
        "expected_duration": DURATION,
        "budget_usd": st.floats(1, 1000),
        "stages": st.lists(STAGE, min_size=1, max_size=2, unique_by=lambda s: s["name"]),
        "array": st.fixed_dictionaries({"size": st.integers(0, 10_001)}),
        "sweep": st.fixed_dictionaries(
            {"grid": st.dictionaries(ENV_NAME, st.lists(TEXT | st.integers(), max_size=3))}
        ),
        "depends_on": st.lists(st.fixed_dictionaries({"job": NAME}), max_size=2),
    },
)

TOP_FIELDS = ["name", "team", "priority", "image", "command", "env", "resources", "spot"]
TOP_FIELDS += ["checkpoint", "max_retries", "timeout", "expected_duration", "budget_usd"]
TOP_FIELDS += ["stages", "template", "retry_oom_with_more_memory", "scale_on"]
TOP_FIELDS += ["array", "sweep", "depends_on"]
COUNTS = ["gpus", "vcpus", "nodes"]
# Characters whose encodings grow the most from one notation to another: UTF-8 to an ASCII
# escape (emoji 4 -> 12 bytes), a control character (YAML "\x01", JSON "\u0001"), a quote.
PADDING = ["🚀", "训", "é", "\x01", '"', "\\", "a"]


def _pad(document: dict[str, Any], char: str, target_bytes: int) -> dict[str, Any]:
    """`document` with env values of `char` adding up to about `target_bytes` (UTF-8)."""
    per_char = len(char.encode())
    chars = target_bytes // per_char
    env: dict[str, str] = {}
    index = 0
    while chars > 0 and index < MAX_ENV:
        take = min(chars, 8192)
        env[f"PAD_{index}"] = char * take
        chars -= take
        index += 1
    return {**document, "env": env}


@st.composite
def mutations(draw: st.DrawFn, spec: dict[str, Any]) -> dict[str, Any]:
    """`spec` changed the way a careless or hostile submitter would."""
    kind = draw(
        st.sampled_from(
            ["none", "value", "duration", "retyped", "dropped", "unknown", "padded", "stage_env"]
        )
    )
    document = dict(spec)
    if kind == "value":
        document[draw(st.sampled_from(TOP_FIELDS))] = draw(JSON_VALUES)
    elif kind == "duration":
        field = draw(st.sampled_from(["timeout", "expected_duration"]))
        exponent = draw(st.integers(16, 400))
        document[field] = draw(st.sampled_from([10**exponent, -(10**exponent), 1e300, 0.5]))
    elif kind == "retyped":
        count = draw(st.sampled_from(COUNTS))
        value = draw(st.integers(1, 8))
        retyped = draw(st.sampled_from([str(value), float(value), True]))
        document["resources"] = {**document.get("resources", {}), count: retyped}
    elif kind == "dropped":
        document.pop(draw(st.sampled_from(["name", "team", "image", "command"])))
    elif kind == "unknown":
        document[draw(TEXT) or "x" * draw(st.integers(1, 200_000))] = draw(JSON_VALUES)
    elif kind == "padded":
        char = draw(st.sampled_from(PADDING))
        fraction = draw(st.floats(0.3, 1.1))
        document = _pad(document, char, int(MAX_SPEC_BYTES * fraction))
    elif kind == "stage_env":
        job_env = {f"J{i}": "x" for i in range(draw(st.integers(100, MAX_ENV)))}
        stage_env = {f"S{i}": "y" for i in range(draw(st.integers(1, MAX_ENV)))}
        document = {**document, "env": job_env, "stages": [{"name": "s", "env": stage_env}]}
    return document


@dataclass(frozen=True)
class Upload:
    """What one upload under jobs/ (a team's jobs/<team>/, most of them) carries."""

    key: str
    body: bytes


def _yaml(document: Any, flow: bool, unicode: bool) -> bytes:
    text = yaml.safe_dump(document, default_flow_style=flow, allow_unicode=unicode, width=4096)
    return text.encode("utf-8", "surrogatepass")


@st.composite
def uploads(draw: st.DrawFn) -> Upload:
    """An upload: a (mutated) spec in one of the notations, or bytes that are no spec at all."""
    document = draw(mutations(draw(SPECS)))
    name = draw(NAME)
    broken = upload_key("t", name)  # under a team's folder: refused for what it holds
    notation = draw(
        st.sampled_from(["json", "json-ascii", "yaml-block", "yaml-flow", "duplicate", "broken"])
    )
    if notation in ("json", "json-ascii"):
        body = json.dumps(document, ensure_ascii=notation == "json-ascii").encode(
            "utf-8", "surrogatepass"
        )
        return Upload(spec_upload_key(body, f"{name}.json"), body)
    if notation == "broken":
        return draw(
            st.sampled_from(
                [
                    Upload(f"{broken}.yaml", b"name: x\ntag: !" + b"t" * 200_000 + b"\n"),
                    Upload(f"{broken}.yaml", b""),
                    Upload(f"{broken}/", b""),
                    Upload(f"{broken}.error.json", json.dumps(document).encode()),
                    Upload(f"{broken}.yaml", b"\t" + b"x" * 200_000),
                ]
            )
            | st.builds(Upload, st.just(f"{broken}.yaml"), st.binary(max_size=512))
        )
    body = _yaml(document, notation == "yaml-flow", draw(st.booleans()))
    if notation == "duplicate":  # block style: a second line for a key already given
        body += b"name: again\n"
    return Upload(spec_upload_key(body, f"{name}.yaml"), body)


# An event's detail: what EventBridge carries (a JSON object of at most 256 KiB).
DETAILS = SPECS.flatmap(mutations)
