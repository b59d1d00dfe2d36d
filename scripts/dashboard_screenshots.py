"""Screenshots of every dashboard page, small enough to keep in the repository (docs/gallery/).

    python scripts/dashboard_screenshots.py --traces DIR/bidir --compare DIR/baseline --out docs/gallery/after

Starts ``streamlit run`` on the dashboard (``--app``, default this checkout's; with
``--pythonpath`` another checkout's ``kvtrace`` serves it, e.g. an older one for "before"
pictures), opens each page at its URL in headless Chromium (:mod:`kvtrace.testing.browser`),
takes a screenshot of a 1400 x ``--max-height`` px window, scales it to ``--width`` px and
reduces it to 128 colours (Pillow).  Prints what a reader would trip over on each page: dialogs
("Page not found"), slider labels sticking out, cut metric texts.
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import io
import os
import sys
from pathlib import Path

from kvtrace.dashboards.launch import APP, command
from kvtrace.testing import browser as b
from kvtrace.testing.wait import free_port

PAGES = {
    "sessions": "Sessions",
    "drilldown": "Session drill-down",
    "reuse": "KV reuse",
    "retention": "Retention on decode workers",
    "latency": "Latency by turn index",
    "compare": "Run comparison",
}


def shrink(png: bytes, width: int) -> bytes:
    from PIL import Image

    image = Image.open(io.BytesIO(png)).convert("RGB")
    image = image.resize((width, round(image.height * width / image.width)), Image.LANCZOS)
    out = io.BytesIO()
    image.quantize(colors=128, method=Image.Quantize.MEDIANCUT).save(out, format="PNG", optimize=True)
    return out.getvalue()


async def visit(devtools_port: int, url: str, out: Path, width: int, max_height: int) -> None:
    async with b.page(devtools_port) as cdp:
        # a window as tall as the pictures from the start: growing it later (full-page screenshots)
        # re-lays the page out while the sidebar is drawn, which can leave the sidebar scrolled sideways
        await cdp.call(
            "Emulation.setDeviceMetricsOverride", width=1400, height=max_height, deviceScaleFactor=1, mobile=False
        )
        for path, title in PAGES.items():
            state = await cdp.load(f"{url}/{path}", title)
            png = await cdp.call("Page.captureScreenshot", format="png")
            (out / f"{path}.png").write_bytes(shrink(base64.b64decode(png["data"]), width))
            notes = [
                *(f"dialog: {d.splitlines()[0]}" for d in state["dialogs"]),
                *(f"slider label clipped: {t}" for t in b.clipped_slider_texts(state)),
                *(f"metric text cut: {t!r}" for t in state["cut_texts"]),
            ]
            print(f"{path}: {'; '.join(notes) or 'ok'}")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--traces", required=True, help="the run the dashboard shows")
    parser.add_argument("--compare", help="the baseline run of the comparison page")
    parser.add_argument("--out", required=True, help="directory for the PNGs (one per page)")
    parser.add_argument("--app", default=str(APP), help="the dashboard's app.py (default: this checkout's)")
    parser.add_argument("--pythonpath", help="prepend this to PYTHONPATH for the dashboard (another checkout)")
    parser.add_argument("--width", type=int, default=900, help="width of the saved PNGs (default 900)")
    parser.add_argument("--max-height", type=int, default=2400, help="window height, px (default 2400)")
    args = parser.parse_args()
    executable = b.chromium()
    if executable is None:
        print("chromium not installed (apt-get install -y chromium)", file=sys.stderr)
        return 2
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    port = free_port()
    cmd = command(args.traces, port=port, compare=args.compare, app=args.app)
    env = dict(os.environ)
    if args.pythonpath:
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [args.pythonpath, env.get("PYTHONPATH")]))
    with b.dashboard(cmd, port, env=env) as url, b.browser(executable) as devtools:
        asyncio.run(visit(devtools, url, out, args.width, args.max_height))
    return 0


if __name__ == "__main__":
    sys.exit(main())
