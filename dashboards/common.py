"""Shared dashboard plumbing: configuration, the cached store connection, cached queries, filters.

Pages call :func:`q` with a :mod:`kvtrace.analysis` function; they never build SQL.  One DuckDB
connection per trace directory lives in ``st.cache_resource``; each query runs on its own
``cursor()`` (safe across Streamlit's script threads) and its result is kept in
``st.cache_data`` until the user presses *Refresh* (which re-lists the directory's files).
"""

from __future__ import annotations

import argparse
import datetime as dt
import os
import sys

import altair as alt
import pandas as pd
import streamlit as st

from kvtrace import semconv as sc
from kvtrace import settings
from kvtrace.analysis import palette, sessions
from kvtrace.analysis.filters import Filters
from kvtrace.store import connect, source
from kvtrace.store.runs import traces_dir
from kvtrace.store.units import GIB

ALL = "(all)"
PART_LABELS = palette.PART_LABELS  # breakdown column -> label, in stacking order


# Fit the container's width only: a chart's ``height`` (number or ``alt.Step``) is its plot area's.
FIT_WIDTH = alt.AutoSizeParams(type="fit-x", contains="padding")


CLICKHOUSE = "clickhouse:"
"""Prefix of the ClickHouse source key: ``clickhouse:TABLE URL`` (a trace directory is its own key).
Only the key :func:`config` builds from the command line opens ClickHouse (:func:`store`)."""
BACKEND_PREFIXES = (CLICKHOUSE, "chdb:")
"""Text a page's directory box refuses outright: backends are chosen at start, never on a page."""
DEFAULT_WINDOW_NS = 24 * 3600 * 10**9
"""ClickHouse: the time range the dashboard opens on (the last day of data), so the first page
reads that day, not the whole table."""
VIRTUAL_CAPTION = "Simulated time (virtual clock): every time and timestamp is the model's, wall ones included."


def config() -> dict:
    """``--traces`` / ``--compare`` / ``--clickhouse`` / ``--table`` after ``streamlit run app.py --``,
    else KVTRACE_TRACES_DIR / KVTRACE_COMPARE_DIR / KVTRACE_CLICKHOUSE / KVTRACE_CLICKHOUSE_TABLE,
    else ./kvtrace-traces and no comparison.  ``source`` is the key pages pass to :func:`q`.
    This is everything the dashboard may open: nothing a page sends adds to it."""
    parser = argparse.ArgumentParser(add_help=False, allow_abbrev=False)
    for option in ("--traces", "--clickhouse", "--table", "--compare"):  # what the launcher passes
        parser.add_argument(option)
    args, _ = parser.parse_known_args(sys.argv[1:])
    url = source.clickhouse_url(args)
    table = source.clickhouse_table(args)
    return {
        "traces": traces_dir(args.traces),
        "compare": settings.COMPARE_DIR.get(args.compare),
        "source": f"{CLICKHOUSE}{table} {url}" if url else None,
        "clickhouse": (url, table) if url else None,
        "label": source.describe(args),
    }


def is_clickhouse(key: str) -> bool:
    """Whether ``key`` is the ClickHouse source the dashboard was started with (no other text is)."""
    source_key = config()["source"]
    return source_key is not None and key == source_key


@st.cache_resource(show_spinner=False)
def store(key: str):
    """The connection for a source key: the ClickHouse table given at start (:func:`config`), or a
    trace directory within the started roots (:func:`refusal`), whose DuckDB connection reads no
    file outside it (:func:`kvtrace.store.reader.lock_down`; empty views when there are none).
    Any other key is a :class:`~kvtrace.store.reader.StoreError`, and nothing is opened."""
    from kvtrace.store.reader import StoreError

    if is_clickhouse(key):
        url, table = config()["clickhouse"]
        return source.open_store(argparse.Namespace(clickhouse=url, table=table))
    why = refusal(key, "Trace directory")
    if why:
        raise StoreError(why)
    return connect(key, allow_empty=True, read_only=True)


