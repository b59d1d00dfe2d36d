"""The running dashboard in headless Chromium: every page loads at its own URL (and "/" opens the
sessions page), renders its title and charts, and shows no Streamlit error element or dialog
("Page not found"); every chart is drawn at a usable size (plot area not collapsed, y-axis labels
not stacked on each other, no axis/legend/title cut off); no slider label sticks out of its slider
or the sidebar, at rest or hovered; no metric text is cut; the drill-down's waterfall bars are
wide enough to see; a full-page screenshot of each page is saved.

The browser plumbing is :mod:`kvtrace.testing.browser`.  Skipped when Chromium is missing,
unless CI=true (then it fails).
"""

from __future__ import annotations

import asyncio
import os
import sys

import pytest

from kvtrace.dashboards.launch import command
from kvtrace.testing import browser as b
from kvtrace.testing.synth import sample_store
from kvtrace.testing.wait import free_port

pytestmark = pytest.mark.timeout(300)
aiohttp = pytest.importorskip("aiohttp")
CHROMIUM = b.chromium()
if CHROMIUM is None:
    if os.environ.get("CI", "").lower() == "true":
        pytest.fail("chromium is required under CI=true (apt-get install -y chromium)", pytrace=False)
    pytest.skip(
        "chromium not installed (apt-get install -y chromium); set CI=true to fail instead", allow_module_level=True
    )

PAGES = {
    "sessions": "Sessions",
    "drilldown": "Session drill-down",
    "reuse": "KV reuse",
    "retention": "Retention on decode workers",
    "latency": "Latency by turn index",
    "compare": "Run comparison",
}
MIN_CHART_PX, MIN_PLOT_PX = 80, 30  # a chart's drawing / its data rectangle; collapsed ones measured 120 / 1
MIN_BAR_PX = 3  # the waterfall's narrowest bar (hair-thin ones measured under 1 px)
CHARTS = {"sessions": 2, "drilldown": 2, "reuse": 5, "retention": 1, "latency": 2, "compare": 1}


@pytest.fixture(scope="module")
def dashboard(tmp_path_factory):
    root = tmp_path_factory.mktemp("browser")
    sample_store(root / "bidir")
    sample_store(root / "baseline", pull=False)
    port = free_port()
    with b.dashboard(command(str(root / "bidir"), port=port, compare=str(root / "baseline")), port) as url:
        yield url


@pytest.fixture(scope="module")
def devtools():
    with b.browser(CHROMIUM) as port:
        yield port


async def _visit_all(devtools_port: int, base: str, shots) -> dict:
    """Each page at its URL (screenshot, state at full height, DOM), "/" (state), and the sessions
    page again with the mouse on the time-range slider (state)."""
    out = {}
    async with b.page(devtools_port) as cdp:
        for path, title in PAGES.items():
            loaded = await cdp.load(f"{base}/{path}", title)
            state, png = await cdp.full_page_screenshot(loaded, title)
            state["sliders_as_loaded"] = loaded["sliders"]  # before the viewport change re-renders them
            (shots / f"{path}.png").write_bytes(png)
            dom = await cdp.call(
                "Runtime.evaluate", expression="document.documentElement.outerHTML", returnByValue=True
            )
            out[path] = (state, dom["result"]["value"])
        root = await cdp.load(f"{base}/", PAGES["sessions"])
        out["/"] = ({**root, "sliders_as_loaded": root["sliders"]}, None)
        await cdp.hover('[data-testid="stSidebar"] [data-testid="stSlider"]')
        hovered = await cdp.settle(PAGES["sessions"], "the hovered slider")
        out["hovered"] = ({**hovered, "sliders_as_loaded": hovered["sliders"]}, None)
    return out


@pytest.fixture(scope="module")
def visited(dashboard, devtools, tmp_path_factory):
    """Every page visited once: ``({path: (state, html)}, screenshot directory)``."""
    shots = tmp_path_factory.mktemp("screenshots")
    results = asyncio.run(_visit_all(devtools, dashboard, shots))
    print(f"screenshots in {shots}", file=sys.stderr)
    return results, shots


def test_every_page_loads_at_its_url_without_errors(visited):
    results, shots = visited
    assert set(results) == set(PAGES) | {"/", "hovered"}
    for path, (state, dom) in results.items():
        assert state["exceptions"] == 0 and state["errors"] == 0 and state["dialogs"] == [], (path, state)
        if dom is not None:
            assert "stException" not in dom and "Traceback" not in dom, path
            assert (shots / f"{path}.png").stat().st_size > 10_000, path
    assert results["/"][0]["title"] == "Sessions"  # the root opens the sessions page
    assert results["compare"][0]["charts"] >= 1 and results["compare"][0]["tables"] >= 2
    assert results["sessions"][0]["tables"] == 1


def test_slider_labels_are_not_clipped(visited):
    """As first rendered (Streamlit has not placed its thumb labels yet: they are hidden, a caption
    gives the range), after a re-render (the full-height screenshot) and with the mouse on the
    slider (labels shown, placed inside)."""
    results, _ = visited
    for path, (state, _) in results.items():
        assert state["sliders"] and state["sliders_as_loaded"], path  # every page has the time-range slider
        assert b.clipped_slider_texts(state) == [], path
        assert b.clipped_slider_texts({"sliders": state["sliders_as_loaded"]}) == [], f"{path} as first rendered"
    hovered = results["hovered"][0]["sliders"][0]["texts"]
    assert len(hovered) >= 2, hovered  # the two thumb labels are shown while hovered


def test_no_metric_text_is_cut(visited):
    results, _ = visited
    assert {path: state["cut_texts"] for path, (state, _) in results.items() if state["cut_texts"]} == {}


def _chart_problems(path: str, geometry: list) -> list[str]:
    problems = [] if len(geometry) == CHARTS[path] else [f"{path}: {len(geometry)} charts, expected {CHARTS[path]}"]
    for i, g in enumerate(geometry):
        where = f"{path} chart #{i}"
        if g is None:
            problems.append(f"{where}: no svg/canvas drawn")
            continue
        if g["height"] < MIN_CHART_PX or g["width"] < 200:
            problems.append(f"{where}: drawn {g['width']}x{g['height']} px")
        if g["renderer"] == "svg" and (g["plot_height"] or 0) < MIN_PLOT_PX:
            problems.append(f"{where}: plot area {g['plot_height']} px tall (collapsed)")
        problems += [f"{where}: y labels {a!r} and {b!r} overlap" for a, b in g["overlaps"]]
        problems += [f"{where}: cut off: {c}" for c in g["clipped"]]
    return problems


def test_every_chart_is_drawn_at_a_usable_size(visited):
    results, _ = visited
    problems = [
        p for path, (state, _) in results.items() if path in PAGES for p in _chart_problems(path, state["geometry"])
    ]
    assert problems == [], "\n".join(problems)
    # the sessions page: one bar row per session (3 in the sample), the one-bar share of all sessions
    bars, share = results["sessions"][0]["geometry"]
    assert bars["plot_height"] >= 3 * 18 and share["plot_height"] >= MIN_PLOT_PX, (bars, share)


def test_waterfall_bars_are_wide_enough_to_see(visited):
    results, _ = visited
    waterfall = results["drilldown"][0]["geometry"][1]
    if waterfall["renderer"] != "svg":
        pytest.skip("bar widths are measured on Vega's SVG renderer")
    assert waterfall["bars"] >= 50 and waterfall["narrowest_bar"] >= MIN_BAR_PX, waterfall
