"""The proxy refuses a session id that is not printable, bounded text with a 400 and a JSON
body, whichever carrier brought it (X-Session-ID, W3C baggage session.id, the body's
conversation_id or prompt_cache_key), before any worker sees the request or a session is kept."""

from __future__ import annotations

import json

import pytest

from kvtrace import semconv as sc
from kvtrace.testing.proxy import BODY, CHAT, http_head, raw_request


def _error(data: bytes) -> dict:
    return json.loads(data)["error"]


async def test_baggage_session_id_with_nul_newline_and_bad_byte_is_a_400(rig_factory):  # noqa: F811
    rig = await rig_factory()
    status, headers, data = await rig.post(headers={"baggage": "session.id=%00%0a%ff"})
    assert status == 400 and headers["Content-Type"].startswith("application/json")
    assert _error(data) == {
        "message": "session id (X-Session-ID / baggage session.id) holds a non-printable character (U+0000)",
        "type": "invalid_request_error",
        "code": "invalid_id",
    }
    assert rig.p.received == [] and rig.d.received == []


@pytest.mark.parametrize("value", ["a\u2028b", "a\x85b", "a\u202eb"])
async def test_session_header_with_a_non_printable_character_is_a_400(rig_factory, value):  # noqa: F811
    """UTF-8 in the header (ASCII control bytes never get this far: aiohttp's parser answers
    those with a plain 400 itself)."""
    rig = await rig_factory()
    body = json.dumps(BODY).encode()
    as_sent = value.encode().decode("latin-1")  # http_head writes latin-1: these are the UTF-8 bytes
    head = http_head(CHAT, body, extra=f"{sc.HEADER_SESSION_ID}: {as_sent}\r\n")
    resp = await raw_request(rig.proxy.url, head, body)
    assert resp.status_lines[0].startswith("HTTP/1.1 400")
    assert _error(resp.body) == {
        "message": f"session id (X-Session-ID / baggage session.id) holds a non-printable character "
        f"(U+{ord(value[1]):04X})",
        "type": "invalid_request_error",
        "code": "invalid_id",
    }
    assert rig.p.received == [] and rig.d.received == []


@pytest.mark.parametrize("field", [sc.BODY_CONVERSATION_ID, sc.BODY_PROMPT_CACHE_KEY])
@pytest.mark.parametrize(("value", "char"), [("conv\nforged", "U+000A"), ("<b>\u2028</b>", "U+2028")])
async def test_body_ids_with_a_non_printable_character_are_a_400(rig_factory, field, value, char):  # noqa: F811
    rig = await rig_factory(prefix_match=True)
    status, _, data = await rig.post({**BODY, field: value})
    assert status == 400
    assert _error(data) == {
        "message": f"'{field}' holds a non-printable character ({char})",
        "type": "invalid_request_error",
        "code": "invalid_id",
    }
    assert rig.p.received == [] and rig.d.received == []


async def test_a_printable_session_header_still_passes(rig_factory):  # noqa: F811
    rig = await rig_factory()
    status, _, _ = await rig.post(headers={sc.HEADER_SESSION_ID: "s-1 <ok> | é"})
    assert status == 200
    span = await rig.server_span()
    assert span.attributes[sc.SESSION_ID] == "s-1 <ok> | é"
    assert span.attributes[sc.SESSION_SOURCE] == sc.SOURCE_HEADER
