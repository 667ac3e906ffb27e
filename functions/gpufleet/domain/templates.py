"""Resource templates: named `Resources` in the fleet config that a spec names instead of
spelling out its resources (`template: gpu-train`).

A `resources:` block next to `template:` overrides only the fields it names: with
`resources: {nodes: 2}` the job keeps the template's GPUs, vCPUs and memory. A list field
(`gpu_models`) is replaced, not merged. Resolution happens once, at intake: the stored spec holds
the resolved resources and the template's name, so planning, the queue and cost read
`spec.resources` as for any other job, and editing a template later does not change jobs
already submitted.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from pydantic import ValidationError

from gpufleet.domain.spec import (
    FieldError,
    JobSpec,
    Resources,
    SpecError,
    Stage,
    spec_from_mapping,
)
from gpufleet.errors import RefusedInput

Templates = Mapping[str, Resources]


class UnknownTemplate(RefusedInput, ValueError):
    """A spec names a template the fleet config does not define."""

    def __init__(self, name: str, templates: Templates) -> None:
        known = ", ".join(sorted(templates)) or "none (the fleet config defines no templates)"
        super().__init__(f"unknown template {name!r}; known templates: {known}")
        self.name = name


def resolve_resources(
    template: str | None, overrides: Mapping[str, Any], templates: Templates
) -> Resources:
    """The resources of `template` with `overrides` replacing the fields they name; without a
    template, `overrides` alone (missing fields take the `Resources` defaults).

    Raises UnknownTemplate for a name `templates` lacks, and pydantic's ValidationError when the
    result is invalid (e.g. `gpus: 0` over a multi-node template).
    """
    if template is None:
        return Resources.model_validate(overrides)
    try:
        base = templates[template]
    except KeyError:
        raise UnknownTemplate(template, templates) from None
    return Resources.model_validate({**base.model_dump(), **overrides})


def apply_template(spec: JobSpec, templates: Templates) -> JobSpec:
    """`spec` with its template resolved into `resources`, and each stage's resources resolved
    too; `spec` itself when it names no template and has no stages.

    A stage's resources are its own template's, or else the job's (resolved) resources, with the
    fields its `resources` names laid over them. The overrides are the resource fields the
    submitter wrote (pydantic's `model_fields_set`), not the defaults filled in for the others.
    Raises SpecError naming the field at fault.
    """
    if spec.template is None and not spec.stages:
        return spec
    resources = spec.resources
    if spec.template is not None:
        resources = _resolve(spec.template, _written(spec.resources), templates, "", "the spec")
        if spec.scale_on is not None and resources.elastic is None:
            # The spec-level rule skips specs with a template: the range may be the template's.
            raise SpecError(
                "scale_on scales elastic jobs",
                [
                    FieldError(
                        field="scale_on",
                        message=f"template {spec.template!r} with the spec's resources gives "
                        "no resources.elastic",
                    )
                ],
            )
    # Validated again as a whole document, so every spec-level rule sees the resolved resources.
    document = {**spec.to_document(), "resources": resources.model_dump(mode="json")}
    if spec.stages:
        document["stages"] = [
            {
                **stage.model_dump(mode="json", by_alias=True, exclude_none=True),
                "resources": _stage_resources(index, stage, resources, templates).model_dump(
                    mode="json"
                ),
            }
            for index, stage in enumerate(spec.stages)
        ]
    return spec_from_mapping(document)


def _written(resources: Resources | None) -> dict[str, Any]:
    """The fields of `resources` the submitter wrote."""
    if resources is None:
        return {}
    return resources.model_dump(include=resources.model_fields_set)


def _stage_resources(
    index: int, stage: Stage, job_resources: Resources, templates: Templates
) -> Resources:
    at, owner = f"stages[{index}].", f"stage {stage.name!r}"
    overrides = _written(stage.resources)
    if stage.template is not None:
        return _resolve(stage.template, overrides, templates, at, owner)
    try:
        return Resources.model_validate({**job_resources.model_dump(), **overrides})
    except ValidationError as exc:
        raise _invalid(
            f"the job's resources with {owner}'s overrides are invalid", at, exc
        ) from None


def _resolve(
    template: str, overrides: Mapping[str, Any], templates: Templates, at: str, owner: str
) -> Resources:
    """`resolve_resources` for `owner` (the spec, or one of its stages), its errors as a
    SpecError naming the fields under `at`."""
    try:
        return resolve_resources(template, overrides, templates)
    except UnknownTemplate as exc:
        raise SpecError(
            f"{owner} names an unknown resource template",
            [FieldError(field=f"{at}template", message=str(exc))],
        ) from None
    except ValidationError as exc:
        message = f"the resources of template {template!r} with {owner}'s overrides are invalid"
        raise _invalid(message, at, exc) from None


def _invalid(message: str, at: str, exc: ValidationError) -> SpecError:
    return SpecError(
        message,
        [
            FieldError(
                field=".".join([f"{at}resources", *(str(part) for part in err["loc"])]),
                message=str(err["msg"]),
            )
            for err in exc.errors(include_url=False, include_input=False)
        ],
    )
