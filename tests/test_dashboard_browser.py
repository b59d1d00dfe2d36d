"""The running dashboard in headless Chromium: every page loads, renders its title and charts, and
shows no Streamlit error element; every chart is drawn at a usable size (plot area not collapsed,
y-axis labels not stacked on each other, no axis/legend/title cut off); a full-page screenshot of
each page is saved.

Chromium (Debian package ``chromium``) is driven over the DevTools protocol with aiohttp's
websocket client: navigate, poll the DOM until the script has finished and the charts' geometry
is stable, grow the viewport to the page's height, then screenshot and inspect.  Skipped when
Chromium is missing, unless CI=true (then it fails).
"""

from __future__ import annotations

import asyncio
import base64
import json
import os
import shutil
import socket
import subprocess
import sys
import time

import pytest

from kvtrace.dashboards.cli import command
from kvtrace.testing.synth import sample_store

pytestmark = pytest.mark.timeout(240)
aiohttp = pytest.importorskip("aiohttp")
CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser") or shutil.which("google-chrome")
if CHROMIUM is None:
    if os.environ.get("CI", "").lower() == "true":
        pytest.fail("chromium is required under CI=true (apt-get install -y chromium)", pytrace=False)
    pytest.skip("chromium not installed (apt-get install -y chromium); set CI=true to fail instead",
                allow_module_level=True)

PAGES = {"sessions": "Sessions", "drilldown": "Session drill-down", "reuse": "KV reuse",
         "retention": "Retention on decode workers", "latency": "Latency by turn index",
         "compare": "Run comparison"}
FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
         "--disable-background-networking", "--disable-component-update", "--disable-sync",
         "--window-size=1400,1100", "--remote-debugging-port=0"]
STATE_JS = """JSON.stringify({
  title: (document.querySelector('[data-testid="stMainBlockContainer"] h1') || {}).innerText || null,
  running: !!document.querySelector('[data-testid="stStatusWidget"] [data-testid="stStatusWidgetRunningIcon"]')
           || !!document.querySelector('[data-testid="stAppSkeleton"]'),
  exceptions: document.querySelectorAll('[data-testid="stException"]').length,
  errors: document.querySelectorAll('[data-testid="stAlertContentError"], .stAlert [kind="error"]').length,
  charts: document.querySelectorAll('[data-testid="stVegaLiteChart"] canvas, [data-testid="stVegaLiteChart"] svg').length,
  tables: document.querySelectorAll('[data-testid="stDataFrame"]').length,
  dialogs: Array.from(document.querySelectorAll('[role="dialog"]')).map(d => d.innerText),
  page_height: Math.max(...['[data-testid="stMain"]', '[data-testid="stAppViewContainer"]', 'html']
    .map(sel => (document.querySelector(sel) || {}).scrollHeight || 0)),
  geometry: Array.from(document.querySelectorAll('[data-testid="stVegaLiteChart"]')).map(chart => {
    const view = chart.querySelector('svg, canvas');
    if (!view) return null;
    const box = view.getBoundingClientRect();
    // Vega's root group: its background rect is the plot area (the data rectangle), SVG renderer only
    const plot = view.tagName === 'svg' ? view.querySelector('g.role-frame.root > g > path.background') : null;
    const overlaps = [];
    for (const axis of view.querySelectorAll('g.role-axis[aria-label^="Y-axis"]')) {
      const labels = Array.from(axis.querySelectorAll('g.role-axis-label text'))
        .filter(t => t.getAttribute('opacity') !== '0' && t.textContent)
        .map(t => ({text: t.textContent, r: t.getBoundingClientRect()})).sort((a, b) => a.r.top - b.r.top);
      for (let i = 1; i < labels.length; i++) {
        const a = labels[i - 1], b = labels[i];
        if (a.r.bottom - b.r.top > 0.35 * Math.min(a.r.height, b.r.height)) overlaps.push([a.text, b.text]);
      }
    }
    // text line boxes may poke a few px past the drawing (title ascent, rotated axis title): allow 6 px
    const clipped = Array.from(view.querySelectorAll('g.role-axis, g.role-legend, g.role-title'))
      .filter(g => { const r = g.getBoundingClientRect();
                     return r.height > 0 && (r.top < box.top - 6 || r.bottom > box.bottom + 6
                                             || r.left < box.left - 6 || r.right > box.right + 6); })
      .map(g => g.getAttribute('aria-label') || g.getAttribute('class'));
    return {renderer: view.tagName, height: Math.round(box.height), width: Math.round(box.width),
            plot_height: plot ? Math.round(plot.getBoundingClientRect().height) : null, overlaps, clipped};
  })
})"""
MIN_CHART_PX, MIN_PLOT_PX = 80, 30  # a chart's drawing / its data rectangle; collapsed ones measured 120 / 1
CHARTS = {"sessions": 2, "drilldown": 2, "reuse": 4, "retention": 1, "latency": 2, "compare": 1}
DEFAULT_PAGE = "sessions"  # served at "/"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _wait(predicate, deadline_s: float, what: str):
    deadline = time.monotonic() + deadline_s
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(0.2)
    raise AssertionError(f"timed out waiting for {what}")


def _healthy(url: str) -> bool:
    import urllib.request

    try:
        with urllib.request.urlopen(f"{url}/_stcore/health", timeout=2) as r:
            return r.status == 200
    except OSError:
        return False


