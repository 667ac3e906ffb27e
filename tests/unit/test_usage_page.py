"""`gpufleet report`'s page: the run's timeline, its curves as PNG, and HTML that escapes what
the job and its nodes say."""

from __future__ import annotations

import struct
import zlib
from pathlib import Path

from gpufleet.cli.png import Canvas
from gpufleet.cli.usage_page import write_report
from gpufleet.domain.job import Job, JobStatus, Placement
from gpufleet.domain.run_timeline import HELD_AFTER, LAUNCHING, QUEUED, RUNNING, timeline
from gpufleet.domain.spec import parse_spec
from gpufleet.domain.usage_layout import NodeUsage, Sample

T0 = 1_764_672_000.0
HOSTILE = '<script>alert("x")</script>&'


def job(**fields: object) -> Job:
    spec = parse_spec("name: resnet\nteam: vision\nimage: img\ncommand: [x]\n")
    values: dict[str, object] = {
        "job_id": "j-0123456789abcdef0123",
        "status": JobStatus.SUCCEEDED,
        "spec": spec,
        "source": "s3://b/jobs/x.yaml",
        "created_at": T0,
        "updated_at": T0,
        "first_admitted_at": T0 + 60,
        "placement": Placement(
            instance_ids=["i-1"],
            instance_type="g5.xlarge",
            capacity_type="spot",
            hourly_usd=1.0,
            launched_at=T0 + 60,
        ),
        "released_at": T0 + 4000,
        **fields,
    }
    return Job.model_validate(values)


def node(instance_id: str = "i-1") -> NodeUsage:
    usage = NodeUsage(job_id="j-0123456789abcdef0123", instance_id=instance_id)
    usage = usage.with_event(T0 + 300, "started")
    for n in range(60):
        usage = usage.with_sample(
            Sample(T0 + 300 + 60 * n, (float(n), 50.0), (1000.0 + n, 2.0), 30.0, 4096.0)
        )
    return usage.with_event(T0 + 2000, "checkpoint").with_event(T0 + 3700, "finished")


def test_the_timeline_runs_from_queued_through_each_node_to_the_release() -> None:
    line = timeline(job(), [node()], now=T0 + 9999)
    assert [(s.phase, s.start - T0, s.end - T0) for s in line.spans] == [
        (QUEUED, 0, 60),
        (LAUNCHING, 60, 300),
        (RUNNING, 300, 3700),
        (HELD_AFTER, 3700, 4000),  # held after the work ended
    ]
    assert [(m.name, m.t - T0) for m in line.marks] == [("checkpoint", 2000), ("released", 4000)]


def test_a_node_whose_run_has_no_end_runs_until_now() -> None:
    usage = NodeUsage(job_id="j", instance_id="i-1").with_event(T0 + 100, "started")
    line = timeline(job(released_at=None), [usage], now=T0 + 500)
    assert line.spans[-1].phase == RUNNING and line.spans[-1].end == T0 + 500


def png_size(raw: bytes) -> tuple[int, int]:
    assert raw[:8] == b"\x89PNG\r\n\x1a\n"
    length, kind = struct.unpack(">I4s", raw[8:16])
    assert (
        kind == b"IHDR"
        and zlib.crc32(raw[12 : 16 + length])
        == struct.unpack(">I", raw[16 + length : 20 + length])[0]
    )
    width, height = struct.unpack(">II", raw[16:24])
    return width, height


def test_the_png_is_a_valid_image_whose_pixels_are_where_they_were_drawn() -> None:
    canvas = Canvas(4, 3)
    canvas.line(0, 0, 3, 0, (255, 0, 0))
    raw = canvas.png()
    assert png_size(raw) == (4, 3)
    idat = raw.index(b"IDAT")
    (length,) = struct.unpack(">I", raw[idat - 4 : idat])
    pixels = zlib.decompress(raw[idat + 4 : idat + 4 + length])
    assert pixels[: 1 + 12] == b"\x00" + b"\xff\x00\x00" * 4  # filter byte, then red
    assert pixels[13:26] == b"\x00" + b"\xff" * 12  # the next row stays white


def test_the_page_escapes_what_the_nodes_say_and_shows_both_images(tmp_path: Path) -> None:
    files = write_report(job(), [node(HOSTILE)], tmp_path, now=T0 + 9999)
    assert {f.name for f in files} == {"index.html", "usage.png", "timeline.png"}
    page = (tmp_path / "index.html").read_text()
    assert "<script>" not in page and "&lt;script&gt;" in page
    assert png_size((tmp_path / "usage.png").read_bytes())[0] == 960
    assert "59.0 %" in page  # the peak GPU utilization
