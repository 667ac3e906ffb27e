"""The functions plan with the catalog refreshed into the stack's bucket while it is fresh, and
with the bundled one otherwise (services.catalog, domain.catalog.choose_catalog)."""

from __future__ import annotations

import json
import logging
from datetime import UTC, date, datetime, timedelta
from typing import Any, cast

import pytest

from gpufleet import topology
from gpufleet.adapters.local.memory import InMemoryObjects
from gpufleet.domain.catalog import bundled_document, choose_catalog, load_bundled
from gpufleet.domain.launch import LaunchOverride
from gpufleet.ports import Ports
from tests.helpers import SPEC_YAML, intake_for, local_ports, make_settings, plan_of

REGION = "us-east-1"


def _today(ports: Ports) -> date:
    return datetime.fromtimestamp(ports.clock.now(), UTC).date()


def _refreshed(generated: date, factor: float) -> dict[str, Any]:
    """The bundled catalog as a refresh of `generated` would write it, every price * factor."""
    document = bundled_document()
    document["generated"] = generated.isoformat()
    for row in document["offerings"]:
        for field in ("on_demand_usd_per_hour", "spot_usd_per_hour"):
            if row[field] is not None:
                row[field] = round(row[field] * factor, 6)
    return document


def _first_choice(ports: Ports, **settings: Any) -> LaunchOverride:
    """The first offering of the plan intake makes for the sample spec."""
    objects = cast(InMemoryObjects, ports.objects)
    version = objects.upload("jobs/vision/a.yaml", SPEC_YAML)
    job_id = (
        intake_for(ports, make_settings(**settings))
        .submit_object(
            "jobs/vision/a.yaml", f"jobs/vision/a.yaml#{version}", "s3", version_id=version
        )
        .job_id
    )
    assert job_id is not None
    return plan_of(ports, job_id).steps[0].overrides[0]


@pytest.fixture(scope="module")
def bundled_choice() -> LaunchOverride:
    return _first_choice(local_ports())


def test_a_fresh_refreshed_catalog_prices_the_next_plan(bundled_choice: LaunchOverride) -> None:
    ports = local_ports()
    ports.objects.put_json(topology.CATALOG_KEY, _refreshed(_today(ports), 0.5))
    choice = _first_choice(ports)
    assert choice.instance_type == bundled_choice.instance_type
    assert choice.hourly_usd == pytest.approx(bundled_choice.hourly_usd * 0.5, rel=1e-3)


@pytest.mark.parametrize(
    ("age_days", "max_age_days", "refreshed_used"),
    [(7, 7, True), (8, 7, False), (2, 1, False), (2, 3, True)],
)
def test_a_refreshed_catalog_older_than_the_limit_gives_way_to_the_bundled_one(
    bundled_choice: LaunchOverride, age_days: int, max_age_days: int, refreshed_used: bool
) -> None:
    ports = local_ports()
    generated = _today(ports) - timedelta(days=age_days)
    ports.objects.put_json(topology.CATALOG_KEY, _refreshed(generated, 2.0))
    choice = _first_choice(ports, catalog_max_age_days=max_age_days)
    factor = 2.0 if refreshed_used else 1.0
    assert choice.hourly_usd == pytest.approx(bundled_choice.hourly_usd * factor, rel=1e-3)


def test_without_a_refreshed_catalog_the_plan_uses_the_bundled_one(
    bundled_choice: LaunchOverride, caplog: pytest.LogCaptureFixture
) -> None:
    ports = local_ports()
    with caplog.at_level(logging.INFO, logger="gpufleet"):
        assert _first_choice(ports) == bundled_choice
    said = [r for r in caplog.records if r.getMessage() == "planning with the bundled catalog"]
    assert len(said) == 1  # once per process, however many plans
    assert said[0].__dict__["reason"] == "no refreshed catalog"


@pytest.mark.parametrize(
    ("body", "reason"),
    [
        (b"{not json", "refreshed catalog unreadable"),
        (json.dumps({"generated": "2026-01-01"}).encode(), "refreshed catalog does not load"),
        (json.dumps({**bundled_document(), "generated": "soon"}).encode(), "has no date"),
    ],
)
def test_a_broken_refreshed_catalog_is_said_and_the_bundled_one_used(
    bundled_choice: LaunchOverride, body: bytes, reason: str, caplog: pytest.LogCaptureFixture
) -> None:
    ports = local_ports()
    cast(InMemoryObjects, ports.objects).objects[topology.CATALOG_KEY] = body
    with caplog.at_level(logging.INFO, logger="gpufleet"):
        assert _first_choice(ports) == bundled_choice
    (said,) = [r for r in caplog.records if r.getMessage().startswith("planning with the")]
    assert said.__dict__["catalog"] == "bundled"
    assert reason in said.__dict__["reason"]


def test_a_refreshed_catalog_of_another_region_or_from_the_future_is_not_used() -> None:
    bundled = load_bundled()
    today = date(2026, 1, 1)
    other = _refreshed(today, 1.0)
    other["offerings"] = [o for o in other["offerings"] if o["region"] != REGION]
    choice = choose_catalog(other, region=REGION, today=today, max_age_days=7, bundled=bundled)
    assert (choice.source, choice.catalog) == ("bundled", bundled)
    assert "no offering in us-east-1" in choice.reason
    ahead = _refreshed(today + timedelta(days=1), 1.0)
    choice = choose_catalog(ahead, region=REGION, today=today, max_age_days=7, bundled=bundled)
    assert choice.source == "bundled"
    assert "ahead" in choice.reason