@pytest.fixture(scope="module")
def dashboard(tmp_path_factory):
    root = tmp_path_factory.mktemp("browser")
    sample_store(root / "bidir")
    sample_store(root / "baseline", pull=False)
    port = _free_port()
    proc = subprocess.Popen(command(str(root / "bidir"), port=port, compare=str(root / "baseline")),
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    try:
        _wait(lambda: _healthy(url) or proc.poll() is not None, 60, "the dashboard to start")
        assert proc.poll() is None, proc.stdout.read().decode()
        yield url
    finally:
        proc.terminate()
        proc.wait(timeout=20)


@pytest.fixture(scope="module")
def browser(tmp_path_factory):
    profile = tmp_path_factory.mktemp("chromium-profile")
    proc = subprocess.Popen([CHROMIUM, *FLAGS, f"--user-data-dir={profile}", "about:blank"],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    active = profile / "DevToolsActivePort"
    try:
        _wait(lambda: active.exists() and len(active.read_text().splitlines()) >= 2, 30, "chromium's DevTools port")
        yield int(active.read_text().splitlines()[0])
    finally:
        proc.terminate()
        proc.wait(timeout=20)


class CDP:
    """Minimal DevTools-protocol client for one page target."""

    def __init__(self, ws) -> None:
        self.ws, self.next_id = ws, 0

    async def call(self, method: str, **params):
        self.next_id += 1
        await self.ws.send_json({"id": self.next_id, "method": method, "params": params})
        while True:
            msg = json.loads((await self.ws.receive()).data)
            if msg.get("id") == self.next_id:
                assert "error" not in msg, msg
                return msg["result"]

    async def state(self) -> dict:
        out = await self.call("Runtime.evaluate", expression=STATE_JS, returnByValue=True)
        return json.loads(out["result"]["value"])


async def _settle(cdp: CDP, title: str, what: str, deadline_s: float = 60) -> dict:
    """Poll until the title is shown, the script finished, and the state (charts' geometry included,
    so Vega's resize passes are over) reads the same four times in a row."""
    deadline, last, stable = time.monotonic() + deadline_s, None, 0
    while time.monotonic() < deadline:
        state = await cdp.state()
        ready = state["title"] == title and not state["running"]
        stable = stable + 1 if ready and state == last else 0
        if stable >= 3:
            return state
        last = state
        await asyncio.sleep(0.3)  # polling interval, not synchronisation
    raise AssertionError(f"{what} never settled; last state {last}")


async def _load(cdp: CDP, url: str, title: str) -> dict:
    await cdp.call("Page.navigate", url=url)
    return await _settle(cdp, title, url)


async def _full_page_screenshot(cdp: CDP, state: dict, title: str, path) -> dict:
    """Grow the viewport to the page's height (Streamlit scrolls inside its main block, so
    ``captureBeyondViewport`` alone shows one screen), screenshot, restore; returns the state
    measured at full height."""
    inner = await cdp.call("Runtime.evaluate", expression="window.innerWidth", returnByValue=True)
    width = inner["result"]["value"]
    await cdp.call("Emulation.setDeviceMetricsOverride", width=width, height=max(state["page_height"], 600),
                   deviceScaleFactor=1, mobile=False)
    try:
        tall = await _settle(cdp, title, f"{title} at full height")
        png = await cdp.call("Page.captureScreenshot", format="png", captureBeyondViewport=True)
        path.write_bytes(base64.b64decode(png["data"]))
        return tall
    finally:
        await cdp.call("Emulation.clearDeviceMetricsOverride")


async def _visit_all(devtools_port: int, base: str, shots) -> dict[str, tuple[dict, str]]:
    async with aiohttp.ClientSession() as http:
        async with http.get(f"http://127.0.0.1:{devtools_port}/json/list") as r:
            target = next(t for t in await r.json() if t["type"] == "page")
        async with http.ws_connect(target["webSocketDebuggerUrl"], max_msg_size=0) as ws:
            cdp = CDP(ws)
            await cdp.call("Page.enable")
            out = {}
            for path, title in PAGES.items():
                state = await _load(cdp, f"{base}/" if path == DEFAULT_PAGE else f"{base}/{path}", title)
                state = await _full_page_screenshot(cdp, state, title, shots / f"{path}.png")
                dom = await cdp.call("Runtime.evaluate", expression="document.documentElement.outerHTML",
                                     returnByValue=True)
                out[path] = (state, dom["result"]["value"])
            return out


@pytest.fixture(scope="module")
def visited(dashboard, browser, tmp_path_factory):
    """Every page visited once: ``({path: (state, html)}, screenshot directory)``."""
    shots = tmp_path_factory.mktemp("screenshots")
    results = asyncio.run(_visit_all(browser, dashboard, shots))
    print(f"screenshots in {shots}", file=sys.stderr)
    return results, shots


def test_every_page_loads_without_errors(visited):
    results, shots = visited
    assert set(results) == set(PAGES)
    for path, (state, dom) in results.items():
        assert state["exceptions"] == 0 and state["errors"] == 0 and state["dialogs"] == [], (path, state)
        assert "stException" not in dom and "Traceback" not in dom, path
        assert state["charts"] >= (0 if path == "compare" else 1) or path == "compare", (path, state)
        assert (shots / f"{path}.png").stat().st_size > 10_000, path
    assert results["compare"][0]["charts"] >= 1 and results["compare"][0]["tables"] >= 2
    assert results["sessions"][0]["tables"] == 1


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
    assert set(results) == set(PAGES)
    problems = [p for path, (state, _) in results.items() for p in _chart_problems(path, state["geometry"])]
    assert problems == [], "\n".join(problems)
    # the sessions page: one bar row per session (3 in the sample), the one-bar share of all sessions
    bars, share = results["sessions"][0]["geometry"]
    assert bars["plot_height"] >= 3 * 18 and share["plot_height"] >= MIN_PLOT_PX, (bars, share)
