"""The job's credentials, served by the agent on the host the way ECS serves a task's.

The agent assumes the job role (infra/constructs/job_role.py) with the instance role, tagging
the session with the job and its team (domain/tenancy.py), and serves the session's keys on the
loopback at a path only the container is told, behind a token only the container is told: the
container's SDK reads `AWS_CONTAINER_CREDENTIALS_FULL_URI` and sends
`AWS_CONTAINER_AUTHORIZATION_TOKEN` as its `Authorization` header, and takes `AccessKeyId`,
`SecretAccessKey`, `Token` and `Expiration` from the JSON answer (botocore's ContainerProvider:
an http URI must be a loopback or the ECS/EKS link-local address). The session is renewed when
less than `RENEWAL_MARGIN_SECONDS` of it is left, so an SDK that caches the keys until shortly
before `Expiration` never holds expired ones.
"""

from __future__ import annotations

import hmac
import json
import secrets
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from contextlib import AbstractContextManager, contextmanager
from datetime import datetime
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from gpufleet.agent.node import RunManifest
from gpufleet.domain.tenancy import session_name, session_tags

# botocore's container provider: where the credentials are, and the token it sends with them.
FULL_URI_VARIABLE = "AWS_CONTAINER_CREDENTIALS_FULL_URI"
TOKEN_VARIABLE = "AWS_CONTAINER_AUTHORIZATION_TOKEN"  # noqa: S105 - a variable's name
# A session is renewed once less than this is left of it (botocore refreshes 15 minutes before
# expiry at the latest; an answer must outlast that).
RENEWAL_MARGIN_SECONDS = 1200
SESSION_SECONDS = 3600
LOOPBACK = "127.0.0.1"


class JobSession:
    """The job role's session for one job, renewed before it ends (`clock`: epoch seconds)."""

    def __init__(
        self,
        sts: Any,
        role_arn: str,
        job_id: str,
        team: str,
        clock: Callable[[], float],
    ) -> None:
        self._sts = sts
        self._role_arn = role_arn
        self._job_id = job_id
        self._team = team
        self._clock = clock
        self._lock = threading.Lock()
        self._current: dict[str, str] | None = None
        self._expires_at = 0.0

    def credentials(self) -> dict[str, str]:
        """The session's keys as the container credentials endpoint answers them."""
        with self._lock:
            if self._current is None or self._clock() >= self._expires_at - RENEWAL_MARGIN_SECONDS:
                answer = self._sts.assume_role(
                    RoleArn=self._role_arn,
                    RoleSessionName=session_name(self._job_id),
                    DurationSeconds=SESSION_SECONDS,
                    Tags=session_tags(self._job_id, self._team),
                )["Credentials"]
                expiration: datetime = answer["Expiration"]
                self._expires_at = expiration.timestamp()
                self._current = {
                    "AccessKeyId": answer["AccessKeyId"],
                    "SecretAccessKey": answer["SecretAccessKey"],
                    "Token": answer["SessionToken"],
                    "Expiration": expiration.strftime("%Y-%m-%dT%H:%M:%SZ"),
                }
            return dict(self._current)


def _handler(session: JobSession, path: str, token: str) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            given = self.headers.get("Authorization", "")
            if self.path != path or not hmac.compare_digest(given, token):
                self._answer(HTTPStatus.FORBIDDEN, {"message": "not this job's endpoint"})
                return
            try:
                self._answer(HTTPStatus.OK, session.credentials())
            except Exception as exc:
                self._answer(HTTPStatus.SERVICE_UNAVAILABLE, {"message": type(exc).__name__})

        def _answer(self, status: HTTPStatus, body: Mapping[str, str]) -> None:
            raw = json.dumps(body).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(raw)))
            self.end_headers()
            self.wfile.write(raw)

        def log_message(self, *_: Any) -> None:
            """No access log: the agent's journal is not the place for requests."""

    return Handler


def job_credentials(
    manifest: RunManifest, *, sts: Any, role_arn: str
) -> AbstractContextManager[dict[str, str]]:
    """The endpoint of the job's own session while its container runs (DockerRuntime's
    `credentials`)."""
    session = JobSession(sts, role_arn, manifest.job_id, manifest.team, clock=time.time)
    return credentials_endpoint(session)


@contextmanager
def credentials_endpoint(session: JobSession) -> Iterator[dict[str, str]]:
    """Serve `session` on the loopback while the block runs; yields the container's
    environment for it (an unguessable path and token, new for each run)."""
    path = f"/gpufleet/{secrets.token_urlsafe(16)}"
    token = secrets.token_urlsafe(32)
    server = ThreadingHTTPServer((LOOPBACK, 0), _handler(session, path, token))
    thread = threading.Thread(target=server.serve_forever, name="credentials", daemon=True)
    thread.start()
    try:
        port = server.server_address[1]
        yield {FULL_URI_VARIABLE: f"http://{LOOPBACK}:{port}{path}", TOKEN_VARIABLE: token}
    finally:
        server.shutdown()
        server.server_close()
        thread.join()
