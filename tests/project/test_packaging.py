"""The wheel ships every kvtrace package and the dashboard app."""

from __future__ import annotations

import pathlib
import tomllib

ROOT = pathlib.Path(__file__).resolve().parents[2]


def test_the_wheel_holds_every_package_and_the_dashboard_app(tmp_path):
    """One way of shipping the app: setup.py finds the packages; the wheel, built here, holds every
    kvtrace package, the Streamlit app and its pages as ``kvtrace.dashboards``, the Grafana
    dashboards, the bench's shipped traces, ``py.typed`` and the C extensions."""
    import shutil
    import subprocess
    import sys
    import sysconfig
    import zipfile

    src = tmp_path / "src"  # a copy: setuptools builds in the source tree's build/
    for part in ("kvtrace", "dashboards", "setup.py", "pyproject.toml", "README.md"):
        if (ROOT / part).is_dir():
            shutil.copytree(ROOT / part, src / part, ignore=shutil.ignore_patterns("__pycache__"))
        else:
            shutil.copy(ROOT / part, src / part)
    subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "wheel",
            "-q",
            "--no-deps",
            "--no-build-isolation",
            "-w",
            str(tmp_path),
            str(src),
        ],
        check=True,
        capture_output=True,
        timeout=300,
    )
    (wheel,) = tmp_path.glob("kvtrace-*.whl")
    names = set(zipfile.ZipFile(wheel).namelist())
    sources = {p.relative_to(ROOT).as_posix() for p in (ROOT / "kvtrace").rglob("*.py")}
    dash = {
        "kvtrace/dashboards/" + p.relative_to(ROOT / "dashboards").as_posix()
        for pattern in ("*.py", "grafana/*.json")
        for p in (ROOT / "dashboards").rglob(pattern)
    }
    assert {"kvtrace/dashboards/app.py", "kvtrace/dashboards/app_pages/sessions.py"} <= dash
    assert sources | dash | {"kvtrace/py.typed"} <= names
    data = {"kvtrace/bench/data/" + p.name for p in (ROOT / "kvtrace" / "bench" / "data").iterdir()}
    assert {"kvtrace/bench/data/mooncake_conversation_every20.jsonl", "kvtrace/bench/data/README.md"} <= data <= names
    assert not {n for n in names if n.startswith(("tests/", "dashboards/", "benchmarks/"))}
    # the C extensions (the digest's tags, the simulator's tokenizer and block pool, the JSON codec's
    # pre-check), built wherever the interpreter's C compiler is (CI's machines have it)
    compiler = (sysconfig.get_config_var("CC") or "cc").split()[0]
    if shutil.which(compiler):
        for ext in ("kvtrace/kvdigest/_ctags", "kvtrace/sim/_ctok", "kvtrace/sim/_ckv", "kvtrace/_cjson"):
            assert {n for n in names if n.startswith(ext + ".") and n.endswith((".so", ".pyd"))}, ext
            assert ext + ".pyi" in names, ext
    from kvtrace import __version__

    assert wheel.name.startswith(f"kvtrace-{__version__}-")


def test_console_script_and_vllm_plugin_entry_points():
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    assert project["scripts"] == {"kvtrace": "kvtrace.cli:main"}
    assert project["entry-points"]["vllm.general_plugins"] == {"kvtrace": "kvtrace.vllm.plugin:register"}
    # core stays light: no Streamlit, vLLM or aiohttp
    assert not any(
        dep.split(">")[0].split("=")[0] in {"streamlit", "vllm", "aiohttp"} for dep in project["dependencies"]
    )
