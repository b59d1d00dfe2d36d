"""The OpenAI-compatible JSON of vLLM 0.33, as plain dicts (no pydantic on the hot path).

Shapes copied from vLLM 0.33.0 (``entrypoints/openai/completion/protocol.py``,
``chat_completion/protocol.py``, ``serve/engine/protocol.py``) and the way its serving code
dumps them:

- non-streaming bodies are ``model_dump()``: every field, ``null`` included;
- streaming chunks are ``model_dump_json(exclude_unset=True)``: only fields the server set,
  so ``kv_transfer_params`` is ``null`` on token chunks and the params object on the chunk with
  ``finish_reason``; ``usage`` appears only with ``stream_options.continuous_usage_stats``;
- the trailing usage chunk (``stream_options.include_usage``) has ``choices: []`` and drops
  ``null`` fields; then ``data: [DONE]``;
- errors are ``{"error": {"message", "type", "param", "code"}}``.

Scripted tool calls (:func:`scripted_tool_call`, off unless the worker is started with a mode, e.g.
``kvtrace sim --tool-calls first-tool``): the simulated model cannot decide to use a tool, so a test
agent's turn would never reach its tools.  With ``first-tool``, a chat request that offers ``tools``
and whose last message is the user's is answered with a call of the first tool (or the one
``tool_choice`` names) with arguments ``{}`` and finish_reason ``tool_calls``, shaped as vLLM's tool
parsers answer (``tool_calls`` on the message; streamed as a name delta at the first token and an
arguments delta with the finish); once the last message is a tool result the reply is text again,
so a framework runs one tool per turn.  ``tool_choice: "none"`` is honoured.  The tokens are still
generated (same cost, same usage), only the text is replaced.

:func:`parse_request` validates a request body and raises :class:`WireError` (HTTP 400/404)
like vLLM's request validation does.
"""

from __future__ import annotations

from dataclasses import dataclass

from kvtrace.sim import tokenizer

DEFAULT_MAX_TOKENS = 16
DONE = b"data: [DONE]\n\n"
FINISH_TOOL_CALLS = "tool_calls"
TOOL_CALLS_FIRST_TOOL = "first-tool"
TOOL_CALL_MODES = (TOOL_CALLS_FIRST_TOOL,)
SCRIPTED_ARGUMENTS = "{}"


class WireError(Exception):
    def __init__(self, message: str, status: int = 400, err_type: str = "BadRequestError", param: str | None = None):
        super().__init__(message)
        self.status = status
        self.err_type = err_type
        self.param = param


def error_body(message: str, status: int, err_type: str, param: str | None = None) -> dict:
    return {"error": {"message": message, "type": err_type, "param": param, "code": status}}


@dataclass
class ParsedRequest:
    chat: bool
    prompt_ids: list[int]
    max_tokens: int
    stream: bool
    include_usage: bool
    continuous_usage: bool
    seed: int | None
    kv_transfer_params: dict | None
    model: str | None
    thinking: bool = False  # chat_template_kwargs.enable_thinking (Qwen3's switch): reasoning first
    tool_name: str | None = None  # the scripted tool call's function (scripted_tool_call), else a text reply


def _int_field(body: dict, name: str, default: int | None, minimum: int) -> int | None:
    value = body.get(name)
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, int):
        raise WireError(f"{name} must be an integer", param=name)
    if value < minimum:
        raise WireError(f"{name} must be at least {minimum}, got {value}.", param=name)
    return value


def _prompt_ids(body: dict, chat: bool) -> list[int]:
    if chat:
        messages = body.get("messages")
        if not isinstance(messages, list) or not messages or not all(isinstance(m, dict) for m in messages):
            raise WireError("messages must be a non-empty list of message objects", param="messages")
        return tokenizer.encode_chat(messages, body.get("add_generation_prompt", True))
    prompt = body.get("prompt")
    if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], (str, list)):
        prompt = prompt[0]
    if isinstance(prompt, str):
        ids = tokenizer.encode(prompt)
    elif isinstance(prompt, list) and all(isinstance(t, int) and not isinstance(t, bool) for t in prompt):
        ids = list(prompt)
        if any(t < 0 or t >= tokenizer.VOCAB_SIZE for t in ids):
            raise WireError(f"Token id out of vocabulary [0, {tokenizer.VOCAB_SIZE})", param="prompt")
    else:
        raise WireError("prompt must be a string, a list of token ids, or a one-element list of either", param="prompt")
    if not ids:
        raise WireError("The prompt cannot be empty", param="prompt")
    return ids


def _tool_names(body: dict) -> list[str]:
    tools = body.get("tools")
    if tools is None:
        return []
    names = [t.get("function", {}).get("name") if isinstance(t, dict) else None for t in tools or ()]
    if not isinstance(tools, list) or not all(isinstance(n, str) and n for n in names):
        raise WireError("tools must be a list of {type: function, function: {name, ...}} objects", param="tools")
    return names


