"""The running dashboard in headless Chromium, for tests and screenshots.

Chromium (Debian package ``chromium``) is driven over the DevTools protocol with aiohttp's
websocket client: navigate, poll the DOM until the script has finished and the charts' geometry
is stable, measure what a reader sees (charts, slider labels, metric texts, waterfall bars), grow
the viewport to the page's height and take a screenshot.  Used by
``tests/test_dashboard_browser.py`` and ``scripts/dashboard_screenshots.py``.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import json
import shutil
import subprocess
import tempfile
import time
import urllib.request
from pathlib import Path

from kvtrace.testing.wait import wait_for

FLAGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--window-size=1400,1100",
    "--remote-debugging-port=0",
]

# Everything the checks read from a page, as one JSON string.
STATE_JS = """JSON.stringify({
  title: (document.querySelector('[data-testid="stMainBlockContainer"] h1') || {}).innerText || null,
  running: !!document.querySelector('[data-testid="stStatusWidget"] [data-testid="stStatusWidgetRunningIcon"]')
           || !!document.querySelector('[data-testid="stAppSkeleton"], [data-testid="stSkeleton"], '
                                       + '[data-testid="stSkeletonElement"]'),  // lazy widgets still loading
  exceptions: document.querySelectorAll('[data-testid="stException"]').length,
  errors: document.querySelectorAll('[data-testid="stAlertContentError"], .stAlert [kind="error"]').length,
  charts: document.querySelectorAll('[data-testid="stVegaLiteChart"] canvas, '
                                    + '[data-testid="stVegaLiteChart"] svg').length,
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
    // the narrowest bar of each bar mark (SVG: one path per bar)
    const bars = Array.from(view.querySelectorAll('g.mark-rect path'))
      .map(p => p.getBoundingClientRect().width).filter(w => w > 0);
    return {renderer: view.tagName, height: Math.round(box.height), width: Math.round(box.width),
            plot_height: plot ? Math.round(plot.getBoundingClientRect().height) : null, overlaps, clipped,
            bars: bars.length, narrowest_bar: bars.length ? Math.min(...bars) : null};
  }),
  // slider texts a reader can see, against the slider's box and the sidebar's (both clip)
  sliders: Array.from(document.querySelectorAll('[data-testid="stSlider"]')).map(s => {
    const box = s.getBoundingClientRect();
    const side = s.closest('[data-testid="stSidebar"]');
    const outer = side ? side.getBoundingClientRect() : box;
    const texts = Array.from(s.querySelectorAll('[data-testid="stSliderThumbValue"], '
                                                + '[data-testid="stSliderTickBar"] > *'))
      .filter(t => { const st = getComputedStyle(t);
                     return t.innerText && st.visibility !== 'hidden' && st.display !== 'none'
                            && parseFloat(st.opacity) > 0.05; })
      .map(t => { const r = t.getBoundingClientRect(); return {text: t.innerText, left: r.left, right: r.right}; });
    return {left: Math.max(box.left, outer.left), right: Math.min(box.right, outer.right), texts};
  }),
  // metric labels, values and deltas whose text is cut: a box that hides its overflow (ellipsis)
  // holding more than it shows
  cut_texts: Array.from(document.querySelectorAll(['stMetricLabel', 'stMetricValue', 'stMetricDelta']
      .map(id => `[data-testid="${id}"], [data-testid="${id}"] *`).join(', ')))
    .filter(e => { const st = getComputedStyle(e);
                   return (st.overflowX === 'hidden' || st.textOverflow === 'ellipsis') && e.innerText
                          && e.scrollWidth > e.clientWidth + 1; })
    .map(e => e.innerText)
})"""


def chromium() -> str | None:
    """The Chromium (or Chrome) executable, if installed."""
    return shutil.which("chromium") or shutil.which("chromium-browser") or shutil.which("google-chrome")


def healthy(url: str) -> bool:
    """Whether the Streamlit server at ``url`` answers its health check."""
    try:
        with urllib.request.urlopen(f"{url}/_stcore/health", timeout=2) as r:
            return r.status == 200
    except OSError:
        return False


@contextlib.contextmanager
def dashboard(cmd: list[str], port: int, env: dict | None = None):
    """Run ``cmd`` (a ``streamlit run`` command line serving on ``port``) until the block ends;
    yields its URL once healthy."""
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, env=env)
    url = f"http://127.0.0.1:{port}"
    try:
        wait_for(lambda: healthy(url) or proc.poll() is not None, 90, "the dashboard to start")
        assert proc.poll() is None, proc.stdout.read().decode()
        yield url
    finally:
        _stop(proc)


def _stop(proc: subprocess.Popen, grace_s: float = 30) -> None:
    proc.terminate()
    try:
        proc.wait(timeout=grace_s)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


@contextlib.contextmanager
def browser(executable: str, profile: str | None = None):
    """Headless Chromium until the block ends; yields its DevTools port."""
    with contextlib.ExitStack() as stack:
        # Chromium's helper processes may still write to the profile as it exits: leave what is left
        profile = profile or stack.enter_context(
            tempfile.TemporaryDirectory(prefix="kvtrace-chromium-", ignore_cleanup_errors=True)
        )
        proc = subprocess.Popen(
            [executable, *FLAGS, f"--user-data-dir={profile}", "about:blank"],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        active = Path(profile) / "DevToolsActivePort"
        try:
            wait_for(lambda: active.exists() and len(active.read_text().splitlines()) >= 2, 30, "DevTools port")
            yield int(active.read_text().splitlines()[0])
        finally:
            _stop(proc)


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
        assert "exceptionDetails" not in out, out["exceptionDetails"]
        return json.loads(out["result"]["value"])

    async def settle(self, title: str, what: str, deadline_s: float = 120) -> dict:
        """Poll until the title is shown, the script finished, and the state (charts' geometry
        included, so Vega's resize passes are over) reads the same four times in a row."""
        deadline, last, stable = time.monotonic() + deadline_s, None, 0
        while time.monotonic() < deadline:
            state = await self.state()
            ready = state["title"] == title and not state["running"]
            stable = stable + 1 if ready and state == last else 0
            if stable >= 3:
                return state
            last = state
            await asyncio.sleep(0.3)  # polling interval, not synchronisation
        raise AssertionError(f"{what} never settled; last state {last}")

    async def load(self, url: str, title: str) -> dict:
        await self.call("Page.navigate", url=url)
        return await self.settle(title, url)

    async def hover(self, selector: str) -> None:
        """Move the mouse onto the centre of the first element matching ``selector``."""
        out = await self.call(
            "Runtime.evaluate",
            returnByValue=True,
            expression=(
                f"(() => {{ const r = document.querySelector({json.dumps(selector)}).getBoundingClientRect();"
                " return [r.left + r.width / 2, r.top + r.height / 2]; })()"
            ),
        )
        x, y = out["result"]["value"]
        await self.call("Input.dispatchMouseEvent", type="mouseMoved", x=x, y=y)

    async def full_page_screenshot(self, state: dict, title: str) -> tuple[dict, bytes]:
        """Grow the viewport to the page's height (Streamlit scrolls inside its main block, so
        ``captureBeyondViewport`` alone shows one screen), screenshot, restore; returns the state
        measured at full height and the PNG."""
        inner = await self.call("Runtime.evaluate", expression="window.innerWidth", returnByValue=True)
        width = inner["result"]["value"]
        await self.call(
            "Emulation.setDeviceMetricsOverride",
            width=width,
            height=max(state["page_height"], 600),
            deviceScaleFactor=1,
            mobile=False,
        )
        try:
            tall = await self.settle(title, f"{title} at full height")
            png = await self.call("Page.captureScreenshot", format="png", captureBeyondViewport=True)
            return tall, base64.b64decode(png["data"])
        finally:
            await self.call("Emulation.clearDeviceMetricsOverride")


@contextlib.asynccontextmanager
async def page(devtools_port: int):
    """A :class:`CDP` client on the browser's first page."""
    import aiohttp

    async with aiohttp.ClientSession() as http:
        async with http.get(f"http://127.0.0.1:{devtools_port}/json/list") as r:
            target = next(t for t in await r.json() if t["type"] == "page")
        async with http.ws_connect(target["webSocketDebuggerUrl"], max_msg_size=0) as ws:
            cdp = CDP(ws)
            await cdp.call("Page.enable")
            yield cdp


def clipped_slider_texts(state: dict) -> list[str]:
    """Slider labels that stick out of their slider or the sidebar (1 px rounding allowed)."""
    return [
        f"{t['text']!r} at {t['left']:.0f}-{t['right']:.0f} px, slider {s['left']:.0f}-{s['right']:.0f} px"
        for s in state["sliders"]
        for t in s["texts"]
        if t["left"] < s["left"] - 1 or t["right"] > s["right"] + 1
    ]
