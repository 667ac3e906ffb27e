"""The emulator kept private to the developer who started it: `PrivateEndpoint`.

moto's server answers any web page with CORS headers and lets anyone reset the account or read
everything in it (`/moto-api/...`). A page the developer visits could then read the jobs table
(specs and their env) or wipe the account with one cross-origin POST.
"""

from __future__ import annotations

import hmac
import ipaddress
import json
import re
from collections.abc import Callable, Iterable
from typing import Any

# The token of this start of the emulator, in the environment it hands out; a request to its
# control endpoints carries it in TOKEN_HEADER.
ENV_TOKEN = "GPUFLEET_EMULATOR_TOKEN"  # noqa: S105 - the name of a variable
TOKEN_HEADER = "X-Gpufleet-Emulator-Token"  # noqa: S105 - the name of a header
# moto's own endpoints: reset the account, configure the backends, dump every resource.
CONTROL_PREFIX = "/moto-api"
# An origin as browsers send it: scheme, host and port, nothing else.
_ORIGIN = re.compile(
    r"^https?://[A-Za-z0-9.-]+(:[0-9]{1,5})?$|^https?://\[[0-9A-Fa-f:.]+\](:[0-9]{1,5})?$"
)
_LOOPBACK_NAMES = ("localhost",)


def is_origin(text: str) -> bool:
    return _ORIGIN.fullmatch(text) is not None


_StartResponse = Callable[..., Any]
_App = Callable[[dict[str, Any], _StartResponse], Iterable[bytes]]


class PrivateEndpoint:
    """WSGI middleware that keeps the emulator to the developer who started it.

    - A request whose `Origin` is another site's (a page the developer visits) is refused:
      browsers send it on every cross-origin request that could change anything.
    - A request whose `Host` is not this machine is refused: a page can point its own domain
      at 127.0.0.1 (DNS rebinding) and be same-origin; it still names its own domain.
      Listening on every address (`0.0.0.0`) turns this off: any name may reach it then.
    - No CORS header is sent (moto's global CORS headers are removed), except to
      `cors_origin` when one is given.
    - The control endpoints need `token`, in the TOKEN_HEADER header.
    """

    def __init__(
        self, app: _App, token: str, bound_host: str, cors_origin: str | None = None
    ) -> None:
        if cors_origin is not None and not is_origin(cors_origin):
            raise ValueError(f"not an origin (scheme://host[:port]): {cors_origin!r}")
        self._app = app
        self._token = token.encode()
        self._cors_origin = cors_origin
        self._any_host = _is_wildcard(bound_host)
        self._hosts = {bound_host.strip("[]").lower()}

    def __call__(self, environ: dict[str, Any], start_response: _StartResponse) -> Iterable[bytes]:
        host = str(environ.get("HTTP_HOST", ""))
        origin = environ.get("HTTP_ORIGIN")
        if not self._any_host and not self._host_is_here(host):
            return _refuse(start_response, f"this emulator answers for this machine, not {host!r}")
        allowed = origin is not None and origin == self._cors_origin
        if origin is not None and not allowed and origin != f"http://{host}":
            return _refuse(
                start_response,
                "cross-origin requests are refused (gpufleet emulator --cors ORIGIN allows one)",
            )
        if allowed and environ.get("REQUEST_METHOD") == "OPTIONS":
            return self._preflight(environ, start_response)
        path = str(environ.get("PATH_INFO", ""))
        if path == CONTROL_PREFIX or path.startswith(CONTROL_PREFIX + "/"):
            given = str(environ.get("HTTP_" + TOKEN_HEADER.upper().replace("-", "_"), ""))
            if not hmac.compare_digest(given.encode(), self._token):
                return _refuse(
                    start_response,
                    f"{CONTROL_PREFIX} needs this start's token in the {TOKEN_HEADER} header "
                    f"(${ENV_TOKEN} in the emulator's environment file)",
                )

        def start(status: str, headers: list[tuple[str, str]], *exc_info: Any) -> Any:
            kept = [(k, v) for k, v in headers if not k.lower().startswith("access-control-")]
            if allowed:
                kept += self._cors_headers()
            return start_response(status, kept, *exc_info)

        return self._app(environ, start)

    def _host_is_here(self, host: str) -> bool:
        name = host.rsplit(":", 1)[0] if not host.endswith("]") else host
        name = name.strip("[]").lower()
        if name in self._hosts or name in _LOOPBACK_NAMES or name.endswith(".localhost"):
            return True
        try:
            return ipaddress.ip_address(name).is_loopback
        except ValueError:
            return False

    def _cors_headers(self) -> list[tuple[str, str]]:
        assert self._cors_origin is not None
        return [
            ("Access-Control-Allow-Origin", self._cors_origin),
            ("Access-Control-Expose-Headers", "*"),
            ("Vary", "Origin"),
        ]

    def _preflight(
        self, environ: dict[str, Any], start_response: _StartResponse
    ) -> Iterable[bytes]:
        """The allowed origin's preflight: any method and headers of the AWS APIs."""
        headers = [
            *self._cors_headers(),
            ("Access-Control-Allow-Methods", "GET, HEAD, PUT, POST, DELETE, PATCH"),
            ("Access-Control-Max-Age", "600"),
        ]
        asked = environ.get("HTTP_ACCESS_CONTROL_REQUEST_HEADERS")
        if asked:
            headers.append(("Access-Control-Allow-Headers", str(asked)))
        start_response("204 No Content", headers)
        return [b""]


def _is_wildcard(host: str) -> bool:
    try:
        return ipaddress.ip_address(host.strip("[]")).is_unspecified
    except ValueError:
        return False


def _refuse(start_response: _StartResponse, reason: str) -> Iterable[bytes]:
    body = json.dumps({"error": "Forbidden", "message": reason}).encode()
    start_response(
        "403 Forbidden",
        [("Content-Type", "application/json"), ("Content-Length", str(len(body)))],
    )
    return [body]