def refresh(key: str) -> None:
    """Re-list a directory's files (a ClickHouse table: check its materialized tables again) and drop
    every cached result."""
    from kvtrace.store.reader import refresh as relist

    if is_clickhouse(key):
        store(key).refresh()
    else:
        relist(store(key))
    st.cache_data.clear()


@st.cache_data(show_spinner=False, max_entries=512)
def _cached(directory: str, module: str, name: str, args: tuple, kwargs: tuple):
    import importlib

    fn = getattr(importlib.import_module(module), name)
    return fn(store(directory).cursor(), *args, **dict(kwargs))


def q(fn, directory: str, *args, **kwargs):
    """``fn(cursor, *args, **kwargs)`` on ``directory``'s store, cached.  A directory the store
    refuses (several runs) stops the page with the store's message."""
    from kvtrace.store.clickhouse import ClickHouseError
    from kvtrace.store.reader import StoreError

    try:
        return _cached(directory, fn.__module__, fn.__name__, args, tuple(sorted(kwargs.items())))
    except (StoreError, ClickHouseError) as exc:
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


def part_colours() -> alt.Scale:
    """The breakdown parts' colours (:mod:`kvtrace.analysis.palette`, as in the report)."""
    return alt.Scale(domain=palette.labels(palette.PARTS), range=palette.colours(palette.PARTS))


def source_colours() -> alt.Scale:
    """P's token sources' colours (:mod:`kvtrace.analysis.palette`, as in the report)."""
    return alt.Scale(domain=palette.labels(palette.SOURCES), range=palette.colours(palette.SOURCES))


def ranked(frame, column: str, order: list[str]):
    """``frame`` with a ``rank`` column (position of ``column``'s value in ``order``) for ``alt.Order``,
    so stacks are drawn in legend order."""
    return frame.assign(rank=frame[column].map({v: i for i, v in enumerate(order)}))


def allowed_roots() -> list[str]:
    """The directories the dashboard was started with (``--traces``, ``--compare``), resolved."""
    cfg = config()
    return [os.path.realpath(d) for d in (cfg["traces"], cfg["compare"]) if d]


def inside_roots(path: str, roots: list[str]) -> bool:
    """Whether ``path`` (symlinks resolved) is one of ``roots`` or below one."""
    real = os.path.realpath(path)
    return any(os.path.commonpath([real, root]) == root for root in roots)


def refusal(path: str, label: str) -> str | None:
    """Why a page may not open ``path``, or None: it must be a directory path (a backend such as
    ``clickhouse:...`` or ``chdb:...`` is chosen at start, never typed on a page) within a
    directory the dashboard was started with."""
    roots = allowed_roots()
    if path.strip().lower().startswith(BACKEND_PREFIXES) or "://" in path:
        return (
            f"{label} `{path}` is not a directory: this page opens only trace directories below the ones "
            "the dashboard was started with; a ClickHouse table is chosen at start "
            "(`kvtrace dashboard --clickhouse URL --table T`)."
        )
    if not inside_roots(path, roots):
        return (
            f"{label} `{path}` is outside the trace directories this dashboard was started with "
            f"({', '.join(f'`{r}`' for r in roots)}); choose one of them or a directory below it."
        )
    return None


def checked_dir(path: str, label: str) -> str:
    """``path`` when a page may open it (:func:`refusal`); otherwise say why and stop the page: a
    text box must not open any path on the server, nor make it connect anywhere."""
    why = refusal(path, label)
    if why:
        st.error(why)
        st.stop()
    return path


