"""The proxy- and engine-side span builders of :class:`~kvtrace.testing.synth.SpanBuilder`.

They live apart from the agent-side helpers in :mod:`kvtrace.testing.synth` only to keep each
module short: :class:`EngineSpans` is a mixin that SpanBuilder inherits, so every method is still
called as ``SpanBuilder().request(...)`` and the like.  The service names of the spans made here
are defined here (synth.py imports this module, so this one cannot import synth.py) and
re-exported from synth.py, where tests import them.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from kvtrace import semconv as sc

PROXY, SIM_P, SIM_D = "kvtrace-proxy", "kvtrace-sim-prefill", "kvtrace-sim-decode"


def _engine_resource(engine_id: str, role: str) -> dict:
    return {sc.ENGINE_ID: engine_id, sc.ENGINE_ROLE: role, sc.SUBSTRATE: sc.SUBSTRATE_SIM}


class EngineSpans:
    """Proxy request, engine, KV decision / transfer / retention spans, and the P and D legs of
    :meth:`SpanBuilder.call <kvtrace.testing.synth.SpanBuilder.call>`; times in ms offsets."""

    if TYPE_CHECKING:
        # provided by SpanBuilder, which every method here builds on
        span: Callable[..., Any]

    def request(
        self,
        session_id: str | None,
        turn: int | None,
        request_id: str,
        start_ms: float,
        end_ms: float,
        ttft_ms: float | None,
        *,
        parent=None,
        offered: bool = False,
        offer_reason: str = sc.OFFER_NO_ENTRY,
        outcome: str | None = None,
        pulled: int = 0,
        input_tokens: int = 100,
        output_tokens: int = 10,
        extra: dict | None = None,
    ):
        attrs = {
            sc.GEN_AI_REQUEST_ID: request_id,
            sc.GEN_AI_OPERATION_NAME: sc.OP_CHAT,
            sc.GEN_AI_REQUEST_MODEL: "qwen3-32b",
            sc.GEN_AI_USAGE_INPUT_TOKENS: input_tokens,
            sc.GEN_AI_USAGE_OUTPUT_TOKENS: output_tokens,
            sc.HTTP_RESPONSE_STATUS_CODE: 200,
            sc.REQUEST_STREAM: True,
            sc.REQUEST_LATENCY_MS: float(end_ms - start_ms),
            sc.PROXY_OFFER: offered,
            sc.PROXY_OFFER_REASON: offer_reason,
            sc.PROXY_FALLBACK: sc.FALLBACK_NONE,
            sc.KV_PULLED_TOKENS: pulled,
        }
        events = {}
        if session_id is not None:
            attrs[sc.SESSION_ID] = session_id
            attrs[sc.GEN_AI_CONVERSATION_ID] = session_id
        if turn is not None:
            attrs[sc.TURN_INDEX] = turn
        if ttft_ms is not None:
            attrs[sc.REQUEST_TTFT_MS] = float(ttft_ms)
            events = {sc.EVENT_FIRST_TOKEN: start_ms + ttft_ms, sc.EVENT_LAST_TOKEN: end_ms}
        if outcome:
            attrs[sc.KV_OUTCOME] = outcome
        attrs.update(extra or {})
        return self.span(
            sc.SPAN_PROXY_REQUEST,
            start_ms,
            end_ms,
            parent=parent,
            service=PROXY,
            kind="SERVER",
            attrs=attrs,
            events=events,
        )

    def _on_engine(self, name, engine_id, role, ident, start_ms, end_ms, parent, attrs, **kw):
        """One engine-side span: the engine's identity first, its service and resource by role."""
        attrs = {**ident, sc.ENGINE_ID: engine_id, sc.ENGINE_ROLE: role, **attrs}
        service = SIM_P if role == sc.ROLE_PREFILL else SIM_D
        resource = _engine_resource(engine_id, role)
        return self.span(name, start_ms, end_ms, parent=parent, service=service, attrs=attrs, resource=resource, **kw)

    def engine(
        self,
        role: str,
        engine_id: str,
        ident: dict,
        start_ms: float,
        end_ms: float,
        *,
        parent,
        prompt_tokens: int,
        cached_tokens: int,
        output_tokens: int | None = None,
    ):
        name = sc.SPAN_ENGINE_PREFILL if role == sc.ROLE_PREFILL else sc.SPAN_ENGINE_DECODE
        attrs = {
            sc.KV_PROMPT_TOKENS: prompt_tokens,
            sc.REQUEST_CACHED_TOKENS: cached_tokens,
        }
        if output_tokens is not None:
            attrs[sc.GEN_AI_USAGE_OUTPUT_TOKENS] = output_tokens
        return self._on_engine(name, engine_id, role, ident, start_ms, end_ms, parent, attrs)

    def decision(
        self,
        engine_id: str,
        role: str,
        ident: dict,
        at_ms: float,
        end_ms: float,
        *,
        parent,
        direction: str,
        outcome: str,
        prompt: int,
        local_hit: int,
        remote: int,
        pulled: int,
        recomputed: int,
        threshold: int = 64,
        peer: str | None = None,
        extra: dict | None = None,
    ):
        attrs = {
            sc.KV_DIRECTION: direction,
            sc.KV_OUTCOME: outcome,
            sc.KV_PROMPT_TOKENS: prompt,
            sc.KV_LOCAL_HIT_TOKENS: local_hit,
            sc.KV_REMOTE_TOKENS: remote,
            sc.KV_PULLED_TOKENS: pulled,
            sc.KV_RECOMPUTED_TOKENS: recomputed,
            sc.KV_THRESHOLD: threshold,
        }
        if peer:
            attrs[sc.KV_PEER_ENGINE_ID] = peer
        attrs.update(extra or {})
        return self._on_engine(sc.SPAN_KV_DECISION, engine_id, role, ident, at_ms, end_ms, parent, attrs)

    def transfer(
        self,
        engine_id: str,
        role: str,
        ident: dict,
        start_ms: float,
        end_ms: float,
        *,
        parent,
        direction: str,
        tokens: int,
        block_size: int = 16,
        bytes_per_token: int = 262_144,
        status: str = sc.TRANSFER_OK,
        peer: str | None = None,
    ):
        blocks = -(-tokens // block_size)
        attrs = {
            sc.KV_DIRECTION: direction,
            sc.KV_TRANSFER_TOKENS: tokens,
            sc.KV_TRANSFER_BLOCKS: blocks,
            sc.KV_TRANSFER_BYTES: blocks * block_size * bytes_per_token,
            sc.KV_TRANSFER_XFER_MS: float(end_ms - start_ms),
            sc.KV_TRANSFER_STATUS: status,
        }
        if peer:
            attrs[sc.KV_PEER_ENGINE_ID] = peer
        error = status != sc.TRANSFER_OK
        return self._on_engine(
            sc.SPAN_KV_TRANSFER, engine_id, role, ident, start_ms, end_ms, parent, attrs, error=error
        )

    def retention(
        self,
        engine_id: str,
        ident: dict,
        start_ms: float,
        end_ms: float,
        *,
        parent,
        tokens: int,
        outcome: str,
        block_size: int = 16,
        bytes_per_token: int = 262_144,
        ttl_s: float = 480.0,
    ):
        blocks = -(-tokens // block_size)
        attrs = {
            sc.KV_RETENTION_BLOCKS: blocks,
            sc.KV_RETENTION_TOKENS: tokens,
            sc.KV_RETENTION_BYTES: blocks * block_size * bytes_per_token,
            sc.KV_RETENTION_TTL_S: ttl_s,
            sc.KV_RETENTION_OUTCOME: outcome,
        }
        role = sc.ROLE_DECODE
        return self._on_engine(sc.SPAN_KV_RETENTION, engine_id, role, ident, start_ms, end_ms, parent, attrs)

    # ------------------------------------------------------------------ the legs of SpanBuilder.call
    def _decided(self, engine_id, role, ident, window, parent, direction, peer, *, pulled: int, **decision) -> None:
        """An engine's KV decision over ``window`` (start, end ms) and, when it pulled, the transfer
        under it over the same window."""
        start, end = window
        dec = self.decision(
            engine_id, role, ident, start, end, parent=parent, direction=direction, pulled=pulled, peer=peer, **decision
        )
        if pulled:
            self.transfer(engine_id, role, ident, start, end, parent=dec, direction=direction, tokens=pulled, peer=peer)

    def _prefill_leg(
        self,
        req,
        ident: dict,
        t: float,
        *,
        prefill_ms: float,
        xfer_ms: float,
        prompt: int,
        local_hit: int,
        remote: int,
        pulled: int,
        outcome: str | None,
        p_engine: str,
        d_engine: str,
        decision_attrs: dict | None = None,
    ) -> None:
        """The proxy's prefill leg under ``req`` from ``t`` for ``prefill_ms``, P's prefill in it and,
        when the call has an ``outcome``, P's reuse decision (with its pull from D if ``pulled``;
        ``decision_attrs`` added to it)."""
        pleg = self.span(
            sc.SPAN_PROXY_PREFILL,
            t,
            t + prefill_ms,
            parent=req,
            service=PROXY,
            kind="CLIENT",
            attrs={**ident, sc.PROXY_OFFER: remote > 0},
        )
        peng = self.engine(
            sc.ROLE_PREFILL,
            p_engine,
            ident,
            t + 0.1,
            t + prefill_ms - 0.1,
            parent=pleg,
            prompt_tokens=prompt,
            cached_tokens=local_hit + pulled,
        )
        if outcome:
            window = (t + 0.2, t + 0.2 + xfer_ms)
            self._decided(
                p_engine,
                sc.ROLE_PREFILL,
                ident,
                window,
                peng,
                sc.DIRECTION_D2P,
                d_engine,
                outcome=outcome,
                prompt=prompt,
                local_hit=local_hit,
                remote=remote,
                pulled=pulled,
                recomputed=prompt - local_hit - pulled,
                extra=decision_attrs,
            )

    def _decode_leg(
        self,
        req,
        ident: dict,
        t2: float,
        end: float,
        *,
        prompt: int,
        output_tokens: int,
        p_engine: str,
        d_engine: str,
        retention_end_ms: float | None,
        retention_outcome: str,
    ):
        """The proxy's decode leg under ``req`` from ``t2`` to ``end``, D's decode in it, D's pull of
        the prompt's blocks from P (5 ms) and, until ``retention_end_ms``, D's retention of them;
        returns the retention span (None without ``retention_end_ms``)."""
        dleg = self.span(sc.SPAN_PROXY_DECODE, t2, end, parent=req, service=PROXY, kind="CLIENT", attrs=ident)
        deng = self.engine(
            sc.ROLE_DECODE,
            d_engine,
            ident,
            t2 + 0.1,
            end - 0.1,
            parent=dleg,
            prompt_tokens=prompt,
            cached_tokens=prompt,
            output_tokens=output_tokens,
        )
        self._decided(
            d_engine,
            sc.ROLE_DECODE,
            ident,
            (t2 + 0.2, t2 + 5.2),
            deng,
            sc.DIRECTION_P2D,
            p_engine,
            outcome=sc.OUTCOME_PULLED,
            prompt=prompt,
            local_hit=0,
            remote=prompt,
            pulled=prompt,
            recomputed=0,
        )
        ret = None
        if retention_end_ms is not None:
            ret = self.retention(
                d_engine,
                ident,
                end - 0.1,
                retention_end_ms,
                parent=deng,
                tokens=prompt + output_tokens,
                outcome=retention_outcome,
            )
        return ret
