"""The reconciler's release rules (domain/release.py): which instances must end."""

from __future__ import annotations

from gpufleet.domain.job import Job, JobStatus
from gpufleet.domain.release import instance_gone, why_orphaned
from tests.unit.test_settlement import PLACEMENT as SETTLED_PLACEMENT
from tests.unit.test_settlement import running

GRACE, BOOT = 120.0, 600.0
PLACEMENT = SETTLED_PLACEMENT.model_copy(update={"instance_ids": ["i-1", "i-2"]})


def job(status: JobStatus = JobStatus.RUNNING, **fields: object) -> Job:
    return running(status=status, **{"placement": PLACEMENT, **fields})


def orphaned(instance_id: str, age: float, held_by: Job | None, tagged: bool = True) -> str | None:
    return why_orphaned(
        instance_id,
        age,
        held_by,
        tagged=tagged,
        grace_seconds=GRACE,
        boot_allowance_seconds=BOOT,
    )


def test_an_instance_a_live_job_holds_runs_on() -> None:
    assert orphaned("i-1", 5000, job()) is None
    assert orphaned("i-2", BOOT - 1, job(JobStatus.LAUNCHING)) is None


def test_a_young_instance_is_never_judged_a_launch_may_be_recording_it() -> None:
    assert orphaned("i-9", GRACE - 1, None, tagged=False) is None


def test_every_way_an_instance_is_nobodys_names_why() -> None:
    assert orphaned("i-1", GRACE, None, tagged=False) == "no job tag"
    assert orphaned("i-1", GRACE, None) == "its job does not exist"
    assert orphaned("i-1", GRACE, job(JobStatus.SUCCEEDED)) == "its job is SUCCEEDED"
    assert orphaned("i-9", GRACE, job()) == "its job does not hold it (left over from a launch)"
    assert orphaned("i-1", GRACE, job(placement=None)).startswith("its job does not hold it")
    assert orphaned("i-1", BOOT + 1, job(JobStatus.LAUNCHING)) == "its node never reported in"


def test_a_held_instance_that_stopped_running_ends_the_run_until_released() -> None:
    now = PLACEMENT.launched_at + GRACE
    assert instance_gone(job(), {"i-1"}, now, grace_seconds=GRACE) == "i-2"
    assert instance_gone(job(), {"i-1", "i-2"}, now, grace_seconds=GRACE) is None
    # EC2 may not list a fresh launch yet; a released run is the workflow's already.
    assert instance_gone(job(), set(), now - 1, grace_seconds=GRACE) is None
    assert instance_gone(job(released_at=now), set(), now, grace_seconds=GRACE) is None
