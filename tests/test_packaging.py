"""The wheel ships every kvtrace package and the dashboard app."""

from __future__ import annotations

import pathlib
import tomllib

ROOT = pathlib.Path(__file__).resolve().parents[1]


def test_every_package_is_listed_for_the_wheel():
    config = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]
    found = {".".join(p.parent.relative_to(ROOT).parts) for p in (ROOT / "kvtrace").rglob("__init__.py")}
    found |= {"kvtrace.dashboards", "kvtrace.dashboards.app_pages"}
    assert set(config["packages"]) == found
    assert config["package-dir"] == {"kvtrace.dashboards": "dashboards"}
    assert (ROOT / "dashboards" / "app.py").is_file()


def test_console_script_and_vllm_plugin_entry_points():
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    assert project["scripts"] == {"kvtrace": "kvtrace.cli:main"}
    assert project["entry-points"]["vllm.general_plugins"] == {"kvtrace": "kvtrace.vllm.plugin:register"}
    # core stays light: no Streamlit, vLLM or aiohttp
    assert not any(
        dep.split(">")[0].split("=")[0] in {"streamlit", "vllm", "aiohttp"} for dep in project["dependencies"]
    )
