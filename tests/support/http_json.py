"""One JSON POST to a worker or proxy, answered as the parsed body (urllib: no client library to
keep alike across the rigs)."""

from __future__ import annotations

import json
import urllib.request


def post(url: str, body: dict, headers: dict | None = None, *, timeout: float) -> dict:
    req = urllib.request.Request(
        url, json.dumps(body).encode(), {"Content-Type": "application/json", **(headers or {})}
    )
    with urllib.request.urlopen(req, timeout=timeout) as r:
        return json.loads(r.read())
