"""The embedded account as a server: `gpufleet emulator`.

moto's ThreadedMotoServer answers AWS API calls over HTTP from the same in-process backends the
embedded account uses, so a call that arrives over HTTP goes through the same patches: an upload
to the intake bucket runs the real intake handler, which starts the real workflow, and so on. The
node simulator and the schedules (MetricWatch's among them) run beside it, so jobs go all the way to
the end. Any AWS client pointed at the endpoint (`gpufleet`, the AWS CLI, boto3) talks to it.

The emulator also publishes a CloudFormation stack named like the deployed one, with the same
outputs, so `gpufleet ... --stack GpuFleetStack` resolves against it just as against AWS.

It is private to the developer who started it (`PrivateEndpoint`). moto's server answers any
web page with CORS headers and lets anyone reset the account; here a request that carries
another site's `Origin`, or names a host other than this machine (DNS rebinding), is refused,
no CORS header is sent unless one origin is allowed (`cors_origin`), and moto's control
endpoints (`/moto-api/...`: reset, configuration, the data dump) need the token made at each
start, which only the environment it hands out holds (`GPUFLEET_EMULATOR_TOKEN`).
"""

from __future__ import annotations

import errno
import json
import logging
import os
import secrets
import socket
import threading
import warnings
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass

from gpufleet import topology
from gpufleet.domain.config import FleetConfig
from gpufleet.emulator import account_baseline
from gpufleet.emulator.account import Account, embedded_account
from gpufleet.emulator.nodes import AGENT_LOG_GROUP, NodeScenario, NodeSimulator
from gpufleet.emulator.patches import EMULATOR, acting_as
from gpufleet.emulator.private import ENV_TOKEN, PrivateEndpoint
from gpufleet.emulator.scheduler import ScheduleRunner
from gpufleet.errors import GpufleetError

# The name `cdk deploy` gives the stack, so that `--stack` reads the same against both.
STACK_NAME = "GpuFleetStack"
# Credentials for the emulator: any will do, and a user's real ones should never be sent to it.
_CREDENTIALS = {"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing"}


class PortTaken(GpufleetError, OSError):
    """Another program (often an emulator started earlier) listens on the address."""

    def __init__(self, host: str, port: int) -> None:
        super().__init__(
            errno.EADDRINUSE,
            f"{host}:{port} is already in use (another `gpufleet emulator`?): stop that one, "
            "or give --port (0: any free port)",
        )
        self.host, self.port = host, port


def listen(host: str, port: int) -> socket.socket:
    """A socket bound to `host:port` and listening, before anything else starts: a taken port
    is `PortTaken`, at once (werkzeug would print its own message and call sys.exit)."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    # As werkzeug's server does: a port this process (or a stopped emulator) left in TIME_WAIT
    # may be bound again; one another program listens on may not (SO_REUSEADDR on Linux).
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host, port))
        sock.listen(128)
    except OSError as exc:
        sock.close()
        if exc.errno == errno.EADDRINUSE:
            raise PortTaken(host, port) from None
        raise
    return sock


@dataclass(frozen=True)
class RunningEmulator:
    account: Account
    endpoint_url: str
    token: str

    def deployment(self) -> dict[str, str]:
        """The deployment variables a deployed stack's outputs would give."""
        return deployment(self.account)

    def environment(self) -> dict[str, str]:
        """What a shell exports to talk to the emulator, with `gpufleet` or any AWS client."""
        return {
            **self.deployment(),
            "AWS_ENDPOINT_URL": self.endpoint_url,
            "AWS_REGION": self.account.region,
            "AWS_DEFAULT_REGION": self.account.region,
            **_CREDENTIALS,
            ENV_TOKEN: self.token,
        }


def deployment(account: Account) -> dict[str, str]:
    """The deployment variables of the account's resources, as a deployed stack's outputs give
    them (the agent log group included)."""
    everything = {**account.environment(), topology.ENV_AGENT_LOG_GROUP: AGENT_LOG_GROUP}
    return {var: value for var in topology.STACK_OUTPUTS.values() if (value := everything.get(var))}