def sidebar() -> tuple[str, Filters, dict]:
    """Source (trace directory or ClickHouse table), refresh, and the filters; returns (source
    key, filters, facets).  The page opens on the last day of data (:data:`DEFAULT_WINDOW_NS`), so
    what it reads grows with a day's sessions, not with the history kept, and every session-scoped
    filter is pushed down (:mod:`kvtrace.analysis.pushdown`); on ClickHouse the facets are the
    range's, on DuckDB the store's (merged from the files' lookups)."""
    cfg = config()
    with st.sidebar:
        if cfg["source"]:
            directory = cfg["source"]
            st.caption(f"ClickHouse: {cfg['label']}")
        else:
            directory = st.text_input(
                "Trace directory",
                value=cfg["traces"],
                key="traces_dir",
                help="The directory given at start, or a directory below it",
            )
            directory = checked_dir(directory, "Trace directory")
        if st.button("Refresh", help="Re-read the source (new spans) and recompute"):
            refresh(directory)
        if is_clickhouse(directory):
            _shaped_note(directory, cfg["clickhouse"][0])
            span = q(sessions.time_span, directory)
            window = _time_widget(span.get("start_ns"), span.get("end_ns"), DEFAULT_WINDOW_NS)
            facets = {**q(sessions.facets, directory, Filters(*window)), "spans": span["spans"]}
        else:  # the store's facets merged from its files' (no raw span); the page opens on the last day too
            facets = q(sessions.facets, directory)
            window = _time_widget(facets.get("start_ns"), facets.get("end_ns"), DEFAULT_WINDOW_NS)
        st.caption(f"{facets['spans']:,} spans")
        if sc.CLOCK_VIRTUAL in q(sessions.clocks, directory, tuple(facets["substrates"])):
            st.caption(VIRTUAL_CAPTION)
        filters = _filter_widgets(facets, window)
    return directory, filters, facets


def _shaped_note(directory: str, url: str) -> None:
    """One line, when the table lacks kvtrace's current materialized tables: every page then reads
    the raw table (slower, same answers), and this says how to add them."""
    from kvtrace.store.clickhouse import mviews
    from kvtrace.store.clickhouse.backend import redact

    note = q(mviews.note, directory, redact(url))
    if note:
        st.caption(note)


def _time_widget(t0: int | None, t1: int | None, default_ns: int | None) -> tuple[int | None, int | None]:
    """The time range slider (UTC, whole seconds) over ``[t0, t1]``, set to the last ``default_ns``
    (None: all); (start_ns, end_ns) of the choice, (None, None) for all of it."""
    if t0 is None or t1 is None or t1 - t0 < 2_000_000_000:
        return None, None
    lo, hi = _dt(t0), _dt(t1) + dt.timedelta(seconds=1)
    first = lo if default_ns is None else max(lo, _dt(t1 - default_ns))
    st.html(SLIDER_CSS)
    chosen = st.slider(
        "Time range (UTC)",
        min_value=lo,
        max_value=hi,
        value=(first, hi),
        format="MM-DD HH:mm:ss",
        step=dt.timedelta(seconds=1),
    )
    st.caption(f"{chosen[0]:%Y-%m-%d %H:%M:%S} – {chosen[1]:%Y-%m-%d %H:%M:%S} UTC")
    return (None, None) if chosen == (lo, hi) else (_ns(chosen[0]), _ns(chosen[1]))


def _filter_widgets(facets: dict, window: tuple[int | None, int | None]) -> Filters:
    start_ns, end_ns = window
    service = st.selectbox("Service", [ALL, *facets["services"]])
    substrate = st.selectbox("Substrate", [ALL, *facets["substrates"]])
    session = st.text_input("Session id", value="", help="Only this session (exact id); empty = all")
    return Filters(
        start_ns=start_ns,
        end_ns=end_ns,
        session_id=session.strip() or None,
        service=None if service == ALL else service,
        substrate=None if substrate == ALL else substrate,
    )


# Streamlit (1.67) centres a slider's value labels on its thumbs and keeps them inside the slider
# only once it re-renders: on a page's first render the labels have no width yet, so at the ends of
# the range they stick out of the sidebar, cut ("-30 23:13:11").  Hovering or dragging re-renders
# the slider and places them correctly; at rest they are hidden and the caption below gives the
# range in full.
SLIDER_CSS = """<style>
[data-testid="stSidebar"] [data-testid="stSlider"]:not(:hover):not(:focus-within) [data-testid="stSliderThumbValue"]
  { visibility: hidden; }
</style>"""


