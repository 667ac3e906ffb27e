"""The job's credentials at the container credentials endpoint, read by botocore's own
ContainerProvider as the container's SDK reads them."""

from __future__ import annotations

import urllib.error
import urllib.request
from datetime import UTC, datetime
from typing import Any

import pytest
from botocore.credentials import ContainerProvider
from botocore.exceptions import CredentialRetrievalError
from botocore.utils import ContainerMetadataFetcher

from gpufleet.agent.credentials import (
    FULL_URI_VARIABLE,
    RENEWAL_MARGIN_SECONDS,
    TOKEN_VARIABLE,
    JobSession,
    credentials_endpoint,
)
from gpufleet.domain.tenancy import JOB_TAG, TEAM_TAG

JOB = "j-0123456789abcdef0123"
ROLE = "arn:aws:iam::123456789012:role/gpufleet-job"
START = 1_800_000_000.0


class FakeSts:
    """STS's AssumeRole: a new key each time, expiring an hour after the clock."""

    def __init__(self, clock: list[float]) -> None:
        self.calls: list[dict[str, Any]] = []
        self._clock = clock

    def assume_role(self, **params: Any) -> dict[str, Any]:
        self.calls.append(params)
        n = len(self.calls)
        return {
            "Credentials": {
                "AccessKeyId": f"ASIA{n:016d}",
                "SecretAccessKey": f"secret-{n}",
                "SessionToken": f"token-{n}",
                "Expiration": datetime.fromtimestamp(
                    self._clock[0] + params["DurationSeconds"], UTC
                ),
            }
        }


def _sdk(environ: dict[str, str]) -> ContainerProvider:
    """botocore's provider as a container's SDK has it, without its waits between retries."""
    return ContainerProvider(
        environ=environ, fetcher=ContainerMetadataFetcher(sleep=lambda _: None)
    )


@pytest.fixture
def clock() -> list[float]:
    return [START]


@pytest.fixture
def sts(clock: list[float]) -> FakeSts:
    return FakeSts(clock)


@pytest.fixture
def session(sts: FakeSts, clock: list[float]) -> JobSession:
    return JobSession(sts, ROLE, JOB, "vision", clock=lambda: clock[0])


def test_the_container_sdk_reads_the_jobs_session(session: JobSession, sts: FakeSts) -> None:
    with credentials_endpoint(session) as environment:
        assert environment[FULL_URI_VARIABLE].startswith("http://127.0.0.1:")
        credentials = _sdk(environment).load()
        frozen = credentials.get_frozen_credentials()
    assert (frozen.access_key, frozen.secret_key, frozen.token) == (
        "ASIA0000000000000001",
        "secret-1",
        "token-1",
    )
    [call] = sts.calls
    assert call["RoleArn"] == ROLE
    assert call["RoleSessionName"] == f"gpufleet-{JOB}"
    assert call["Tags"] == [
        {"Key": JOB_TAG, "Value": JOB},
        {"Key": TEAM_TAG, "Value": "vision"},
    ]


def test_a_request_without_the_token_gets_nothing(session: JobSession, sts: FakeSts) -> None:
    with credentials_endpoint(session) as environment:
        wrong = {**environment, TOKEN_VARIABLE: "guessed"}
        with pytest.raises(CredentialRetrievalError):
            _sdk(wrong).load()
        other_path = environment[FULL_URI_VARIABLE].rsplit("/", 1)[0] + "/other"
        request = urllib.request.Request(
            other_path, headers={"Authorization": environment[TOKEN_VARIABLE]}
        )
        with pytest.raises(urllib.error.HTTPError) as refused:
            urllib.request.urlopen(request, timeout=5)
    assert refused.value.code == 403
    assert sts.calls == []  # no session was opened for them


def test_the_session_is_renewed_before_it_expires(
    session: JobSession, sts: FakeSts, clock: list[float]
) -> None:
    first = session.credentials()
    clock[0] += 3600 - RENEWAL_MARGIN_SECONDS - 1
    assert session.credentials() == first
    assert len(sts.calls) == 1
    clock[0] += 1
    renewed = session.credentials()
    assert renewed["AccessKeyId"] != first["AccessKeyId"]
    assert len(sts.calls) == 2
    # What the SDK is told outlasts its own refresh window (15 minutes before expiry).
    expires = datetime.strptime(renewed["Expiration"], "%Y-%m-%dT%H:%M:%SZ").replace(tzinfo=UTC)
    assert expires.timestamp() - clock[0] > 15 * 60


def test_the_endpoint_is_gone_after_the_run(session: JobSession) -> None:
    with credentials_endpoint(session) as environment:
        pass
    with pytest.raises(CredentialRetrievalError):
        _sdk(environment).load()
