"""A small multi-day trace store whose sessions, turns and traces cross files, hour and day
partitions and inserts: the equivalence store of issue #40 (answers from raw spans, from DuckDB's
per-file partials and from ClickHouse's materialized tables must be the same rows on it).

    from support import multiday
    traces = multiday.build(tmp_path, days=3)          # a kvtrace Parquet trace directory
    ch = multiday.load_chdb(traces)                    # the same spans in chDB, in two inserts

What :func:`build` writes (``days`` UTC days from :data:`kvtrace.testing.synth.BASE_NS`; about
400 spans a day):

- **kvtrace's own agents** (:func:`~kvtrace.testing.synth.sample_store`'s sessions, tiled: agent ->
  proxy -> P/D engines, KV decisions, transfers, retention) twice a day: at 09:00, and at 14:59:58,
  where the first session crosses into the next hour's partition (and file);
- **a session across midnight** at every day boundary: ``midnight-<d>``, 23:58 -> 00:05, four
  turns, one turn, an LLM call, a tool wait and a retention crossing 00:00; its turns go to two P
  workers (the proxy's endpoints and routes), break continuity once (the turn across midnight) and
  carry each verification outcome of P's check of D's offer (a mismatch across midnight); and a
  request of no session (a bare vLLM P's: ``bare-<d>``), away from every session, whose prefill
  starts before 03:00 and whose decision and pull after it, beside a retention naming no request
  (02:59 -> 03:01);
- **agents of other conventions** (:mod:`support.agent_conventions`: OpenInference, LangGraph's
  request that joins its session only by time, OTel GenAI, OpenLLMetry) once a day, tiled (ids
  suffixed ``-<copy>``): across midnight (11 s before it: an OpenInference run's trace crosses
  00:00) at each boundary, at 10:00 on the last day;
- **late spans**: day 0's tool-call and retention spans are not in their partition's first file but
  in a file written after all others (a higher sequence number, a later mtime), as a late exporter
  batch would land;
- **a trace in two files**: the first 09:00 session's trace (day 0) has every other span in a second
  file of the same partition.

:func:`load_chdb` loads a directory into an exporter table (:mod:`kvtrace.store.clickhouse.load`) in
several inserts, so a session's spans are in two parts (or one insert per file, the exporter's way),
optionally running a callback (e.g. ``kvtrace clickhouse init``) on the empty table first, so that
materialized views see the inserts live.
"""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from kvtrace import semconv as sc
from kvtrace.store.files import list_files
from kvtrace.store.schema import SCHEMA
from kvtrace.testing.synth import BASE_NS, SpanBuilder, sample_store, tile, write_table

from support import agent_conventions

MS = 10**6
HOUR_NS = 3_600 * 10**9
DAY_NS = 24 * HOUR_NS
SAMPLE_AT = (9 * HOUR_NS, 15 * HOUR_NS - 2_000 * MS)  # the tiled sessions' starts within a day
CONVENTIONS_BEFORE_MIDNIGHT = 11_000 * MS  # the OpenInference run at +10 s crosses 00:00
CONVENTIONS_LAST_DAY_AT = 10 * HOUR_NS
MIDNIGHT_START = 2 * 60_000  # ms before midnight
WRITER = "synth"


def day_range(day: int) -> tuple[int, int]:
    """``[start, end]`` (epoch ns, both included) of UTC day ``day`` of the store."""
    return BASE_NS + day * DAY_NS, BASE_NS + (day + 1) * DAY_NS - 1


def midnight_session(day: int) -> str:
    """The id of the session that crosses from day ``day`` into day ``day + 1``."""
    return f"midnight-{day}"


def build(root: str | os.PathLike, days: int = 3) -> Path:
    """Write the store (module doc) into ``root/traces``; returns that directory."""
    if days < 1:
        raise ValueError("days must be at least 1")
    root = Path(root)
    spans = pa.concat_tables([_sampled(root, days), _midnights(days), _conventions(root, days)])
    return _write(spans, root / "traces")


def _read(directory: Path) -> pa.Table:
    return pa.concat_tables(pq.read_table(p, schema=SCHEMA) for p in list_files(directory))


def _sampled(root: Path, days: int) -> pa.Table:
    """kvtrace's sample sessions, tiled twice a day (copies ``2d`` and ``2d + 1``)."""
    sample_store(root / "sample-template", sessions=2, turns=3)
    copies = np.arange(2 * days)
    offsets = np.array([d * DAY_NS + at for d in range(days) for at in SAMPLE_AT])
    return tile(_read(root / "sample-template"), copies, offsets)


