"""The running dashboard in headless Chromium: every page loads, renders its title and charts, and
shows no Streamlit error element; a screenshot of each page is saved.

Chromium (Debian package ``chromium``) is driven over the DevTools protocol with aiohttp's
websocket client: navigate, poll the DOM until the script has finished and the charts are drawn,
then screenshot and inspect.  Skipped when Chromium is missing, unless CI=true (then it fails).
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

from kvtrace.analysis.dashboard_cli import command
from kvtrace.analysis.synth import sample_store

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
  tables: document.querySelectorAll('[data-testid="stDataFrame"]').length
})"""


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


async def _load(cdp: CDP, url: str, title: str, deadline_s: float = 60) -> dict:
    """Navigate and wait until the title is shown, the script finished, and the chart count is stable."""
    await cdp.call("Page.navigate", url=url)
    deadline, last, stable = time.monotonic() + deadline_s, None, 0
    while time.monotonic() < deadline:
        state = await cdp.state()
        ready = state["title"] == title and not state["running"]
        stable = stable + 1 if ready and state == last else 0
        if stable >= 3:  # then give Vega's resize pass a moment before the screenshot
            await asyncio.sleep(1.0)
            return await cdp.state()
        last = state
        await asyncio.sleep(0.3)
    raise AssertionError(f"{url} never settled; last state {last}")


async def _visit_all(devtools_port: int, base: str, shots) -> dict[str, tuple[dict, str]]:
    async with aiohttp.ClientSession() as http:
        async with http.get(f"http://127.0.0.1:{devtools_port}/json/list") as r:
            target = next(t for t in await r.json() if t["type"] == "page")
        async with http.ws_connect(target["webSocketDebuggerUrl"], max_msg_size=0) as ws:
            cdp = CDP(ws)
            await cdp.call("Page.enable")
            out = {}
            for path, title in PAGES.items():
                state = await _load(cdp, f"{base}/{path}", title)
                png = await cdp.call("Page.captureScreenshot", format="png", captureBeyondViewport=True)
                (shots / f"{path}.png").write_bytes(base64.b64decode(png["data"]))
                dom = await cdp.call("Runtime.evaluate", expression="document.documentElement.outerHTML",
                                     returnByValue=True)
                out[path] = (state, dom["result"]["value"])
            return out


def test_every_page_loads_without_errors(dashboard, browser, tmp_path):
    shots = tmp_path / "screenshots"
    shots.mkdir()
    results = asyncio.run(_visit_all(browser, dashboard, shots))
    print(f"screenshots in {shots}", file=sys.stderr)
    assert set(results) == set(PAGES)
    for path, (state, dom) in results.items():
        assert state["exceptions"] == 0 and state["errors"] == 0, (path, state)
        assert "stException" not in dom and "Traceback" not in dom, path
        assert state["charts"] >= (0 if path == "compare" else 1) or path == "compare", (path, state)
        assert (shots / f"{path}.png").stat().st_size > 10_000, path
    assert results["compare"][0]["charts"] >= 1 and results["compare"][0]["tables"] >= 2
    assert results["sessions"][0]["tables"] == 1
