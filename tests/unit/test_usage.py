"""Each run's usage, kept: the agent's samples (nvidia-smi, /proc) and their layout in S3."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

import pytest

from gpufleet.agent.node import NodeAgent
from gpufleet.agent.prepare import Completed
from gpufleet.agent.usage import (
    NVIDIA_SMI_QUERY,
    UsageRecorder,
    UsageSampler,
    cpu_times,
    memory_mib,
    parse_nvidia_smi,
)
from gpufleet.domain.usage_layout import (
    MAX_SAMPLES,
    NodeSummary,
    NodeUsage,
    Sample,
    UsageLayoutError,
    combined,
    summarize,
    usage_key,
)
from tests.manual_clock import ManualClock
from tests.node_keys import NODE_KEY_DOCUMENT, is_node_key
from tests.unit.test_agent import (
    JOB,
    RUN,
    RUN_KEY,
    RUN_THREADS,
    FakeIdentity,
    FakeReporter,
    SlowRuntime,
    running,
    step,
)

SMI = "0, 97, 70211, 81559\n1, 12, [N/A], 81559\n"
STAT_1 = "cpu  100 0 100 700 100 0 0 0 0 0\ncpu0 1 2 3 4\n"
STAT_2 = "cpu  400 0 200 900 100 0 0 0 0 0\n"  # +400 busy of +600 jiffies
MEMINFO = "MemTotal:       2097152 kB\nMemFree:  1 kB\nMemAvailable:   1048576 kB\n"


def test_nvidia_smi_is_read_per_gpu_and_a_field_it_cannot_read_is_none() -> None:
    assert parse_nvidia_smi(SMI) == [(97.0, 70211.0, 81559.0), (12.0, None, 81559.0)]
    assert parse_nvidia_smi("NVIDIA-SMI has failed\n") == []


def test_host_cpu_is_busy_over_total_jiffies_and_memory_is_total_less_available() -> None:
    assert cpu_times(STAT_1) == (200, 1000)  # idle and iowait are not busy
    assert memory_mib(MEMINFO) == (1024.0, 2048.0)
    assert memory_mib("MemTotal: 5 kB\n") is None


@dataclass
class FakeNode:
    """nvidia-smi behind the runner seam, /proc behind read_text."""

    stats: list[str] = field(default_factory=lambda: [STAT_1, STAT_2])
    argvs: list[tuple[str, ...]] = field(default_factory=list)

    def __call__(self, argv: Any, stdin: str | None = None) -> Completed:
        self.argvs.append(tuple(argv))
        return Completed(0, SMI)

    def read_text(self, path: str) -> str:
        if path == "/proc/stat":
            return self.stats.pop(0) if len(self.stats) > 1 else self.stats[0]
        return MEMINFO


def test_a_sample_reads_each_gpu_and_cpu_use_since_the_previous_sample() -> None:
    node = FakeNode()
    sampler = UsageSampler(node, node.read_text)
    first, second = sampler.sample(100.0), sampler.sample(160.0)
    assert node.argvs == [NVIDIA_SMI_QUERY, NVIDIA_SMI_QUERY]  # an argv list: no shell
    assert first.cpu_percent is None  # nothing to compare with yet
    assert second.cpu_percent == pytest.approx(400 / 600 * 100)
    assert second.gpu_util == (97.0, 12.0) and second.gpu_mem_mib == (70211.0, None)
    assert second.mem_mib == 1024.0
    assert sampler.gpu_mem_total_mib == (81559.0, 81559.0) and sampler.host_mem_total_mib == 2048.0


def test_a_node_without_nvidia_smi_still_samples_its_host() -> None:
    sampler = UsageSampler(
        lambda argv, stdin=None: Completed(127, "", "not found"), FakeNode().read_text
    )
    sample = sampler.sample(1.0)
    assert sample.gpu_util == () and sample.mem_mib == 1024.0


def usage(samples: int = 3) -> NodeUsage:
    document = NodeUsage(job_id=JOB, instance_id="i-1")
    for n in range(samples):
        document = document.with_sample(
            Sample(
                t=1000.0 + 60 * n,
                gpu_util=(90.0 + n, 4.0),
                gpu_mem_mib=(100.0 * n, 50.0),
                cpu_percent=10.0,
                mem_mib=None,
            )
        )
    return document.with_event(1000.0, "started")


def test_the_document_round_trips_compactly_in_whole_numbers() -> None:
    document = usage()
    raw = document.to_json()
    assert b" " not in raw  # compact separators
    assert json.loads(raw)["t"] == [0, 60, 120]
    again = NodeUsage.from_json(raw)
    assert again.samples == document.samples and again.events == ((1000.0, "started"),)


@pytest.mark.parametrize(
    "raw",
    [
        b"not json",
        b"[]",
        b'{"v": 2}',
        json.dumps({**json.loads(usage().to_json()), "cpu": [1]}).encode(),  # ragged columns
        json.dumps({**json.loads(usage().to_json()), "t0": "soon"}).encode(),
        json.dumps({**json.loads(usage().to_json()), "t": [0, 60, True]}).encode(),
        usage().to_json().replace(b'"t":[0,', b'"t":[1e400,'),  # a time past a float's range
        json.dumps({**json.loads(usage().to_json()), "gpu_util": [[1], 5, [2]]}).encode(),
        json.dumps({**json.loads(usage().to_json()), "gpu_mem": [[1], ["x"], [2]]}).encode(),
        json.dumps({**json.loads(usage().to_json()), "cpu": [1, False, 2]}).encode(),
    ],
)
def test_a_document_of_another_layout_is_refused_clearly(raw: bytes) -> None:
    with pytest.raises(UsageLayoutError):
        NodeUsage.from_json(raw)
    with pytest.raises(UsageLayoutError):
        NodeSummary.from_json(raw)  # what the review reads: checked alike


def test_an_unknown_timeline_mark_is_refused() -> None:
    with pytest.raises(UsageLayoutError, match="unknown usage event"):
        usage().with_event(1.0, "rm -rf")


def test_a_long_run_is_merged_pairwise_keeping_its_peaks() -> None:
    document = NodeUsage(job_id=JOB, instance_id="i-1")
    for n in range(MAX_SAMPLES + 1):
        document = document.with_sample(Sample(t=float(n * 60), gpu_util=(float(n % 100),)))
    assert len(document.samples) == (MAX_SAMPLES + 2) // 2
    assert document.interval_seconds == 120.0
    assert document.samples[0].gpu_util == (1.0,)  # max of 0 and 1
    assert summarize([document]).gpu_util_percent.peak == 99.0


def test_the_summary_gives_peaks_means_and_the_idle_share() -> None:
    summary = summarize([usage()]).as_dict()
    assert summary["gpu_util_percent_peak"] == 92.0
    assert summary["gpu_util_percent_mean"] == pytest.approx((90 + 91 + 92 + 3 * 4) / 6, abs=0.1)
    assert summary["gpu_mem_mib_peak"] == 200.0  # the fullest GPU's
    assert summary["gpu_idle_fraction"] == 0.5  # the second GPU, at 4 %
    assert summary["host_mem_mib_peak"] is None  # never read: not made up


def test_a_summary_read_from_the_document_is_the_summary_of_its_samples() -> None:
    first, second = usage(), usage().with_sample(Sample(t=1180.0, gpu_util=(1.0, None)))
    read = [NodeSummary.from_json(n.to_json()) for n in (first, second)]
    assert read[0].usage == summarize([first]) and read[0].events == first.events
    both = combined(r.usage for r in read)
    assert both == summarize([first, second])
    assert both.nodes == 2 and both.samples == 7 and both.gpu_util_percent.peak == 92.0


@dataclass
class FakeObjects:
    documents: dict[str, bytes] = field(default_factory=dict)
    writes: int = 0

    def fetch(self, key: str) -> bytes:
        if is_node_key(key) and key not in self.documents:
            return NODE_KEY_DOCUMENT  # every run has one
        return self.documents[key]

    def store(self, key: str, body: bytes) -> None:
        self.writes += 1
        self.documents[key] = body


def test_the_agent_samples_each_interval_and_marks_the_runs_timeline() -> None:
    clock, node = ManualClock(), FakeNode()
    objects = FakeObjects({RUN_KEY: RUN})
    wall = iter(float(1_000_000 + n) for n in range(1000))
    agent = NodeAgent(
        FakeIdentity(),
        objects,
        FakeReporter(),
        SlowRuntime(clock, 200.0),
        clock=clock,
        usage=lambda job, instance: UsageRecorder(
            UsageSampler(node, node.read_text), objects, job, instance, interval_seconds=60.0
        ),
        usage_seconds=60.0,
        wall_clock=lambda: next(wall),
    )
    result = running(agent)
    step(clock, 200.0, by=10.0, threads=RUN_THREADS + 1)  # and the usage sampler
    assert result().exit_code == 0
    document = NodeUsage.from_json(objects.documents[usage_key("runs/", JOB, "i-1")])
    assert len(document.samples) == 3  # at 60, 120 and 180 s
    assert [name for _, name in document.events] == ["started", "finished"]
    assert document.gpu_mem_total_mib == (81559.0, 81559.0)
    assert objects.writes == 5  # after each sample and each mark


def test_a_restarted_agent_adds_to_the_usage_it_had_written() -> None:
    objects = FakeObjects({usage_key("runs/", JOB, "i-1"): usage().to_json()})
    node = FakeNode()
    recorder = UsageRecorder(UsageSampler(node, node.read_text), objects, JOB, "i-1", 60.0)
    recorder.sample(2000.0)
    assert len(recorder.usage.samples) == 4


def test_usage_that_cannot_be_written_never_fails_the_run() -> None:
    class Refusing(FakeObjects):
        def store(self, key: str, body: bytes) -> None:
            raise PermissionError("AccessDenied")

    clock, node = ManualClock(), FakeNode()
    objects = Refusing({RUN_KEY: RUN})
    agent = NodeAgent(
        FakeIdentity(),
        objects,
        FakeReporter(),
        SlowRuntime(clock, 100.0),
        clock=clock,
        usage=lambda job, instance: UsageRecorder(
            UsageSampler(node, node.read_text), objects, job, instance, 60.0
        ),
    )
    result = running(agent)
    step(clock, 100.0, by=10.0, threads=RUN_THREADS + 1)
    assert result().exit_code == 0
