"""The Authorization header the proxy sends to its workers: the client's own, else the configured
API key as a bearer token, else none (one rule for the chat legs and ``/v1/models``)."""

from __future__ import annotations

import pytest
from multidict import CIMultiDict

from kvtrace.proxy.app import Proxy
from kvtrace.proxy.config import ProxyConfig, Worker


def _proxy(api_key: str | None) -> Proxy:
    return Proxy(ProxyConfig(prefill=[Worker("h", 1)], decode=[Worker("h", 2)], api_key=api_key))


@pytest.mark.parametrize(
    ("client", "api_key", "sent"),
    [
        ("Bearer client-key", "configured", "Bearer client-key"),
        (None, "configured", "Bearer configured"),
        (None, None, None),
        ("Bearer client-key", None, "Bearer client-key"),
    ],
)
def test_the_clients_authorization_wins_then_the_configured_key(client, api_key, sent):
    headers = CIMultiDict({"authorization": client} if client else {})
    assert _proxy(api_key)._auth(headers) == sent


def test_models_requests_carry_the_same_header():
    class Request:
        headers = CIMultiDict()

    assert _proxy("configured")._auth_headers(Request()) == {"Authorization": "Bearer configured"}
    assert _proxy(None)._auth_headers(Request()) == {}