def _conventions(root: Path, days: int) -> pa.Table:
    """Other conventions' agents once a day (copies ``100 + d``), module doc."""
    agent_conventions.build(root / "conventions-template")
    copies = np.arange(100, 100 + days)
    offsets = np.array(
        [(d + 1) * DAY_NS - CONVENTIONS_BEFORE_MIDNIGHT for d in range(days - 1)]
        + [(days - 1) * DAY_NS + CONVENTIONS_LAST_DAY_AT]
    )
    return tile(_read(root / "conventions-template"), copies, offsets)


def _midnights(days: int) -> pa.Table:
    """One kvtrace session across each day boundary (23:58 -> 00:05)."""
    from kvtrace.store.convert import spans_to_table

    tables = []
    for d in range(days - 1):
        b = SpanBuilder(base_ns=BASE_NS + (d + 1) * DAY_NS - MIDNIGHT_START * MS)
        _long_session(b, midnight_session(d))
        _bare_request(b, d)
        tables.append(spans_to_table(list(b.exporter.get_finished_spans())))
    return pa.concat_tables(tables).cast(SCHEMA) if tables else SCHEMA.empty_table()


# (turn start, LLM call start, tool start, tool end, turn end), ms after the session's start
# (midnight is at MIDNIGHT_START = 120 000): turn 1, its LLM call and its tool cross midnight
_TURNS = (
    (0, 5, 1_000, 50_000, 60_000),
    (100_000, 119_800, 100_020, 130_000, 160_000),
    (200_000, 200_005, 201_000, 250_000, 300_000),
    (330_000, 330_005, 331_000, 400_000, 415_000),
)
_SESSION_END = 420_000
# per turn: (continuity, P worker, why it was chosen, P's check of D's offer)
_ROUTED = (
    (sc.CONTINUITY_NEW, 0, sc.ROUTE_ROTATION, None),
    (sc.CONTINUITY_DIVERGED, 1, sc.ROUTE_LEAST_LOADED, sc.VERIFIED_MISMATCH),
    (sc.CONTINUITY_EXTENDS, 0, sc.ROUTE_LAST_PREFILL, sc.VERIFIED_MATCH),
    (sc.CONTINUITY_EXTENDS, 1, sc.ROUTE_ROTATION, sc.VERIFIED_UNVERIFIABLE),
)


def _routed(turn: int) -> tuple[dict, dict, str]:
    """The proxy request's and P's decision's attributes of turn ``turn`` (:data:`_ROUTED`), and its P."""
    continuity, p, route, verified = _ROUTED[turn]
    request = {
        sc.SESSION_CONTINUITY: continuity,
        sc.PROXY_PREFILL_ENDPOINT: f"http://127.0.0.1:810{p}",
        sc.PROXY_DECODE_ENDPOINT: "http://127.0.0.1:8200",
        sc.ROUTE_PREFILL_REASON: route,
        sc.ROUTE_DECODE_REASON: sc.ROUTE_HOLDER if turn else sc.ROUTE_ROTATION,
    }
    if continuity == sc.CONTINUITY_DIVERGED:
        request |= {sc.SESSION_DIVERGED_AT: 2, sc.SESSION_REUSABLE_TOKENS_LOST: 600}
    decision = {} if verified is None else {sc.KV_VERIFIED: verified, sc.KV_VERIFY_MODE: sc.VERIFY_RECORD}
    if verified == sc.VERIFIED_MISMATCH:
        decision |= {sc.KV_VERIFY_MISMATCH_TOKEN: 512, sc.KV_VERIFY_WRONG_TOKENS: 88}
    return request, decision, f"sim-p{p}"


def bare_request(day: int) -> str:
    """The id of the request of no session across 03:00 after day ``day``."""
    return f"bare-{day}"


def _bare_request(b: SpanBuilder, day: int) -> None:
    """P's spans of a request no session names: its prefill from 0.2 s before 03:00, its decision
    and pull 0.1 s after it (no session is open then); and a retention on D naming no request."""
    ident = {sc.GEN_AI_REQUEST_ID: bare_request(day), sc.TURN_INDEX: 0}
    at, p, d = MIDNIGHT_START + 3 * HOUR_NS // MS - 200, "sim-p0", "sim-d0"
    eng = b.engine(sc.ROLE_PREFILL, p, ident, at, at + 400, parent=None, prompt_tokens=2000, cached_tokens=1600)
    dec = b.decision(
        p,
        sc.ROLE_PREFILL,
        ident,
        at + 300,
        at + 340,
        parent=eng,
        direction=sc.DIRECTION_D2P,
        outcome=sc.OUTCOME_PULLED,
        prompt=2000,
        local_hit=0,
        remote=1600,
        pulled=1600,
        recomputed=400,
        peer=d,
    )
    x = sc.DIRECTION_D2P
    b.transfer(p, sc.ROLE_PREFILL, ident, at + 300, at + 340, parent=dec, direction=x, tokens=1600, peer=d)
    # D's blocks of another request it names no id of, held from a minute before to a minute after
    gone = sc.RETENTION_EXPIRED
    b.retention(d, {sc.TURN_INDEX: 0}, at - 60_000, at + 60_000, parent=None, tokens=2000, outcome=gone)


