"""Job records and their usage in a folder, in the stack's own shapes: what `gpufleet simulate
--records DIR` writes and `gpufleet review --records DIR` reads (the `JobStore.list_jobs` and
`UsageReader` ports the review reads the stack through).

    DIR/export.json                        # {"v": 1, "region": ..., "start": ..., "end": ...}
    DIR/jobs.jsonl                         # one {"Item": <the job's DynamoDB item>} a line
    DIR/runs/<job>/usage/<instance>.json   # each run's node usage, as in the intake bucket

A line of `jobs.jsonl` is what a DynamoDB export (DYNAMODB_JSON) holds for the jobs table: the
job store's own item (`adapters/aws/job_store.job_to_item`, read back by `item_to_job`). The
usage documents are the node agent's (`domain/usage_layout.py`) at their keys in the intake
bucket (`runs/<job>/usage/<instance>.json`). `export.json` says the stack's region and the
window the records cover (epoch seconds), which the review counts back from.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import TypeVar

from gpufleet.adapters.aws.job_store import item_to_job, job_to_item
from gpufleet.domain.job import Job, JobStatus
from gpufleet.domain.usage_layout import (
    NodeSummary,
    NodeUsage,
    UsageLayoutError,
    usage_key,
    usage_prefix,
)
from gpufleet.errors import RefusedInput
from gpufleet.topology import RUNS_PREFIX

EXPORT_VERSION = 1
EXPORT = "export.json"
JOBS = "jobs.jsonl"

Read = TypeVar("Read", NodeUsage, NodeSummary)


class RecordsError(RefusedInput):
    """The folder holds no records in this layout."""


@dataclass(frozen=True)
class Export:
    region: str
    start: float  # epoch seconds: the window the records cover
    end: float


def write_records(
    folder: Path, export: Export, jobs: Iterable[Job], usage: Iterable[NodeUsage]
) -> int:
    """Write the records and usage documents into `folder` (made if need be; a previous
    export's records replaced); returns how many jobs it wrote."""
    folder.mkdir(parents=True, exist_ok=True)
    written = 0
    with (folder / JOBS).open("w", encoding="utf-8") as out:
        for job in jobs:
            out.write(json.dumps({"Item": job_to_item(job)}, separators=(",", ":")) + "\n")
            written += 1
    made: set[Path] = set()
    for node in usage:
        path = folder / usage_key(RUNS_PREFIX, node.job_id, node.instance_id)
        if path.parent not in made:
            path.parent.mkdir(parents=True, exist_ok=True)
            made.add(path.parent)
        path.write_bytes(node.to_json())
    document = {"v": EXPORT_VERSION, "region": export.region, "start": export.start}
    (folder / EXPORT).write_text(json.dumps({**document, "end": export.end}) + "\n")
    return written


class RecordsFolder:
    """The records of a folder `write_records` wrote, read as the stack's are."""

    def __init__(self, folder: Path) -> None:
        self._folder = folder
        try:
            document = json.loads((folder / EXPORT).read_text(encoding="utf-8"))
            if document.get("v") != EXPORT_VERSION:
                raise ValueError(f"not version {EXPORT_VERSION}")
            self.export = Export(
                str(document["region"]), float(document["start"]), float(document["end"])
            )
        except (OSError, ValueError, KeyError, TypeError, AttributeError) as exc:
            raise RecordsError(f"{folder}: no job records ({folder / EXPORT}: {exc})") from None

    def list_jobs(self, status: JobStatus | None = None, limit: int = 1000) -> list[Job]:
        """Up to `limit` jobs (of `status`), newest submission first, as the job store lists."""
        found: list[Job] = []
        try:
            with (self._folder / JOBS).open(encoding="utf-8") as lines:
                for number, line in enumerate(lines, start=1):
                    try:
                        job = item_to_job(json.loads(line)["Item"])
                    except (ValueError, KeyError, TypeError) as exc:
                        raise RecordsError(f"{self._folder / JOBS}:{number}: {exc}") from None
                    if status is None or job.status is status:
                        found.append(job)
        except OSError as exc:
            raise RecordsError(f"{self._folder}: {exc}") from None
        found.sort(key=lambda job: (-job.created_at, job.job_id))
        return found[:limit]

    def of_job(self, job_id: str) -> list[NodeUsage]:
        return self._read(job_id, NodeUsage.from_json)

    def summaries_of_job(self, job_id: str) -> list[NodeSummary]:
        return self._read(job_id, NodeSummary.from_json)

    def _read(self, job_id: str, parse: Callable[[bytes], Read]) -> list[Read]:
        """Every node's usage document of the job, by instance id; one not in the layout is
        left out (as the S3 reader does)."""
        found: list[Read] = []
        folder = self._folder / usage_prefix(RUNS_PREFIX, job_id)
        try:
            names = os.listdir(folder)  # one call a job: a month's review lists tens of thousands
        except OSError:
            return found
        for name in names:
            if not name.endswith(".json"):
                continue
            try:
                found.append(parse((folder / name).read_bytes()))
            except UsageLayoutError:
                continue
        return sorted(found, key=lambda usage: usage.instance_id)
