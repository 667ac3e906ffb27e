"""YAML job specs, read as a notation of JSON (gpufleet.domain.spec's module doc).

Apart from spec.py so that PyYAML is imported only where a document is read as YAML: the
functions that never read a spec, and JSON specs, do without it (its import is a few percent of
a Lambda cold start).
"""

from __future__ import annotations

import re
from typing import Any

import yaml

from gpufleet.domain.spec import SpecError, syntax_error


class _SpecLoader(yaml.SafeLoader):
    """YAML read as a notation of JSON (the module doc): what it cannot say, or says otherwise
    than JSON would (`yes`, `010`, `1:30`, `.inf`, dates, `!!binary`, sets, `<<` merges,
    duplicate keys), is a string or an error, never a silent conversion."""

    def compose_node(self, parent: Any, index: Any) -> Any:
        # No aliases, so a 'billion laughs' document cannot expand.
        if self.check_event(yaml.AliasEvent):
            raise SpecError("YAML aliases are not allowed in a job spec")
        return super().compose_node(parent, index)

    def flatten_mapping(self, node: yaml.MappingNode) -> None:
        for key_node, _ in node.value:
            if key_node.tag in (_YAML_TAG + "merge", _YAML_TAG + "value"):
                raise _not_json(key_node, "a YAML merge key")

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict[Any, Any]:
        seen: set[str] = set()
        for key_node, _ in node.value:
            key = self.construct_object(key_node, deep=deep)
            if not isinstance(key, str):
                raise _not_json(key_node, "a mapping key that is not a string")
            if key in seen:
                raise _not_json(key_node, f"the key {key!r} twice in one mapping")
            seen.add(key)
        return super().construct_mapping(node, deep=deep)


_YAML_TAG = "tag:yaml.org,2002:"
_JSON_INT = r"-?(?:0|[1-9][0-9]*)"
_JSON_FLOAT = _JSON_INT + r"(?:\.[0-9]+)?(?:[eE][-+]?[0-9]+)?"


def _not_json(node: yaml.Node, what: str) -> yaml.constructor.ConstructorError:
    return yaml.constructor.ConstructorError(
        None, None, f"{what} is not allowed in a job spec", node.start_mark
    )


def _scalar(pattern: str, convert: Any, what: str) -> Any:
    compiled = re.compile(pattern)

    def construct(loader: _SpecLoader, node: yaml.ScalarNode) -> object:
        value = loader.construct_scalar(node)
        if not isinstance(value, str) or not compiled.fullmatch(value):
            raise _not_json(node, what)
        return convert(value)

    return construct


def _refused(what: str) -> Any:
    def construct(_loader: _SpecLoader, node: yaml.Node) -> object:
        raise _not_json(node, what)

    return construct


# Plain scalars resolve as JSON's literals would; anything else plain is a string.
_SpecLoader.yaml_implicit_resolvers = {}
for _tag, _pattern, _first in [
    ("bool", r"^(?:true|false)$", "tf"),
    ("null", r"^(?:null|~|)$", ["n", "~", ""]),
    ("int", f"^{_JSON_INT}$", "-0123456789"),
    ("float", f"^{_JSON_INT}(?:\\.[0-9]+(?:[eE][-+]?[0-9]+)?|[eE][-+]?[0-9]+)$", "-0123456789"),
]:
    _SpecLoader.add_implicit_resolver(_YAML_TAG + _tag, re.compile(_pattern), list(_first))
# Explicit tags: only the JSON types, written as JSON writes them.
_SpecLoader.add_constructor(
    _YAML_TAG + "bool",
    _scalar(r"true|false", lambda v: v == "true", "a boolean other than true/false"),
)
_SpecLoader.add_constructor(_YAML_TAG + "int", _scalar(_JSON_INT, int, "a non-decimal integer"))
_SpecLoader.add_constructor(
    _YAML_TAG + "float", _scalar(_JSON_FLOAT, float, "a number JSON cannot write")
)
for _tag in ("timestamp", "binary", "set", "omap", "pairs"):
    _SpecLoader.add_constructor(_YAML_TAG + _tag, _refused(f"a YAML {_tag}"))


def load_yaml(text: str) -> object:
    """The document `text` holds, or SpecError naming what is wrong and where."""
    try:
        return yaml.load(text, Loader=_SpecLoader)  # noqa: S506 - SafeLoader subclass
    except yaml.YAMLError as exc:
        raise SpecError(f"the spec is not valid YAML/JSON: {_yaml_error(exc)}") from None


def _yaml_error(exc: yaml.YAMLError) -> str:
    """YAML's problem and where, in one line (its own message spans lines and quotes the
    document)."""
    if isinstance(exc, yaml.MarkedYAMLError) and exc.problem:
        where = exc.problem_mark or exc.context_mark
        at = f" (line {where.line + 1}, column {where.column + 1})" if where else ""
        return f"{' '.join(exc.problem.split())}{at}"
    return syntax_error(exc)
