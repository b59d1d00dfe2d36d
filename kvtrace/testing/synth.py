"""Hand-built trace stores with exact timestamps, written through the real span pipeline.

:class:`SpanBuilder` makes spans with the OpenTelemetry SDK at given times (ms offsets from a
base), one TracerProvider per (service, resource) as real components do, and writes them with
:func:`kvtrace.store.convert.spans_to_table` into the store's Parquet layout.  The analysis tests
use it to build traces with known answers; :meth:`SpanBuilder.call` builds the whole span tree of
one LLM call (agent → proxy → P/D engines → decisions, transfers, retention) for dashboard tests.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

from opentelemetry import trace
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind

from kvtrace import semconv as sc

BASE_NS = 1_767_225_600_000_000_000  # 2026-01-01T00:00:00Z
AGENT, PROXY, SIM_P, SIM_D = "kvtrace-agent", "kvtrace-proxy", "kvtrace-sim-prefill", "kvtrace-sim-decode"
_KIND = {k.name: k for k in SpanKind}


@dataclass
class Call:
    """Spans of one LLM call made by :meth:`SpanBuilder.call`."""

    llm: object
    request: object
    retention: object | None


class SpanBuilder:
    """Spans at exact times.  ``ms(x)`` = ``base_ns + x`` ms; pass offsets in ms everywhere."""

    def __init__(self, base_ns: int = BASE_NS) -> None:
        self.base_ns = base_ns
        self.exporter = InMemorySpanExporter()
        self._providers: dict[tuple, TracerProvider] = {}
        self._seq = 1

    def ns(self, ms: float) -> int:
        return self.base_ns + int(round(ms * 1_000_000))

    def _tracer(self, service: str, resource: dict | None):
        key = (service, tuple(sorted((resource or {}).items())))
        provider = self._providers.get(key)
        if provider is None:
            attrs = {sc.SERVICE_NAME: service, **(resource or {})}
            provider = TracerProvider(resource=Resource(attrs))
            provider.add_span_processor(SimpleSpanProcessor(self.exporter))
            self._providers[key] = provider
        return provider.get_tracer("kvtrace.synth")

    def span(
        self,
        name: str,
        start_ms: float,
        end_ms: float,
        *,
        parent=None,
        service: str = AGENT,
        kind: str = "INTERNAL",
        attrs: dict | None = None,
        events: dict[str, float] | None = None,
        resource: dict | None = None,
        error: bool = False,
        ok: bool = False,
    ):
        """A finished span; ``parent`` None starts a new trace.  ``events``: name → time (ms).
        ``kind``: a :class:`~opentelemetry.trace.SpanKind` name; ``error`` / ``ok``: its status."""
        ctx = trace.set_span_in_context(parent) if parent is not None else None
        span = self._tracer(service, resource).start_span(
            name, context=ctx, kind=_KIND[kind], attributes=attrs or {}, start_time=self.ns(start_ms)
        )
        for ev, at in (events or {}).items():
            span.add_event(ev, timestamp=self.ns(at))
        if error:
            span.set_status(trace.Status(trace.StatusCode.ERROR, "error"))
        elif ok:
            span.set_status(trace.Status(trace.StatusCode.OK))
        span.end(end_time=self.ns(end_ms))
        return span

    # ------------------------------------------------------------------ agent-side helpers
    def session(self, session_id: str, start_ms: float, end_ms: float, *, parent=None, scenario: str = "test"):
        return self.span(
            sc.SPAN_AGENT_SESSION,
            start_ms,
            end_ms,
            parent=parent,
            attrs={
                sc.GEN_AI_OPERATION_NAME: sc.OP_INVOKE_AGENT,
                sc.GEN_AI_AGENT_NAME: scenario,
                sc.SESSION_ID: session_id,
                sc.GEN_AI_CONVERSATION_ID: session_id,
                sc.AGENT_SCENARIO: scenario,
            },
        )

    def turn(self, session_id: str, turn: int, start_ms: float, end_ms: float, *, parent=None):
        return self.span(
            sc.SPAN_AGENT_TURN, start_ms, end_ms, parent=parent, attrs={sc.SESSION_ID: session_id, sc.TURN_INDEX: turn}
        )

    def llm_call(
        self,
        session_id: str,
        turn: int | None,
        start_ms: float,
        end_ms: float,
        ttft_ms: float | None,
        *,
        parent=None,
        request_id: str | None = None,
        input_tokens: int = 100,
        output_tokens: int = 10,
        outcome: str | None = None,
    ):
        attrs = {
            sc.GEN_AI_OPERATION_NAME: sc.OP_CHAT,
            sc.GEN_AI_REQUEST_MODEL: "qwen3-32b",
            sc.SESSION_ID: session_id,
            sc.GEN_AI_CONVERSATION_ID: session_id,
            sc.GEN_AI_USAGE_INPUT_TOKENS: input_tokens,
            sc.GEN_AI_USAGE_OUTPUT_TOKENS: output_tokens,
        }
        if turn is not None:
            attrs[sc.TURN_INDEX] = turn
        if ttft_ms is not None:
            attrs[sc.LLM_TTFT_MS] = float(ttft_ms)
        if request_id:
            attrs[sc.GEN_AI_REQUEST_ID] = request_id
        if outcome:
            attrs[sc.KV_OUTCOME] = outcome
        return self.span(sc.SPAN_AGENT_LLM_CALL, start_ms, end_ms, parent=parent, kind="CLIENT", attrs=attrs)

    def tool(
        self, session_id: str, turn: int | None, start_ms: float, end_ms: float, *, parent=None, name: str = "run_tests"
    ):
        attrs = {
            sc.GEN_AI_OPERATION_NAME: sc.OP_EXECUTE_TOOL,
            sc.GEN_AI_TOOL_NAME: name,
            sc.GEN_AI_TOOL_CALL_ID: f"call-{start_ms}",
            sc.SESSION_ID: session_id,
        }
        if turn is not None:
            attrs[sc.TURN_INDEX] = turn
        return self.span(sc.SPAN_AGENT_TOOL_CALL, start_ms, end_ms, parent=parent, attrs=attrs)

    def app_work(
        self, session_id: str, turn: int | None, start_ms: float, end_ms: float, *, parent=None, name: str = "plan"
    ):
        attrs = {sc.AGENT_WORK_NAME: name, sc.SESSION_ID: session_id}
        if turn is not None:
            attrs[sc.TURN_INDEX] = turn
        return self.span(sc.SPAN_AGENT_APP_WORK, start_ms, end_ms, parent=parent, attrs=attrs)

    def user_pause(
        self,
        session_id: str,
        turn: int | None,
        start_ms: float,
        end_ms: float,
        *,
        parent=None,
        reason: str | None = "think",
    ):
        attrs = {sc.SESSION_ID: session_id, **({sc.AGENT_PAUSE_REASON: reason} if reason else {})}
        if turn is not None:
            attrs[sc.TURN_INDEX] = turn
        return self.span(sc.SPAN_AGENT_USER_PAUSE, start_ms, end_ms, parent=parent, attrs=attrs)

    # ------------------------------------------------------------------ proxy / engine helpers
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
            **ident,
            sc.ENGINE_ID: engine_id,
            sc.ENGINE_ROLE: role,
            sc.KV_PROMPT_TOKENS: prompt_tokens,
            sc.REQUEST_CACHED_TOKENS: cached_tokens,
        }
        if output_tokens is not None:
            attrs[sc.GEN_AI_USAGE_OUTPUT_TOKENS] = output_tokens
        return self.span(
            name,
            start_ms,
            end_ms,
            parent=parent,
            service=SIM_P if role == sc.ROLE_PREFILL else SIM_D,
            attrs=attrs,
            resource=_engine_resource(engine_id, role),
        )

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
    ):
        attrs = {
            **ident,
            sc.ENGINE_ID: engine_id,
            sc.ENGINE_ROLE: role,
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
        return self.span(
            sc.SPAN_KV_DECISION,
            at_ms,
            end_ms,
            parent=parent,
            service=SIM_P if role == sc.ROLE_PREFILL else SIM_D,
            attrs=attrs,
            resource=_engine_resource(engine_id, role),
        )

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
            **ident,
            sc.ENGINE_ID: engine_id,
            sc.ENGINE_ROLE: role,
            sc.KV_DIRECTION: direction,
            sc.KV_TRANSFER_TOKENS: tokens,
            sc.KV_TRANSFER_BLOCKS: blocks,
            sc.KV_TRANSFER_BYTES: blocks * block_size * bytes_per_token,
            sc.KV_TRANSFER_XFER_MS: float(end_ms - start_ms),
            sc.KV_TRANSFER_STATUS: status,
        }
        if peer:
            attrs[sc.KV_PEER_ENGINE_ID] = peer
        return self.span(
            sc.SPAN_KV_TRANSFER,
            start_ms,
            end_ms,
            parent=parent,
            service=SIM_P if role == sc.ROLE_PREFILL else SIM_D,
            attrs=attrs,
            resource=_engine_resource(engine_id, role),
            error=status != sc.TRANSFER_OK,
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
            **ident,
            sc.ENGINE_ID: engine_id,
            sc.ENGINE_ROLE: sc.ROLE_DECODE,
            sc.KV_RETENTION_BLOCKS: blocks,
            sc.KV_RETENTION_TOKENS: tokens,
            sc.KV_RETENTION_BYTES: blocks * block_size * bytes_per_token,
            sc.KV_RETENTION_TTL_S: ttl_s,
            sc.KV_RETENTION_OUTCOME: outcome,
        }
        return self.span(
            sc.SPAN_KV_RETENTION,
            start_ms,
            end_ms,
            parent=parent,
            service=SIM_D,
            attrs=attrs,
            resource=_engine_resource(engine_id, sc.ROLE_DECODE),
        )

    def call(
        self,
        session_id: str,
        turn: int,
        request_id: str,
        start_ms: float,
        *,
        parent=None,
        prompt: int = 1000,
        local_hit: int = 0,
        remote: int = 0,
        pulled: int = 0,
        outcome: str | None = None,
        prefill_ms: float = 100.0,
        xfer_ms: float = 0.0,
        decode_ms: float = 200.0,
        output_tokens: int = 20,
        retention_end_ms: float | None = None,
        retention_outcome: str = sc.RETENTION_READ,
        p_engine: str = "sim-p0",
        d_engine: str = "sim-d0",
        request_attrs: dict | None = None,
    ) -> Call:
        """One LLM call's full tree.  Times: P's prefill (including ``xfer_ms`` of pulling) takes
        ``prefill_ms``, then D pulls P's blocks (5 ms), first token, decode for ``decode_ms``."""
        ttft = prefill_ms + 10.0
        end = start_ms + ttft + decode_ms
        llm = self.llm_call(
            session_id,
            turn,
            start_ms,
            end + 1,
            ttft + 1,
            parent=parent,
            request_id=request_id,
            input_tokens=prompt,
            output_tokens=output_tokens,
            outcome=outcome,
        )
        req = self.request(
            session_id,
            turn,
            request_id,
            start_ms + 0.5,
            end + 0.5,
            ttft,
            parent=llm,
            offered=remote > 0,
            offer_reason=sc.OFFER_OFFERED if remote else sc.OFFER_NO_ENTRY,
            outcome=outcome,
            pulled=pulled,
            input_tokens=prompt,
            output_tokens=output_tokens,
            extra=request_attrs,
        )
        ident = {sc.GEN_AI_REQUEST_ID: request_id, sc.SESSION_ID: session_id, sc.TURN_INDEX: turn}
        t = start_ms + 1
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
            recomputed = prompt - local_hit - pulled
            dec = self.decision(
                p_engine,
                sc.ROLE_PREFILL,
                ident,
                t + 0.2,
                t + 0.2 + xfer_ms,
                parent=peng,
                direction=sc.DIRECTION_D2P,
                outcome=outcome,
                prompt=prompt,
                local_hit=local_hit,
                remote=remote,
                pulled=pulled,
                recomputed=recomputed,
                peer=d_engine,
            )
            if pulled:
                self.transfer(
                    p_engine,
                    sc.ROLE_PREFILL,
                    ident,
                    t + 0.2,
                    t + 0.2 + xfer_ms,
                    parent=dec,
                    direction=sc.DIRECTION_D2P,
                    tokens=pulled,
                    peer=d_engine,
                )
        t2 = t + prefill_ms
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
        dec2 = self.decision(
            d_engine,
            sc.ROLE_DECODE,
            ident,
            t2 + 0.2,
            t2 + 5.2,
            parent=deng,
            direction=sc.DIRECTION_P2D,
            outcome=sc.OUTCOME_PULLED,
            prompt=prompt,
            local_hit=0,
            remote=prompt,
            pulled=prompt,
            recomputed=0,
            peer=p_engine,
        )
        self.transfer(
            d_engine,
            sc.ROLE_DECODE,
            ident,
            t2 + 0.2,
            t2 + 5.2,
            parent=dec2,
            direction=sc.DIRECTION_P2D,
            tokens=prompt,
            peer=p_engine,
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
        return Call(llm, req, ret)

    def write(self, directory: str | os.PathLike, writer: str = "synth") -> int:
        """Write every finished span into ``directory`` (Hive date/hour partitions); returns the count."""
        from kvtrace.store.convert import spans_to_table

        spans = list(self.exporter.get_finished_spans())
        if spans:
            self._seq += len(write_table(spans_to_table(spans), directory, writer, self._seq))
        self.exporter.clear()
        return len(spans)


def _engine_resource(engine_id: str, role: str) -> dict:
    return {sc.ENGINE_ID: engine_id, sc.ENGINE_ROLE: role, sc.SUBSTRATE: sc.SUBSTRATE_SIM}


def write_table(tbl, directory: str | os.PathLike, writer: str = "synth", seq: int = 1) -> list[str]:
    """Write a SCHEMA table into ``directory``, one file per UTC date/hour partition of Timestamp,
    named like the exporter's batch files (so the store's file listing reads them)."""
    import numpy as np
    import pyarrow as pa
    import pyarrow.compute as pc
    import pyarrow.parquet as pq

    from kvtrace.store.files import batch_name

    paths = []
    hours = pc.floor_temporal(tbl["Timestamp"], unit="hour")
    order = pc.sort_indices(hours)  # stable: each partition keeps the table's row order
    tbl, hours = tbl.take(order), hours.take(order)
    values, starts = np.unique(hours.cast("int64").to_numpy(), return_index=True)
    bounds = [*starts.tolist(), tbl.num_rows]
    for i, hour in enumerate(pa.array(values).cast(hours.type).to_pylist()):
        part = tbl.slice(bounds[i], bounds[i + 1] - bounds[i])
        sub = os.path.join(os.fspath(directory), f"date={hour:%Y-%m-%d}", f"hour={hour:%H}")
        os.makedirs(sub, exist_ok=True)
        path = os.path.join(sub, batch_name(writer, seq + i))
        pq.write_table(part, path)
        paths.append(path)
    return paths


SAMPLE_PAUSE_MS = 400.0


def sample_store(directory: str | os.PathLike, sessions: int = 3, turns: int = 4, *, pull: bool = True) -> int:
    """A small complete store (agent → proxy → P/D spans, reuse, retention, tool waits, app work,
    a user pause before every turn but the first) for dashboard and report tests; ``pull=False``
    writes the same workload without reuse (baseline)."""
    b = SpanBuilder()
    for i in range(sessions):
        sid = f"session-{i}"
        t = i * 60_000.0
        sess_start = t
        spans = []
        prompt = 800
        for turn in range(turns):
            if turn:
                t += SAMPLE_PAUSE_MS  # the user reads the answer and thinks
            tr_start = t
            reuse_it = pull and turn > 0
            remote = prompt - 200 if turn > 0 else 0
            outcome = None if turn == 0 else (sc.OUTCOME_PULLED if reuse_it else sc.OUTCOME_NO_REMOTE)
            pulled = remote if reuse_it else 0
            prefill = 40.0 + (prompt - pulled) * 0.05
            spans.append((turn, tr_start, prompt, remote, pulled, outcome, prefill))
            t += prefill + 30 + 200 + 120 + 300  # call, tool, app work
            prompt += 600 + 100 * i
        end = t + 50
        sess = b.session(sid, sess_start, end, scenario="coding-agent")
        for k, (turn, tr_start, prompt, remote, pulled, outcome, prefill) in enumerate(spans):
            last = k == len(spans) - 1
            next_start = spans[k + 1][1] if not last else None
            tr_end = spans[k + 1][1] - SAMPLE_PAUSE_MS if not last else end - 10
            tr = b.turn(sid, turn, tr_start, tr_end, parent=sess)
            if not last:
                b.user_pause(sid, None, tr_end, next_start, parent=sess)
            call = b.call(
                sid,
                turn,
                f"{sid}-r{turn}",
                tr_start + 5,
                parent=tr,
                prompt=prompt,
                remote=remote,
                pulled=pulled,
                outcome=outcome,
                prefill_ms=prefill,
                xfer_ms=2 + pulled * 0.002,
                decode_ms=200,
                retention_end_ms=(next_start + 6) if (pull and not last) else (end + (480_000 if pull else 30)),
                retention_outcome=sc.RETENTION_READ
                if (pull and not last)
                else (sc.RETENTION_EXPIRED if pull else sc.RETENTION_RELEASED),
                request_attrs={
                    sc.SESSION_SOURCE: sc.SOURCE_CONVERSATION_ID,
                    sc.SESSION_CONTINUITY: sc.CONTINUITY_EXTENDS if turn else sc.CONTINUITY_NEW,
                },
            )
            t_tool = tr_start + 5 + prefill + 10 + 200 + 5
            b.tool(sid, turn, t_tool, t_tool + 120, parent=tr)
            b.app_work(sid, turn, t_tool + 125, t_tool + 300, parent=tr)
            del call
    return b.write(directory)


TILED_IDS = (sc.SESSION_ID, sc.GEN_AI_CONVERSATION_ID, sc.GEN_AI_REQUEST_ID, sc.KV_REMOTE_REQUEST_ID)
"""Attributes :func:`tile` makes unique per copy (suffix ``-<copy>``)."""


def tile(template, copies, offsets_ns):
    """Copies of a store table (SCHEMA), one per entry of ``copies`` (ints): every time shifted by
    the copy's ``offsets_ns``, trace and span ids prefixed with the copy number (hex) and the
    session / request ids of :data:`TILED_IDS` suffixed with it, so copies are distinct sessions
    of the same shape.  Vectorised: the benchmarks tile :func:`sample_store`'s SDK-made spans to
    tens of millions."""
    import numpy as np
    import pyarrow as pa
    import pyarrow.compute as pc

    copies, offsets_ns = np.asarray(copies, dtype=np.int64), np.asarray(offsets_ns, dtype=np.int64)
    n, k = template.num_rows, len(copies)
    row_copy = np.repeat(np.arange(k, dtype=np.int32), n)  # position in ``copies`` of each row
    big = pa.concat_tables([template] * k).combine_chunks()
    cols = {name: big[name].chunk(0) if big[name].num_chunks else big[name] for name in big.column_names}
    shift = pa.array(np.repeat(offsets_ns, n)).cast(pa.duration("ns"))
    cols["Timestamp"] = pc.add(cols["Timestamp"], shift)
    ev = cols["Events.Timestamp"]
    ev_shift = pa.array(np.repeat(offsets_ns[row_copy], np.diff(ev.offsets.to_numpy()))).cast(pa.duration("ns"))
    cols["Events.Timestamp"] = pa.ListArray.from_arrays(ev.offsets, pc.add(ev.flatten(), ev_shift))
    for name, width in (("TraceId", 8), ("SpanId", 6), ("ParentSpanId", 6)):
        prefix = _per_copy([f"{c % 16**width:0{width}x}" for c in copies], row_copy)
        ids = cols[name]
        new = pc.binary_join_element_wise(prefix, pc.utf8_slice_codeunits(ids, width), "")
        cols[name] = pc.if_else(pc.equal(ids, ""), ids, new)
    m = cols["SpanAttributes"]
    keys, values = m.keys, m.items
    hit = pc.is_in(keys, value_set=pa.array(TILED_IDS, pa.string()))
    entry_copy = np.repeat(row_copy, np.diff(m.offsets.to_numpy()))  # (list_parent_indices crashes on maps)
    suffix = _per_copy([f"-{c}" for c in copies], entry_copy)
    values = pc.if_else(hit, pc.binary_join_element_wise(values, suffix, ""), values)
    cols["SpanAttributes"] = pa.MapArray.from_arrays(m.offsets, keys, values)
    return pa.table(cols, schema=template.schema)


def _per_copy(strings: list[str], index):
    """``strings[index[i]]`` for every i, as an Arrow string array (dictionary-decoded: no Python loop)."""
    import pyarrow as pa

    return pa.DictionaryArray.from_arrays(pa.array(index, pa.int32()), pa.array(strings, pa.string())).cast(pa.string())