def _dt(ns: int) -> dt.datetime:
    return dt.datetime.fromtimestamp(ns // 1_000_000_000, tz=dt.UTC).replace(tzinfo=None)


def _ns(value: dt.datetime) -> int:
    return int(value.replace(tzinfo=dt.UTC).timestamp()) * 1_000_000_000


MIN_BAR = 0.006  # waterfall bars are at least this fraction of the session's span wide (~4 px of a 600 px plot)


def waterfall(spans: list[dict]) -> pd.DataFrame:
    """:func:`kvtrace.analysis.sessions.spans_of_session` rows as the waterfall's frame: a
    ``label`` per row, and ``bar_end_ms``, the end the bar is drawn to: the span's end, or
    :data:`MIN_BAR` of the session's span after its start when it is shorter (a 2 ms KV transfer in
    a minute-long session would be a hair-thin line); ``duration_ms`` keeps the real length."""
    frame = pd.DataFrame(spans)
    frame["label"] = [
        f"{i:04d} {r['name'].split('.', 1)[-1]}" + (f" [{r['engine_id']}]" if r["engine_id"] else "")
        for i, r in enumerate(spans)
    ]
    total = float(frame["end_ms"].max() - frame["start_ms"].min()) if len(frame) else 0.0
    frame["bar_end_ms"] = frame["end_ms"].clip(lower=frame["start_ms"] + MIN_BAR * total)
    return frame


def no_data(facets: dict, directory: str) -> bool:
    """Show how to get data and return True when the store is empty."""
    if facets.get("spans"):
        return False
    st.info(
        f"No traces in `{directory}` yet. Write some with `kvtrace demo --traces {directory}` "
        "(or any kvtrace component with `--traces`), then press Refresh."
    )
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


def table(target, frame, **kwargs) -> None:
    """``st.dataframe`` of ``frame`` at the container's width, without the index, in the units a
    reader wants (:func:`formatted`)."""
    shown, columns = formatted(frame)
    target.dataframe(shown, hide_index=True, width="stretch", column_config=columns, **kwargs)


def formatted(frame) -> tuple:
    """``frame`` for display and its ``column_config``: epoch-ns columns (``*_ns``) as UTC times,
    byte counts (``*bytes*``, ``byte_seconds``) as GiB (GiB·s), ms with one decimal, seconds with
    two, token and other counts with thousands separators, ratios with two decimals and other
    floats with four significant digits.  Column names stay (``start_ns`` becomes ``start``);
    labels read as words."""
    frame = pd.DataFrame(frame)
    columns: dict = {}  # display name -> values, in the frame's order
    config: dict = {}
    for name in frame.columns:
        shown, values, config[shown] = _column(name, frame[name])
        columns[shown] = values
    return pd.DataFrame(columns, index=frame.index), config


def _column(name: str, values) -> tuple:
    """(display name, values, column config) of one column (rules: :func:`formatted`)."""
    label = name.replace("_", " ")
    numeric = pd.api.types.is_numeric_dtype(values) and not pd.api.types.is_bool_dtype(values)
    if name.endswith("_ns") and numeric:
        name = name[:-3]
        return (
            name,
            pd.to_datetime(values, unit="ns", utc=True),
            st.column_config.DatetimeColumn(f"{name.replace('_', ' ')} (UTC)", format="YYYY-MM-DD HH:mm:ss"),
        )
    if ("bytes" in name or name == "byte_seconds") and numeric:
        name = "GiB_seconds" if name == "byte_seconds" else name.replace("bytes", "GiB")
        return (
            name,
            values / GIB,
            st.column_config.NumberColumn("GiB·s" if name == "GiB_seconds" else name.replace("_", " "), format="%,.2f"),
        )
    if not numeric:
        return name, values, st.column_config.Column(label)
    if name.endswith("_ms"):
        number = "%,.1f"
    elif name.endswith("_s"):
        number = "%,.2f"
    elif name == "turn":
        number = "%d"
    elif name in ("ratio", "ci_low", "ci_high") or name.endswith("_rate"):
        number = "%.2f"
    elif pd.api.types.is_integer_dtype(values) or name.endswith("tokens") or _whole(values):
        number = "%,d"
    else:
        number = "%.4g"
    return name, values, st.column_config.NumberColumn(label, format=number)


def _whole(values) -> bool:
    """A float column holding only whole numbers (an integer column with gaps)."""
    present = values.dropna()
    return not present.empty and bool((present == present.round()).all())
