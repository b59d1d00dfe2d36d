"""Whole stores for tests and benchmarks: :func:`sample_store`, a small complete one made with
:class:`~kvtrace.testing.synth.SpanBuilder`; :func:`write_table`, which lays a table out in the
store's partitions; :func:`tile`, which copies a table into many distinct sessions.

They live apart from :mod:`kvtrace.testing.synth` only to keep each module short, and synth.py
re-exports them, so ``from kvtrace.testing.synth import sample_store`` and the like still work.
synth.py imports this module at its top, so this one imports synth.py only inside
:func:`sample_store` (an import at this module's top would be a cycle).
"""

from __future__ import annotations

import os

from kvtrace import semconv as sc


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
    from kvtrace.testing.synth import SpanBuilder  # here, not at the top: synth.py imports this module

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
