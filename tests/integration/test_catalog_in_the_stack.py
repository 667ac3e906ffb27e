"""The daily CatalogRefresh on the embedded account, and the plans that follow it.

The refresh reads moto's EC2 (DescribeInstanceTypes, DescribeAvailabilityZones, and
DescribeSpotPriceHistory: a constant 0.00001 USD/hour for every type and zone) and the
emulator's Price List (`emulator.pricing`: the bundled on-demand prices), and writes the region's
catalog under `topology.CATALOG_KEY`. The next plan prices its offerings from it: a spot price
no bundled offering has.
"""

from __future__ import annotations

import json
from datetime import UTC, datetime
from typing import Any

from gpufleet import topology
from gpufleet.adapters.aws.job_store import DynamoJobStore
from gpufleet.domain.catalog import Catalog, load_bundled
from gpufleet.domain.planning import LaunchPlan
from gpufleet.emulator.account import Account
from tests.helpers import SPEC_YAML, jobs_from, wait_for

MOTO_SPOT = 0.00001


def _refresh(account: Account) -> dict[str, Any]:
    event = {"source": "aws.scheduler", "schedule": "CatalogRefreshSchedule"}
    response = account.client("lambda").invoke(
        FunctionName=account.function_arns[topology.CATALOG_REFRESH.construct_id],
        Payload=json.dumps(event).encode(),
    )
    assert "FunctionError" not in response, response["Payload"].read()
    result: dict[str, Any] = json.loads(response["Payload"].read())
    return result


def test_the_refresh_writes_the_regions_catalog_and_the_next_plan_uses_it(
    account: Account,
) -> None:
    result = _refresh(account)
    today = datetime.now(UTC).date().isoformat()
    assert (result["key"], result["generated"]) == (topology.CATALOG_KEY, today)
    body = account.client("s3").get_object(Bucket=account.bucket, Key=topology.CATALOG_KEY)
    refreshed = Catalog.from_document(json.loads(body["Body"].read()))
    assert refreshed.regions() == [account.region]
    bundled = load_bundled()
    on_demand = {
        o.instance_type.name: o.hourly_usd
        for o in refreshed.offerings(account.region)
        if o.capacity_type == "on-demand"
    }
    # The emulator's Price List answers with the bundled on-demand prices.
    assert on_demand["p5.48xlarge"] == next(
        o.hourly_usd
        for o in bundled.offerings(account.region)
        if o.instance_type.name == "p5.48xlarge" and o.capacity_type == "on-demand"
    )
    spot = {o.hourly_usd for o in refreshed.offerings(account.region) if o.capacity_type == "spot"}
    assert spot == {MOTO_SPOT}
    assert MOTO_SPOT not in {o.hourly_usd for o in bundled.offerings(account.region)}

    store = DynamoJobStore(
        account.client("dynamodb"), account.table_names[topology.JOBS_TABLE.construct_id]
    )
    account.client("s3").put_object(
        Bucket=account.bucket, Key="jobs/vision/priced.yaml", Body=SPEC_YAML
    )
    [job] = wait_for(lambda: jobs_from(store, f"s3://{account.bucket}/jobs/vision/priced.yaml"))
    sfn = account.client("stepfunctions")
    arn = account.state_machine_arns[topology.JOB_LIFECYCLE.construct_id]
    [execution] = wait_for(
        lambda: [
            e
            for e in sfn.list_executions(stateMachineArn=arn)["executions"]
            if e["name"] == job.job_id
        ]
    )
    state = json.loads(sfn.describe_execution(executionArn=execution["executionArn"])["input"])
    first = LaunchPlan.model_validate(state["plan"]).steps[0]
    assert first.capacity_type == "spot"
    assert {o.hourly_usd for o in first.overrides} == {MOTO_SPOT}
    calls = {
        (c.service, c.operation) for c in account.recorder.calls if c.function == "CatalogRefresh"
    }
    assert ("pricing", "GetProducts") in calls and ("s3", "PutObject") in calls