def check_tool_calls(mode: str | None) -> str | None:
    """``mode`` if it is a scripted tool-call mode (or None: off), else ValueError naming them."""
    if mode is not None and mode not in TOOL_CALL_MODES:
        raise ValueError(f"unknown tool-call mode {mode!r}; choose from {', '.join(TOOL_CALL_MODES)}")
    return mode


def scripted_tool_call(body: dict, mode: str | None) -> str | None:
    """The function the scripted model calls for this chat request, or None for a text reply.

    ``mode`` None: never.  ``first-tool``: when the request offers tools and its last message is
    the user's, the first tool, or the one a ``tool_choice`` object names (``"none"``: no call)."""
    if check_tool_calls(mode) is None:
        return None
    names = _tool_names(body)
    choice = body.get("tool_choice")
    if not names or choice == "none" or body["messages"][-1].get("role") != "user":
        return None
    if isinstance(choice, dict):
        named = (choice.get("function") or {}).get("name")
        if named not in names:
            raise WireError(f"tool_choice names {named!r}, which is not in tools", param="tool_choice")
        return named
    return names[0]


def tool_call_id(rid: str) -> str:
    """vLLM's ``chatcmpl-tool-…`` id, derived from the response id so replies are reproducible."""
    return f"chatcmpl-tool-{rid.removeprefix('chatcmpl-')}"


def tool_calls(rid: str, name: str) -> list[dict]:
    """The message's ``tool_calls`` of a non-streamed scripted reply."""
    return [{"id": tool_call_id(rid), "type": "function", "function": {"name": name, "arguments": SCRIPTED_ARGUMENTS}}]


def tool_call_delta(rid: str, name: str | None) -> dict:
    """A streamed tool-call delta: the name (with the id) first, then, ``name`` None, the arguments."""
    if name is not None:
        call = {"id": tool_call_id(rid), "type": "function", "index": 0, "function": {"name": name, "arguments": ""}}
    else:
        call = {"index": 0, "function": {"arguments": SCRIPTED_ARGUMENTS}}
    return {"tool_calls": [call]}


def parse_request(body: object, chat: bool, served_model: str | None, tool_mode: str | None = None) -> ParsedRequest:
    """Validate a request body; ``served_model`` None accepts any model name; ``tool_mode``: see
    :func:`scripted_tool_call`."""
    if not isinstance(body, dict):
        raise WireError("request body must be a JSON object")
    model = body.get("model")
    if model is not None and served_model is not None and model != served_model:
        raise WireError(f"The model `{model}` does not exist.", 404, "NotFoundError", "model")
    if (body.get("n") or 1) != 1:
        raise WireError("the simulator supports n=1 only", param="n")
    max_tokens = _int_field(body, "max_tokens", DEFAULT_MAX_TOKENS, 1)
    if chat:
        max_tokens = _int_field(body, "max_completion_tokens", max_tokens, 1)
    stream = body.get("stream", False)
    if not isinstance(stream, bool):
        raise WireError("stream must be a boolean", param="stream")
    opts = body.get("stream_options") or {}
    if not isinstance(opts, dict):
        raise WireError("stream_options must be an object", param="stream_options")
    if opts and not stream:
        raise WireError("Stream options can only be defined when `stream=True`.", param="stream_options")
    kvp = body.get("kv_transfer_params")
    if kvp is not None and not isinstance(kvp, dict):
        raise WireError("kv_transfer_params must be an object", param="kv_transfer_params")
    seed = body.get("seed")
    if seed is not None and (isinstance(seed, bool) or not isinstance(seed, int)):
        raise WireError("seed must be an integer", param="seed")
    kwargs = body.get("chat_template_kwargs")
    kwargs = {} if kwargs is None else kwargs
    if not isinstance(kwargs, dict):
        raise WireError("chat_template_kwargs must be an object", param="chat_template_kwargs")
    return ParsedRequest(
        chat=chat,
        prompt_ids=_prompt_ids(body, chat),
        max_tokens=max_tokens,
        stream=stream,
        include_usage=bool(opts.get("include_usage")),
        continuous_usage=bool(opts.get("include_usage") and opts.get("continuous_usage_stats")),
        seed=seed,
        kv_transfer_params=kvp,
        model=model,
        thinking=chat and kwargs.get("enable_thinking") is True,
        tool_name=scripted_tool_call(body, tool_mode) if chat else None,
    )


def usage(prompt: int, completion: int, full: bool = True) -> dict:
    u = {"prompt_tokens": prompt, "total_tokens": prompt + completion, "completion_tokens": completion}
    if full:
        u.update(prompt_tokens_details=None, completion_tokens_details=None)
    return u


