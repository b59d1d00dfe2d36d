"""Client request parsing and validation (the proxy's only untrusted-input surface).

:func:`parse_request` turns a raw body into a :class:`ClientRequest` or raises
:class:`RequestError` (an HTTP 4xx with an OpenAI-style JSON error body).  It checks the fields the
proxy itself reads or rewrites; everything else is left for the workers to judge, except text that
is not text: a body with an unpaired UTF-16 surrogate anywhere is a 400 (``invalid_unicode``), as
UTF-8 cannot carry it to the workers or into a span.  :func:`check_id` bounds the conversation,
session and request ids and the OpenAI ``prompt_cache_key`` (``max_id_bytes``, default 256 UTF-8
bytes; ``id_too_long``) and requires them printable (no control characters: ``invalid_id``), the
check every layer applies (:mod:`kvtrace.semconv.ids`).  ``conversation_id`` is removed from the
body (vLLM's proxy does the same); ``prompt_cache_key`` stays (vLLM ignores it).
"""

from __future__ import annotations

from dataclasses import dataclass

from kvtrace import jsoncodec as codec
from kvtrace import semconv as sc
from kvtrace.semconv.ids import MAX_ID_BYTES, id_problem

CHAT_PATH = "/v1/chat/completions"
COMPLETIONS_PATH = "/v1/completions"


class RequestError(Exception):
    """A client error: ``status`` (4xx), ``message``, ``code``."""

    def __init__(self, status: int, message: str, code: str = "invalid_request") -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.code = code

    def body(self) -> dict:
        return error_body(self.message, "invalid_request_error", self.code)


def error_body(message: str, type_: str, code: str | int) -> dict:
    return {"error": {"message": message, "type": type_, "code": code}}


@dataclass
class ClientRequest:
    path: str
    body: dict  # conversation_id already removed
    conversation_id: str | None
    stream: bool
    include_usage: bool
    model: str | None
    prompt_cache_key: str | None = None

    @property
    def operation(self) -> str:
        return sc.OP_CHAT if self.path == CHAT_PATH else sc.OP_TEXT_COMPLETION


def _int_or_none(body: dict, name: str) -> None:
    v = body.get(name)
    if v is not None and (not isinstance(v, int) or isinstance(v, bool) or v < 0):
        raise RequestError(400, f"'{name}' must be a non-negative integer")


def _type_or_none(body: dict, name: str, types: type | tuple, what: str) -> None:
    v = body.get(name)
    if v is not None and (not isinstance(v, types) or (types is not bool and isinstance(v, bool))):
        raise RequestError(400, f"'{name}' must be {what}")


def check_id(value: str, what: str, max_bytes: int = MAX_ID_BYTES) -> str:
    """``value`` if it is a valid id (:func:`kvtrace.semconv.ids.id_problem`: printable UTF-8 text
    of at most ``max_bytes`` bytes), else a 400 (``id_too_long``, ``invalid_unicode``, ``invalid_id``)."""
    problem = id_problem(value, max_bytes)
    if problem is None:
        return value
    code = "id_too_long" if "longer" in problem else "invalid_unicode" if "UTF-8" in problem else "invalid_id"
    raise RequestError(400, f"{what} {problem}", code)


def parse_request(raw: bytes, path: str, max_id_bytes: int = MAX_ID_BYTES) -> ClientRequest:
    """Validate a /v1/chat/completions or /v1/completions body."""
    try:
        body = codec.loads_text(raw)
    except codec.UnpairedSurrogate:
        raise RequestError(
            400, "body holds an unpaired UTF-16 surrogate (e.g. \\ud800), which is not text", "invalid_unicode"
        ) from None
    except (ValueError, UnicodeDecodeError) as exc:
        raise RequestError(400, f"body is not valid JSON: {exc.__class__.__name__}", "invalid_json") from None
    except RecursionError:
        raise RequestError(400, "body is nested too deeply", "invalid_json") from None
    if not isinstance(body, dict):
        raise RequestError(400, "body must be a JSON object")
    if path == CHAT_PATH:
        msgs = body.get("messages")
        if not isinstance(msgs, list) or not msgs or not all(isinstance(m, dict) for m in msgs):
            raise RequestError(400, "'messages' must be a non-empty list of objects")
    else:
        prompt = body.get("prompt")
        if not isinstance(prompt, (str, list)) or isinstance(prompt, list) and not prompt:
            raise RequestError(400, "'prompt' must be a string or a non-empty list")
    _type_or_none(body, "model", str, "a string")
    _type_or_none(body, "stream", bool, "a boolean")
    _type_or_none(body, "stream_options", dict, "an object")
    _type_or_none(body, "kv_transfer_params", dict, "an object")
    for name in ("max_tokens", "max_completion_tokens", "min_tokens", "n"):
        _int_or_none(body, name)
    conv = body.pop(sc.BODY_CONVERSATION_ID, None)
    if conv is not None and not isinstance(conv, str):
        raise RequestError(400, f"'{sc.BODY_CONVERSATION_ID}' must be a string")
    if conv:
        check_id(conv, f"'{sc.BODY_CONVERSATION_ID}'", max_id_bytes)
    key = body.get(sc.BODY_PROMPT_CACHE_KEY)
    if key is not None and not isinstance(key, str):
        raise RequestError(400, f"'{sc.BODY_PROMPT_CACHE_KEY}' must be a string")
    if key:
        check_id(key, f"'{sc.BODY_PROMPT_CACHE_KEY}'", max_id_bytes)
    opts = body.get("stream_options") or {}
    return ClientRequest(
        path=path,
        body=body,
        conversation_id=conv or None,
        stream=bool(body.get("stream")),
        include_usage=bool(opts.get("include_usage")),
        model=body.get("model"),
        prompt_cache_key=key or None,
    )
