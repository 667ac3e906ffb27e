"""A launched job always has its alarms: a Launch that died creating them is retried whole."""

from __future__ import annotations

from dataclasses import dataclass
from typing import cast

import pytest

from gpufleet.adapters.local.memory import FakeFleet, InMemoryObjects, RecordingAlarms
from gpufleet.domain.config import MetricPolicy
from gpufleet.domain.spec import JobSpec
from gpufleet.services.factory import build_lifecycle
from tests.helpers import SPEC_YAML, intake_for, local_ports, make_settings, plan_of


@dataclass
class AlarmsFailOnce(RecordingAlarms):
    """CloudWatch refuses the first PutMetricAlarm (a throttle, a Lambda timeout)."""

    failed: bool = False

    def create(self, job_id: str, spec: JobSpec, policy: MetricPolicy) -> None:
        if not self.failed:
            self.failed = True
            raise RuntimeError("PutMetricAlarm failed")
        super().create(job_id, spec, policy)


def test_a_launch_whose_alarms_failed_is_not_recorded_and_its_retry_creates_them() -> None:
    fleet = FakeFleet()
    ports = local_ports(fleet)
    alarms = AlarmsFailOnce()
    ports.alarms = alarms
    settings = make_settings()
    cast(InMemoryObjects, ports.objects).objects["jobs/a.yaml"] = SPEC_YAML
    job = intake_for(ports, settings).submit_object("jobs/a.yaml", "a", "a").job_id
    assert job is not None
    service, plan = build_lifecycle(ports, settings), plan_of(ports, job)
    with pytest.raises(RuntimeError, match="PutMetricAlarm"):
        service.launch(job, plan, step=0, attempt=0, task_token="run")
    assert ports.jobs.get(job).placement is None  # no placement without its alarms
    # The state machine retries the task.
    assert service.launch(job, plan, step=0, attempt=0, task_token="run") is None
    placement = ports.jobs.get(job).placement
    assert placement is not None and job in alarms.created
    # The fake fleet has no client tokens: the retry launched anew and the first call's
    # instance ended, so the job holds exactly what it recorded.
    assert {i for i, owner in fleet.live.items() if owner == job} == set(placement.instance_ids)
