"""kvtrace dashboard: where agent time goes, whether KV reuse happens, what it saves and holds.

Start it with ``kvtrace dashboard --traces DIR [--port N] [--compare DIR2]`` (which runs
``streamlit run`` on this file, bound to 127.0.0.1, through ``kvtrace.dashboards.serve``: the
pages' imports done at server start), or directly with
``streamlit run dashboards/app.py -- --traces DIR``.  Pages live in ``app_pages/`` (a
``pages/`` folder would switch on Streamlit's legacy page list); every number comes from
:mod:`kvtrace.analysis`.
"""

from __future__ import annotations

import streamlit as st

st.set_page_config(page_title="kvtrace", layout="wide")

PAGES = [
    st.Page("app_pages/sessions.py", title="Sessions", url_path="sessions"),
    st.Page("app_pages/drilldown.py", title="Session drill-down", url_path="drilldown"),
    st.Page("app_pages/reuse.py", title="KV reuse", url_path="reuse"),
    st.Page("app_pages/retention.py", title="Retention", url_path="retention"),
    st.Page("app_pages/latency.py", title="Latency by turn", url_path="latency"),
    st.Page("app_pages/whatif.py", title="What-if", url_path="whatif"),
    st.Page("app_pages/compare.py", title="Run comparison", url_path="compare"),
]


def _home() -> None:
    """The app's root URL: Streamlit serves its default page at "/" and only there (its url_path is
    ignored), so the default is this hidden page, which opens the sessions page at /sessions."""
    st.switch_page(PAGES[0])


st.navigation([st.Page(_home, title="kvtrace", url_path="home", default=True, visibility="hidden"), *PAGES]).run()