class _Server:
    """moto's server application, behind PrivateEndpoint, on a thread (as moto's
    ThreadedMotoServer runs it, with the middleware it has no place for)."""

    def __init__(
        self, listener: socket.socket, host: str, token: str, cors_origin: str | None
    ) -> None:
        from moto.moto_server.werkzeug_app import (
            DomainDispatcherApplication,
            MotoRequestHandler,
            create_backend_app,
        )
        from werkzeug.serving import make_server

        app = PrivateEndpoint(
            DomainDispatcherApplication(create_backend_app), token, host, cors_origin
        )
        # On the socket `listen` bound (its port, also when 0 was asked for).
        port = listener.getsockname()[1]
        self._server = make_server(
            host, port, app, threaded=True, request_handler=MotoRequestHandler, fd=listener.fileno()
        )
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)

    @property
    def endpoint_url(self) -> str:
        host = self._server.host  # as asked for; the port as bound (0: the one it got)
        shown = f"[{host}]" if ":" in host else host
        return f"http://{shown}:{self._server.port}"

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._server.shutdown()
        self._thread.join()
        self._server.server_close()


@contextmanager
def serve(
    host: str = "127.0.0.1",
    port: int = 5000,
    config: FleetConfig | None = None,
    nodes: NodeScenario | None = None,
    cors_origin: str | None = None,
) -> Iterator[RunningEmulator]:
    """Run the emulator on `host:port` (port 0: any free one) until the block ends, private
    to whoever holds the environment it hands out (PrivateEndpoint); `cors_origin` is the one
    web origin that may call it from a browser. A taken port raises `PortTaken` before the
    account is built."""
    listener = listen(host, port)
    # The emulator's own calls (handlers, nodes) go to the in-process backends, even if this
    # shell still exports the endpoint of an earlier emulator.
    saved = os.environ.get("AWS_IGNORE_CONFIGURED_ENDPOINT_URLS")
    os.environ["AWS_IGNORE_CONFIGURED_ENDPOINT_URLS"] = "true"
    # One line per request is noise next to what the emulator prints.
    logging.getLogger("werkzeug").setLevel(logging.WARNING)
    try:
        with embedded_account(config=config) as account:
            account.recorder.keeps_log = False
            token = secrets.token_urlsafe(32)
            server = _Server(listener, host, token, cors_origin)
            server.start()
            emulator = RunningEmulator(account, server.endpoint_url, token)
            with acting_as(EMULATOR):
                publish_stack(account)
                simulator = NodeSimulator(account, nodes or NodeScenario())
                loops = [ScheduleRunner(account)]
                simulator.start()
                for loop in loops:
                    loop.start()
            try:
                yield emulator
            finally:
                for loop in loops:
                    loop.stop()
                simulator.stop()
                server.stop()
    finally:
        listener.close()  # werkzeug serves on a duplicate of it
        if saved is None:
            os.environ.pop("AWS_IGNORE_CONFIGURED_ENDPOINT_URLS", None)
        else:
            os.environ["AWS_IGNORE_CONFIGURED_ENDPOINT_URLS"] = saved


def publish_stack(account: Account) -> None:
    """A stack named STACK_NAME whose outputs name the account's resources, as the deployed
    stack's do, and whose parameters read the public SSM parameters the deployed stack reads."""
    variables = deployment(account)
    outputs = {
        key: {"Value": variables[var]}
        for key, var in topology.STACK_OUTPUTS.items()
        if var in variables
    }
    # CloudFormation wants a resource; this one creates nothing (moto warns it cannot).
    template = {
        "Parameters": account_baseline.stack_parameters(),
        "Resources": {"Outputs": {"Type": "AWS::CloudFormation::WaitConditionHandle"}},
        "Outputs": outputs,
    }
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        account.client("cloudformation").create_stack(
            StackName=STACK_NAME, TemplateBody=json.dumps(template)
        )
