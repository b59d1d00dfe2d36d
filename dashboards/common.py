"""Shared dashboard plumbing: configuration, the cached store connection, cached queries, filters.

Pages call :func:`q` with a :mod:`kvtrace.analysis` function; they never build SQL.  One DuckDB
connection per trace directory lives in ``st.cache_resource``; each query runs on its own
``cursor()`` (safe across Streamlit's script threads) and its result is kept in
``st.cache_data`` until the user presses *Refresh* (which re-lists the directory's files).
"""

from __future__ import annotations

import argparse
import datetime as dt
import sys

import altair as alt
import streamlit as st

from kvtrace import settings
from kvtrace.analysis import sessions
from kvtrace.analysis.filters import Filters
from kvtrace.store import connect
from kvtrace.store.runs import traces_dir

ALL = "(all)"
PART_LABELS = {
    "input_processing_ms": "input processing",
    "generation_ms": "generation",
    "tool_wait_ms": "tool waits",
    "app_work_ms": "app work",
}


# Fit the container's width only: a chart's ``height`` (number or ``alt.Step``) is its plot area's.
FIT_WIDTH = alt.AutoSizeParams(type="fit-x", contains="padding")


def config() -> dict:
    """``--traces`` / ``--compare`` after ``streamlit run app.py --``, else KVTRACE_TRACES_DIR /
    KVTRACE_COMPARE_DIR, else ./kvtrace-traces and no comparison."""
    parser = argparse.ArgumentParser(add_help=False, allow_abbrev=False)
    parser.add_argument("--traces")
    parser.add_argument("--compare")
    args, _ = parser.parse_known_args(sys.argv[1:])
    return {"traces": traces_dir(args.traces), "compare": settings.COMPARE_DIR.get(args.compare)}


@st.cache_resource(show_spinner=False)
def store(directory: str):
    """The connection for ``directory`` (views over its files; empty views when there are none)."""
    return connect(directory, allow_empty=True)


def refresh(directory: str) -> None:
    """Re-list ``directory``'s files and drop every cached result."""
    from kvtrace.store.reader import refresh as relist

    relist(store(directory))
    st.cache_data.clear()


@st.cache_data(show_spinner=False, max_entries=512)
def _cached(directory: str, module: str, name: str, args: tuple, kwargs: tuple):
    import importlib

    fn = getattr(importlib.import_module(module), name)
    return fn(store(directory).cursor(), *args, **dict(kwargs))


def q(fn, directory: str, *args, **kwargs):
    """``fn(cursor, *args, **kwargs)`` on ``directory``'s store, cached.  A directory the store
    refuses (several runs) stops the page with the store's message."""
    from kvtrace.store.reader import StoreError

    try:
        return _cached(directory, fn.__module__, fn.__name__, args, tuple(sorted(kwargs.items())))
    except StoreError as exc:
        st.error(str(exc))
        st.stop()


def df(table):
    """Arrow table → pandas DataFrame (what Altair and st.dataframe like best)."""
    return table.to_pandas() if hasattr(table, "to_pandas") else table


def chart(target, altair_chart) -> None:
    """Draw ``altair_chart`` on ``target`` (``st`` or a column) at the container's width.

    Every page draws its charts through here.  A spec without ``autosize`` gets Streamlit's
    ``{"type": "fit", "contains": "padding"}``, which squeezes the whole view (title, axes, axis
    titles, legend) into ``height``: a short chart keeps about 1 px for its data (horizontal bars
    collapse onto one line, their labels overlap) and a legend taller than ``height`` is cut.
    ``fit-x`` fits only the width; the plot area gets ``height`` and the decorations come on top.
    """
    target.altair_chart(altair_chart.properties(autosize=FIT_WIDTH), width="stretch")


def ranked(frame, column: str, order: list[str]):
    """``frame`` with a ``rank`` column (position of ``column``'s value in ``order``) for ``alt.Order``,
    so stacks are drawn in legend order."""
    return frame.assign(rank=frame[column].map({v: i for i, v in enumerate(order)}))


def sidebar() -> tuple[str, Filters, dict]:
    """Trace directory, refresh, and the filters; returns (directory, filters, facets)."""
    cfg = config()
    with st.sidebar:
        directory = st.text_input("Trace directory", value=cfg["traces"], key="traces_dir")
        if st.button("Refresh", help="Re-read the directory (new Parquet files) and recompute"):
            refresh(directory)
        facets = q(sessions.facets, directory)
        st.caption(f"{facets['spans']:,} spans")
        filters = _filter_widgets(directory, facets)
    return directory, filters, facets


def _filter_widgets(directory: str, facets: dict) -> Filters:
    start_ns = end_ns = None
    t0, t1 = facets.get("start_ns"), facets.get("end_ns")
    if t0 is not None and t1 is not None and t1 - t0 >= 2_000_000_000:
        lo, hi = _dt(t0), _dt(t1) + dt.timedelta(seconds=1)
        chosen = st.slider("Time range (UTC)", min_value=lo, max_value=hi, value=(lo, hi), format="MM-DD HH:mm:ss",
                           step=dt.timedelta(seconds=1))
        if chosen != (lo, hi):
            start_ns, end_ns = _ns(chosen[0]), _ns(chosen[1])
    service = st.selectbox("Service", [ALL, *facets["services"]])
    substrate = st.selectbox("Substrate", [ALL, *facets["substrates"]])
    session = st.text_input("Session id", value="", help="Only this session (exact id); empty = all")
    return Filters(start_ns=start_ns, end_ns=end_ns, session_id=session.strip() or None,
                   service=None if service == ALL else service, substrate=None if substrate == ALL else substrate)


def _dt(ns: int) -> dt.datetime:
    return dt.datetime.fromtimestamp(ns // 1_000_000_000, tz=dt.timezone.utc).replace(tzinfo=None)


def _ns(value: dt.datetime) -> int:
    return int(value.replace(tzinfo=dt.timezone.utc).timestamp()) * 1_000_000_000


def no_data(facets: dict, directory: str) -> bool:
    """Show how to get data and return True when the store is empty."""
    if facets.get("spans"):
        return False
    st.info(f"No traces in `{directory}` yet. Write some with `kvtrace demo --traces {directory}` "
            "(or any kvtrace component with `--traces`), then press Refresh.")
    return True


def fmt_bytes(n: float | None) -> str:
    n = float(n or 0)
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(n) < 1024 or unit == "TiB":
            return f"{n:,.1f} {unit}" if unit != "B" else f"{n:,.0f} B"
        n /= 1024
    return f"{n:,.1f} TiB"


def fmt_ms(ms: float | None) -> str:
    if ms is None:
        return "–"
    return f"{ms / 1000:,.2f} s" if abs(ms) >= 1000 else f"{ms:,.1f} ms"
