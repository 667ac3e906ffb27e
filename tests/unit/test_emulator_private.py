"""The emulator answers only its developer: no web page, no other host name, no control
endpoint without its token (the middleware alone; tests/integration/test_cli_everyday.py
checks the real server on a loopback port)."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import pytest
from werkzeug.test import Client

from gpufleet.emulator.private import TOKEN_HEADER, PrivateEndpoint

TOKEN = "s3cr3t-token"
PAGE = "https://evil.example"


def moto_like(environ: dict[str, Any], start_response: Any) -> Iterable[bytes]:
    """Stands in for moto's server: it answers everything, with its global CORS headers."""
    start_response(
        "200 OK",
        [("Access-Control-Allow-Origin", "*"), ("Access-Control-Allow-Methods", "*")],
    )
    return [b"answered " + environ["PATH_INFO"].encode()]


def client(cors_origin: str | None = None, bound_host: str = "127.0.0.1") -> Client:
    return Client(PrivateEndpoint(moto_like, TOKEN, bound_host, cors_origin))


def cors_headers(response: Any) -> list[str]:
    return [name for name, _ in response.headers if name.lower().startswith("access-control-")]


def test_the_aws_apis_answer_local_clients_without_any_cors_header() -> None:
    response = client().get("/", headers={"Host": "127.0.0.1:5000"})
    assert response.status_code == 200 and response.data == b"answered /"
    assert cors_headers(response) == []


@pytest.mark.parametrize(
    ("method", "path"),
    [("POST", "/moto-api/reset"), ("GET", "/"), ("OPTIONS", "/"), ("PUT", "/bucket/jobs/x")],
)
def test_a_web_page_gets_nothing_from_it(method: str, path: str) -> None:
    headers = {"Host": "127.0.0.1:5000", "Origin": PAGE, TOKEN_HEADER: TOKEN}
    response = client().open(path, method=method, headers=headers)
    assert response.status_code == 403 and b"answered" not in response.data
    assert cors_headers(response) == []


@pytest.mark.parametrize("host", ["evil.example:5000", "evil.example", "10.0.0.5:5000", ""])
def test_a_host_name_that_is_not_this_machine_is_refused(host: str) -> None:
    # A page that points its own name at 127.0.0.1 (DNS rebinding) is same-origin to itself.
    response = client().get("/", headers={"Host": host, "Origin": f"http://{host}"})
    assert response.status_code == 403


@pytest.mark.parametrize("host", ["127.0.0.1:5000", "localhost:5000", "[::1]:5000", "b.localhost"])
def test_this_machine_answers_to_its_loopback_names(host: str) -> None:
    assert client().get("/", headers={"Host": host}).status_code == 200


def test_listening_on_every_address_answers_any_name_but_still_no_page() -> None:
    wide = client(bound_host="0.0.0.0")
    assert wide.get("/", headers={"Host": "10.0.0.5:5000"}).status_code == 200
    assert wide.get("/", headers={"Host": "10.0.0.5:5000", "Origin": PAGE}).status_code == 403


@pytest.mark.parametrize("path", ["/moto-api/reset", "/moto-api/config", "/moto-api/data.json"])
def test_the_control_endpoints_need_the_token(path: str) -> None:
    local = {"Host": "127.0.0.1:5000"}
    for token in (None, "", "wrong", TOKEN + "x"):
        headers = local if token is None else {**local, TOKEN_HEADER: token}
        refused = client().post(path, headers=headers)
        assert refused.status_code == 403 and b"answered" not in refused.data
        assert TOKEN_HEADER.encode() in refused.data  # says what it needs
    assert client().post(path, headers={**local, TOKEN_HEADER: TOKEN}).status_code == 200


def test_the_one_origin_asked_for_gets_cors_headers_and_no_other_does() -> None:
    app = "http://localhost:3000"
    allowed = client(cors_origin=app)
    headers = {"Host": "127.0.0.1:5000", "Origin": app}
    preflight = allowed.options(
        "/",
        headers={
            **headers,
            "Access-Control-Request-Method": "POST",
            "Access-Control-Request-Headers": "authorization, x-amz-target",
        },
    )
    assert preflight.status_code == 204
    assert preflight.headers["Access-Control-Allow-Origin"] == app
    assert preflight.headers["Access-Control-Allow-Headers"] == "authorization, x-amz-target"
    answered = allowed.post("/", headers=headers)
    assert answered.status_code == 200
    assert answered.headers.getlist("Access-Control-Allow-Origin") == [app]  # never moto's *
    other = allowed.post("/", headers={**headers, "Origin": PAGE})
    assert other.status_code == 403 and cors_headers(other) == []
    # The origin it serves still needs the token for the control endpoints.
    assert allowed.post("/moto-api/reset", headers=headers).status_code == 403


@pytest.mark.parametrize("origin", ["*", "null", "http://x.example/path", "evil.example"])
def test_only_an_origin_can_be_allowed(origin: str) -> None:
    with pytest.raises(ValueError, match="not an origin"):
        PrivateEndpoint(moto_like, TOKEN, "127.0.0.1", origin)
