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

:func:`parse_request` validates a request body and raises :class:`WireError` (HTTP 400/404)
like vLLM's request validation does.
"""

from __future__ import annotations

from dataclasses import dataclass

from kvtrace.sim import tokenizer

DEFAULT_MAX_TOKENS = 16
DONE = b"data: [DONE]\n\n"


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
        return tokenizer.encode(tokenizer.render_chat(messages, body.get("add_generation_prompt", True)))
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


def parse_request(body: object, chat: bool, served_model: str | None) -> ParsedRequest:
    """Validate a request body; ``served_model`` None accepts any model name."""
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
) -> dict:
    message = {
        "role": "assistant",
        "content": text,
        "refusal": None,
        "annotations": None,
        "audio": None,
        "function_call": None,
        "reasoning": reasoning,
    }
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
) -> dict:
    """``field``: ``content``, or ``reasoning`` for a reasoning delta (vLLM's reasoning parser)."""
    choice = {"index": 0, "delta": {field: text}, "logprobs": None, "finish_reason": finish}
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
