"""Each minute of a run on this node: GPU utilization and memory used per GPU (nvidia-smi),
host CPU and memory (/proc), kept in `runs/<job>/usage/<instance>.json` (layout:
`domain/usage_layout.py`).

Two seams, as the preparation has: nvidia-smi runs through a `CommandRunner` (an argv list,
no shell; the embedded account's nodes answer it with a fake nvidia-smi), /proc is read through
`read_text`. The object is written whole after every sample (about 1,440 PUTs a node and day)
and read back first, so a restarted agent adds to what it had written.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Protocol

from gpufleet.agent.prepare import CommandRunner
from gpufleet.domain.usage_layout import NodeUsage, Sample, usage_key
from gpufleet.topology import RUNS_PREFIX

NVIDIA_SMI_QUERY = (
    "nvidia-smi",
    "--query-gpu=index,utilization.gpu,memory.used,memory.total",
    "--format=csv,noheader,nounits",
)
KIB_PER_MIB = 1024


class UsageObjects(Protocol):
    """Where the usage document lives (S3 with the instance role)."""

    def fetch(self, key: str) -> bytes: ...

    def store(self, key: str, body: bytes) -> None: ...


def parse_nvidia_smi(stdout: str) -> list[tuple[float | None, float | None, float | None]]:
    """Each GPU's (utilization %, memory used MiB, memory total MiB), in index order; a field
    nvidia-smi cannot read ("[N/A]", "[Not Supported]") is None."""
    gpus: list[tuple[int, tuple[float | None, float | None, float | None]]] = []
    for line in stdout.splitlines():
        fields = [f.strip() for f in line.split(",")]
        if len(fields) != 4 or not fields[0].isdigit():
            continue
        util, used, total = (_reading(f) for f in fields[1:])
        gpus.append((int(fields[0]), (util, used, total)))
    return [values for _, values in sorted(gpus)]


def _reading(text: str) -> float | None:
    try:
        return float(text)
    except ValueError:
        return None


def cpu_times(proc_stat: str) -> tuple[int, int] | None:
    """(busy, total) jiffies of all CPUs from /proc/stat's first line (idle and iowait are not
    busy); None when the line is not there."""
    for line in proc_stat.splitlines():
        fields = line.split()
        if fields and fields[0] == "cpu":
            values = [int(v) for v in fields[1:] if v.isdigit()]
            idle = sum(values[3:5])
            return sum(values) - idle, sum(values)
    return None


def memory_mib(meminfo: str) -> tuple[float, float] | None:
    """(used, total) MiB from /proc/meminfo: total less available."""
    values: dict[str, int] = {}
    for line in meminfo.splitlines():
        name, _, rest = line.partition(":")
        parts = rest.split()
        if parts and parts[0].isdigit():
            values[name] = int(parts[0])
    if "MemTotal" not in values or "MemAvailable" not in values:
        return None
    total = values["MemTotal"] / KIB_PER_MIB
    return total - values["MemAvailable"] / KIB_PER_MIB, total


def _read_text(path: str) -> str:
    return Path(path).read_text()


class UsageSampler:
    """One reading of the node now. CPU use is over the time since the previous reading (the
    first reading has none)."""

    def __init__(self, runner: CommandRunner, read_text: Callable[[str], str] = _read_text) -> None:
        self._runner = runner
        self._read_text = read_text
        self._cpu: tuple[int, int] | None = None
        self.gpu_mem_total_mib: tuple[float, ...] = ()
        self.host_mem_total_mib: float | None = None

    def sample(self, t: float) -> Sample:
        completed = self._runner(NVIDIA_SMI_QUERY)
        gpus = parse_nvidia_smi(completed.stdout) if completed.returncode == 0 else []
        if gpus and all(total is not None for _, _, total in gpus):
            self.gpu_mem_total_mib = tuple(float(total or 0) for _, _, total in gpus)
        cpu_percent = None
        try:
            times = cpu_times(self._read_text("/proc/stat"))
        except OSError:
            times = None
        if times is not None and self._cpu is not None and times[1] > self._cpu[1]:
            busy, total = times[0] - self._cpu[0], times[1] - self._cpu[1]
            cpu_percent = 100.0 * busy / total
        self._cpu = times
        try:
            memory = memory_mib(self._read_text("/proc/meminfo"))
        except OSError:
            memory = None
        if memory is not None:
            self.host_mem_total_mib = memory[1]
        return Sample(
            t=t,
            gpu_util=tuple(util for util, _, _ in gpus),
            gpu_mem_mib=tuple(used for _, used, _ in gpus),
            cpu_percent=cpu_percent,
            mem_mib=None if memory is None else memory[0],
        )


class UsageRecorder:
    """The node's usage document for one job: samples and timeline marks added, and written
    after each. Thread-safe (the sampling thread and the control watch both add to it)."""

    def __init__(
        self,
        sampler: UsageSampler,
        objects: UsageObjects,
        job_id: str,
        instance_id: str,
        interval_seconds: float,
    ) -> None:
        self._sampler = sampler
        self._objects = objects
        self._key = usage_key(RUNS_PREFIX, job_id, instance_id)
        self._lock = threading.Lock()
        self._usage = self._earlier(job_id, instance_id, interval_seconds)

    def _earlier(self, job_id: str, instance_id: str, interval: float) -> NodeUsage:
        """What this node wrote before (a restarted agent, a stage before), or a new document."""
        try:
            return NodeUsage.from_json(self._objects.fetch(self._key))
        except Exception:  # not there yet, or not this layout: start anew
            return NodeUsage(job_id=job_id, instance_id=instance_id, interval_seconds=interval)

    @property
    def usage(self) -> NodeUsage:
        return self._usage

    def sample(self, t: float) -> None:
        reading = self._sampler.sample(t)
        with self._lock:
            self._usage = replace(
                self._usage.with_sample(reading),
                gpu_mem_total_mib=self._sampler.gpu_mem_total_mib,
                host_mem_total_mib=self._sampler.host_mem_total_mib,
            )
        self.write()

    def mark(self, t: float, event: str) -> None:
        with self._lock:
            self._usage = self._usage.with_event(t, event)
        self.write()

    def write(self) -> None:
        with self._lock:
            body = self._usage.to_json()
        self._objects.store(self._key, body)
