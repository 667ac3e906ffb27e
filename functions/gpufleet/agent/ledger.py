"""What the node agent has run on this instance, kept on its local disk across restarts.

systemd restarts the agent when the agent itself fails (a network error at boot, an AWS API
that kept failing). A restarted agent must not run the job again: the control plane launched
the run once, and a second run on the same node (after a failure, or half way through a first)
would do the work twice and report twice. So the agent notes each run here before it starts
the container and its finish report once the container ended; a restart that finds a run
noted sends its finish report again (the first may never have left) and runs nothing.

The file lives on the instance's root volume, which is deleted with the instance: one
instance, one ledger. Writes replace the whole file atomically (write, fsync, rename). Without a
directory the ledger is kept in memory (an agent that is never restarted: the emulator's).
"""

from __future__ import annotations

import json
import os
import tempfile
import threading
from collections.abc import Mapping
from pathlib import Path
from typing import Any

LEDGER_FILE = "runs.json"
STARTED = "started"
FINISHED = "finished"


class RunLedger:
    """Runs by key (`run_key`): started, or finished with the report that says how."""

    def __init__(self, directory: Path | None = None) -> None:
        self._path = None if directory is None else directory / LEDGER_FILE
        self._memory: dict[str, Any] = {}
        self._lock = threading.Lock()

    def started(self, key: str) -> bool:
        return key in self._read()

    def finish_report(self, key: str) -> dict[str, Any] | None:
        """The finish report of a run that ended (None: it did not, or never started)."""
        entry = self._read().get(key)
        if not isinstance(entry, Mapping) or entry.get("phase") != FINISHED:
            return None
        report = entry.get("report")
        return dict(report) if isinstance(report, Mapping) else None

    def note_started(self, key: str) -> None:
        self._write(key, {"phase": STARTED})

    def note_finished(self, key: str, report: Mapping[str, Any]) -> None:
        self._write(key, {"phase": FINISHED, "report": dict(report)})

    def _read(self) -> dict[str, Any]:
        if self._path is None:
            return dict(self._memory)
        try:
            document = json.loads(self._path.read_text(encoding="utf-8"))
        except FileNotFoundError:
            return {}
        return document if isinstance(document, dict) else {}

    def _write(self, key: str, entry: Mapping[str, Any]) -> None:
        with self._lock:
            document = {**self._read(), key: dict(entry)}
            if self._path is None:
                self._memory = document
                return
            self._path.parent.mkdir(parents=True, exist_ok=True)
            handle, temporary = tempfile.mkstemp(dir=self._path.parent, prefix=".runs-")
            try:
                with os.fdopen(handle, "w", encoding="utf-8") as out:
                    json.dump(document, out)
                    out.flush()
                    os.fsync(out.fileno())
                os.replace(temporary, self._path)
            except BaseException:
                Path(temporary).unlink(missing_ok=True)
                raise


def run_key(job_id: str, stage: str | None) -> str:
    """One run of the control plane on one node: a job (its stage) on this instance. A new
    launch of the job is on new instances, and each stage that reuses an instance is its own
    run."""
    return f"{job_id}/{stage}" if stage else job_id


def manifest_key(job_id: str) -> str:
    """The entry of a job whose run manifest could not be read: reported once."""
    return f"{job_id}#manifest"