def _long_session(b: SpanBuilder, sid: str) -> None:
    sess = b.session(sid, 0, _SESSION_END, scenario="coding-agent")
    prompt = 900
    for turn, (start, call_at, tool_s, tool_e, end) in enumerate(_TURNS):
        tr = b.turn(sid, turn, start, end, parent=sess)
        last = turn == len(_TURNS) - 1
        nxt = None if last else _TURNS[turn + 1][0]
        if nxt is not None:
            b.user_pause(sid, None, end, nxt, parent=sess)
        pulled = prompt - 300 if turn else 0
        request_attrs, decision_attrs, p_engine = _routed(turn)
        b.call(
            sid,
            turn,
            f"{sid}-r{turn}",
            call_at,
            parent=tr,
            prompt=prompt,
            remote=pulled,
            pulled=pulled,
            outcome=sc.OUTCOME_PULLED if turn else None,
            prefill_ms=60.0 + turn * 5,
            xfer_ms=3.0 if turn else 0.0,
            decode_ms=400.0,
            retention_end_ms=(nxt + 6) if nxt is not None else _SESSION_END + 300_000,
            retention_outcome=sc.RETENTION_EXPIRED if last else sc.RETENTION_READ,
            p_engine=p_engine,
            request_attrs=request_attrs,
            decision_attrs=decision_attrs,
        )
        b.tool(sid, turn, tool_s, tool_e, parent=tr)
        b.app_work(sid, turn, tool_e + 50, end - 100, parent=tr)
        prompt += 700


def _write(spans: pa.Table, directory: Path) -> Path:
    """The spans in their hour partitions; day 0's late spans and the split trace's other half in
    later files (module doc)."""
    day0_end = BASE_NS + DAY_NS
    ts = pc.cast(spans["Timestamp"], pa.int64())
    late = pc.and_(
        pc.less(ts, day0_end),
        pc.is_in(spans["SpanName"], value_set=pa.array([sc.SPAN_AGENT_TOOL_CALL, sc.SPAN_KV_RETENTION])),
    )
    split_trace = _first_trace_at(spans, BASE_NS + SAMPLE_AT[0])
    odd = pa.array(np.arange(spans.num_rows) % 2 == 1)
    second_file = pc.and_(pc.and_(pc.equal(spans["TraceId"], split_trace), odd), pc.invert(late))
    first = pc.and_(pc.invert(late), pc.invert(second_file))
    seq = 1
    written = []
    for mask in (first, second_file, late):
        paths = write_table(spans.filter(mask), directory, WRITER, seq)
        seq += len(paths)
        written.append(paths)
    mtime = max(os.stat(p).st_mtime for p in written[0] + written[1]) + 60
    for path in written[2]:  # written last: a later mtime too, whatever the clock's resolution
        os.utime(path, (mtime, mtime))
    return directory


def _first_trace_at(spans: pa.Table, start_ns: int) -> str:
    """The trace of the first span starting at ``start_ns`` (a tiled session's root)."""
    at = pc.equal(pc.cast(spans["Timestamp"], pa.int64()), start_ns)
    return spans.filter(at)["TraceId"][0].as_py()


def load_chdb(directory, backend=None, table: str | None = None, *, parts: int | None = 2, before_insert=None):
    """``directory``'s spans in a new exporter table (a :class:`~kvtrace.store.clickhouse.store.ClickHouseStore`
    over it): ``parts`` inserts of interleaved rows (every session and trace in each part), or with
    ``parts=None`` one insert per file in file order (the late file last).  ``before_insert(backend,
    table)`` runs on the empty table first.  Needs chDB."""
    from kvtrace.store.clickhouse import load
    from kvtrace.store.clickhouse.store import ClickHouseStore

    from support import clickhouse_check

    backend = backend or clickhouse_check.chdb_backend()
    table = table or f"kvtrace_check.multiday{os.getpid()}_{next(clickhouse_check._tables)}"
    load.create_table(backend, table)
    if before_insert is not None:
        before_insert(backend, table)
    files = list_files(directory)
    if parts is None:
        batches = [load.exporter_table(pq.read_table(p, schema=SCHEMA)) for p in _by_write_order(files)]
    else:
        rows = load.exporter_table(_read(Path(directory)))
        batches = [rows.take(np.arange(k, rows.num_rows, parts)) for k in range(parts)]
    settings = load.exporter_settings(backend)  # as the exporter inserts: ClickHouse's defaults
    for batch in batches:
        if batch.num_rows:
            load.insert(backend, table, batch, settings)
    return ClickHouseStore(backend, table)


def _by_write_order(files: list[str]) -> list[str]:
    return sorted(files, key=lambda p: (os.stat(p).st_mtime, os.path.basename(p), p))
