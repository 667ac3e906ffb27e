"""`gpufleet review`'s rules: right-size, waste and commitments, over made-up histories."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

import pytest

from gpufleet.domain.catalog import load_bundled
from gpufleet.domain.config import Reservation, ReservationKind
from gpufleet.domain.job import Job, JobStatus, Placement
from gpufleet.domain.review import (
    PLANS,
    ReviewedJob,
    booked_block_prices,
    capacity_block_break_even,
    commitments,
    rework_seconds,
    right_size,
    waste,
)
from gpufleet.domain.spec import parse_spec
from gpufleet.domain.usage_layout import NodeSummary, NodeUsage, Sample

T0 = 1_764_672_000.0
HOUR = 3600.0
REGION = "us-east-1"


def job(
    name: str = "resnet",
    instance_type: str = "g5.12xlarge",
    hours: float = 10.0,
    capacity: str = "spot",
    hourly: float = 5.672,
    extra: str = "",
    start: float = T0,
    **fields: Any,
) -> Job:
    spec = parse_spec(
        f"name: {name}\nteam: vision\nimage: img\ncommand: [x]\nresources: {{gpus: 4}}\n{extra}"
    )
    values: dict[str, Any] = {
        "job_id": f"j-{abs(hash((name, start))) % 10**20:020d}",
        "status": JobStatus.SUCCEEDED,
        "spec": spec,
        "source": "s3://b/jobs/x.yaml",
        "created_at": start,
        "updated_at": start,
        "placement": Placement(
            instance_ids=["i-1"],
            instance_type=instance_type,
            capacity_type=capacity,
            hourly_usd=hourly,
            launched_at=start,
        ),
        "released_at": start + hours * HOUR,
        **fields,
    }
    return Job.model_validate(values)


def used(
    gpu_mem_mib: float,
    util: float = 90.0,
    finished_before_release: float = 0.0,
    released: float = T0 + 10 * HOUR,
) -> tuple[NodeSummary, ...]:
    usage = NodeUsage(job_id="j", instance_id="i-1", gpu_mem_total_mib=(24576.0,) * 4)
    usage = usage.with_event(T0, "started")
    for n in range(10):
        usage = usage.with_sample(
            Sample(T0 + n * HOUR, (util,) * 4, (gpu_mem_mib,) * 4, 20.0, 16384.0)
        )
    return (usage.with_event(released - finished_before_release, "finished").summarized(),)


def test_a_family_that_used_a_third_of_its_gpu_memory_is_sized_down_with_the_saving() -> None:
    [advice] = right_size([ReviewedJob(job(), used(8000.0))], load_bundled(), REGION)
    # 8,000 MiB + 10 % fits the 16 GiB T4s of g4dn.12xlarge, the cheapest 4-GPU type that does.
    assert (advice.instance_type, advice.suggested_type) == ("g5.12xlarge", "g4dn.12xlarge")
    assert advice.saving_usd == pytest.approx(10 * (5.672 - 3.912), abs=0.01)


def test_a_family_on_spot_saves_in_proportion_to_what_it_paid_never_more() -> None:
    spot = job(hourly=1.9)  # the spot price it paid, a third of on-demand
    [advice] = right_size([ReviewedJob(spot, used(8000.0))], load_bundled(), REGION)
    assert advice.saving_usd == pytest.approx(10 * 1.9 * (1 - 3.912 / 5.672), abs=0.01)
    assert advice.saving_usd < 10 * 1.9


def test_a_family_whose_peaks_need_its_type_is_left_alone() -> None:
    assert right_size([ReviewedJob(job(), used(23000.0))], load_bundled(), REGION) == []
    assert right_size([ReviewedJob(job(), ())], load_bundled(), REGION) == []  # no usage: no word


def test_waste_counts_idle_gpus_the_hours_after_the_work_and_rework() -> None:
    idle = ReviewedJob(job(name="idle"), used(8000.0, util=2.0))
    held = ReviewedJob(job(name="held"), used(8000.0, finished_before_release=2 * HOUR))
    by_name = {w.name: w for w in waste([idle, held])}
    assert by_name["idle"].idle_gpu_hours == pytest.approx(40.0)  # 10 h x 4 GPUs, all idle
    assert by_name["idle"].idle_usd == pytest.approx(56.72)
    assert by_name["held"].held_after_hours == pytest.approx(8.0)  # 2 h x 4 GPUs
    assert by_name["held"].held_after_usd == pytest.approx(2 * 5.672, abs=0.01)
    assert by_name["held"].idle_usd == 0.0


def test_rework_is_every_earlier_run_without_a_checkpoint_half_an_interval_with_one() -> None:
    base = {"interruptions": 2, "prior_held_seconds": 5 * HOUR}
    assert rework_seconds(job(**base)) == 5 * HOUR
    checkpointed = "checkpoint: s3://ckpt/resnet/\ncheckpoint_interval: 30m\n"
    assert rework_seconds(job(extra=checkpointed, **base)) == 2 * 15 * 60
    on_request = "checkpoint: s3://ckpt/resnet/\n"
    assert rework_seconds(job(extra=on_request, **base)) == 0.0
    assert rework_seconds(job(prior_held_seconds=5 * HOUR)) == 0.0  # nothing interrupted it


def test_a_steady_on_demand_baseline_breaks_even_where_its_discount_says() -> None:
    steady = [
        job(name=f"n{day}", capacity="on-demand", hourly=2.0, hours=24.0, start=T0 + day * 86400)
        for day in range(30)
    ]
    burst = job(name="burst", capacity="on-demand", hourly=6.0, hours=24.0, start=T0)
    found = commitments([*steady, burst], T0, T0 + 30 * 86400)
    plans = {c.plan: c for c in found}
    assert set(plans) == {p.name for p in PLANS}
    compute = plans["Compute Savings Plan"]
    assert compute.family == "g5" and compute.hours == 720
    assert compute.baseline_usd_per_hour == pytest.approx(2.0)
    assert compute.break_even_utilization == pytest.approx(0.34)
    assert compute.commit_usd_per_hour == pytest.approx(2.0)  # the burst is not steady
    assert compute.saving_usd == pytest.approx(720 * 2.0 * 0.66, abs=0.05)
    assert all("aws.amazon.com" in c.source for c in found)


def test_spot_and_no_history_commit_nothing() -> None:
    assert commitments([job()], T0, T0 + 86400) == []
    assert commitments([], T0, T0 + 86400) == []


def test_a_capacity_block_breaks_even_at_its_price_over_the_on_demand_price() -> None:
    [half] = capacity_block_break_even({"g5.12xlarge": 5.672 / 2}, load_bundled(), REGION)
    assert half.on_demand_usd_per_hour == 5.672
    assert half.break_even_utilization == 0.5  # used half its hours, it costs what on-demand does
    [dear] = capacity_block_break_even({"g5.12xlarge": 5.672 * 1.5}, load_bundled(), REGION)
    assert dear.break_even_utilization == 1.5  # above 1: never cheaper than on-demand


def test_the_blocks_a_config_books_give_their_prices_and_odcrs_none() -> None:
    def booked(kind: ReservationKind, hourly_usd: float | None, number: int) -> Reservation:
        window = {
            "start": datetime(2026, 12, 1, tzinfo=UTC),
            "end": datetime(2026, 12, 2, tzinfo=UTC),
        }
        return Reservation(
            id=f"cr-0000000{number}",
            kind=kind,
            instance_type="p5.48xlarge",
            zone="us-east-1a",
            count=1,
            hourly_usd=hourly_usd,
            **(window if kind is ReservationKind.CAPACITY_BLOCK else {}),
        )

    reservations = [
        booked(ReservationKind.CAPACITY_BLOCK, 31.0, 1),
        booked(ReservationKind.CAPACITY_BLOCK, 34.5, 2),  # the dearer of two blocks of a type
        booked(ReservationKind.ODCR, 98.32, 3),  # billed at on-demand: nothing to break even
    ]
    assert booked_block_prices(reservations) == {"p5.48xlarge": 34.5}


def test_a_capacity_block_for_a_type_without_an_on_demand_price_is_left_out() -> None:
    assert capacity_block_break_even({"nosuch.48xlarge": 30.0}, load_bundled(), REGION) == []