def completion_body(
    rid: str, created: int, model: str, text: str, finish: str, prompt_n: int, out_n: int, kvp: dict | None
) -> dict:
    choice = {
        "index": 0,
        "text": text,
        "logprobs": None,
        "finish_reason": finish,
        "stop_reason": None,
        "token_ids": None,
        "prompt_logprobs": None,
        "prompt_token_ids": None,
        "routed_experts": None,
        "weight_versions": None,
    }
    return {
        "id": rid,
        "object": "text_completion",
        "created": created,
        "model": model,
        "choices": [choice],
        "service_tier": None,
        "system_fingerprint": None,
        "usage": usage(prompt_n, out_n),
        "kv_transfer_params": kvp,
        "ec_transfer_params": None,
        "metrics": None,
    }


def chat_body(
    rid: str,
    created: int,
    model: str,
    text: str,
    finish: str,
    prompt_n: int,
    out_n: int,
    kvp: dict | None,
    reasoning: str | None = None,
    calls: list[dict] | None = None,
) -> dict:
    """``calls``: a scripted reply's ``tool_calls`` (content null, as vLLM's tool parsers answer)."""
    message = {
        "role": "assistant",
        "content": None if calls else text,
        "refusal": None,
        "annotations": None,
        "audio": None,
        "function_call": None,
        "reasoning": reasoning,
    }
    if calls:
        message["tool_calls"] = calls
    choice = {
        "index": 0,
        "message": message,
        "logprobs": None,
        "finish_reason": finish,
        "stop_reason": None,
        "token_ids": None,
        "routed_experts": None,
        "weight_versions": None,
    }
    return {
        "id": rid,
        "object": "chat.completion",
        "created": created,
        "model": model,
        "choices": [choice],
        "service_tier": None,
        "system_fingerprint": None,
        "usage": usage(prompt_n, out_n),
        "prompt_logprobs": None,
        "prompt_token_ids": None,
        "prompt_text": None,
        "kv_transfer_params": kvp,
        "ec_transfer_params": None,
        "metrics": None,
    }


def completion_chunk(
    rid: str, created: int, model: str, text: str, finish: str | None, kvp: dict | None, cont_usage: dict | None = None
) -> dict:
    choice = {
        "index": 0,
        "text": text,
        "logprobs": None,
        "finish_reason": finish,
        "stop_reason": None,
        "prompt_token_ids": None,
        "token_ids": None,
        "weight_versions": None,
    }
    chunk = {"id": rid, "object": "text_completion", "created": created, "model": model, "choices": [choice]}
    if cont_usage is not None:
        chunk["usage"] = cont_usage
    chunk["kv_transfer_params"] = kvp if finish is not None else None
    return chunk


def chat_role_chunk(rid: str, created: int, model: str, cont_usage: dict | None = None) -> dict:
    choice = {"index": 0, "delta": {"role": "assistant", "content": ""}, "logprobs": None, "finish_reason": None}
    chunk = {"id": rid, "object": "chat.completion.chunk", "created": created, "model": model, "choices": [choice]}
    if cont_usage is not None:
        chunk["usage"] = cont_usage
    chunk.update(prompt_token_ids=None, prompt_text=None)
    return chunk


def chat_chunk(
    rid: str,
    created: int,
    model: str,
    text: str,
    finish: str | None,
    kvp: dict | None,
    cont_usage: dict | None = None,
    field: str = "content",
    delta: dict | None = None,
) -> dict:
    """``field``: ``content``, or ``reasoning`` for a reasoning delta (vLLM's reasoning parser);
    ``delta`` replaces the whole delta (a scripted tool call's, :func:`tool_call_delta`)."""
    choice = {"index": 0, "delta": delta or {field: text}, "logprobs": None, "finish_reason": finish}
    if finish is not None:
        choice["stop_reason"] = None
    choice["token_ids"] = None
    if finish is not None:
        choice["weight_versions"] = None
    chunk = {"id": rid, "object": "chat.completion.chunk", "created": created, "model": model, "choices": [choice]}
    if cont_usage is not None:
        chunk["usage"] = cont_usage
    chunk["kv_transfer_params"] = kvp if finish is not None else None
    return chunk


def usage_chunk(rid: str, created: int, model: str, chat: bool, prompt_n: int, out_n: int) -> dict:
    return {
        "id": rid,
        "object": "chat.completion.chunk" if chat else "text_completion",
        "created": created,
        "model": model,
        "choices": [],
        "usage": usage(prompt_n, out_n, full=False),
    }


def models_body(model: str, created: int, max_model_len: int) -> dict:
    card = {
        "id": model,
        "object": "model",
        "created": created,
        "owned_by": "vllm",
        "root": model,
        "parent": None,
        "max_model_len": max_model_len,
        "permission": [],
    }
    return {"object": "list", "data": [card]}
