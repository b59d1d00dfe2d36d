"""The real-agent rig: ``kvtrace sim --tool-calls first-tool``, ``kvtrace proxy`` over it and
``kvtrace collect`` (OTLP/HTTP), three real processes writing one trace directory, and an agent
script of tests/agent/stacks/ run in the side venv that holds the agent stacks."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import urllib.request
from pathlib import Path

import pytest

from kvtrace import settings
from kvtrace.testing.wait import free_port, wait_for

STACKS = Path(__file__).resolve().parents[1] / "agent" / "stacks"
REPO = STACKS.parents[2]
STARTUP_S = 120.0
AGENT_S = 240.0
STOP_S = 60.0


def stacks_python() -> str:
    """The side venv's python (KVTRACE_AGENT_STACKS_PYTHON, else ./.venv-agents); skips when it is
    absent, except under CI=true where that is a failure."""
    python = settings.AGENT_STACKS_PYTHON.get() or str(REPO / ".venv-agents" / "bin" / "python")
    if not os.path.exists(python):
        why = f"the agent stacks' venv is missing ({python}): scripts/install-dev.sh makes it"
        if os.environ.get("CI") == "true":
            pytest.fail(why)
        pytest.skip(why)
    return python


def _healthy(url: str) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=2) as resp:
            return resp.status == 200 and json.load(resp).get("status") == "ok"
    except (OSError, ValueError):
        return False


class Rig:
    """The three kvtrace commands, started as a user starts them; :meth:`stop` SIGTERMs them
    (each flushes every span) and checks they exited cleanly."""

    def __init__(self, traces: Path, log_dir: Path) -> None:
        self.traces, self.log_dir = traces, log_dir
        p_port, d_port, self.proxy_port, self.otlp_port = (free_port() for _ in range(4))
        self.procs: dict[str, subprocess.Popen] = {}
        self.urls = {
            "prefill": f"http://127.0.0.1:{p_port}/health",
            "decode": f"http://127.0.0.1:{d_port}/health",
            "proxy": f"http://127.0.0.1:{self.proxy_port}/health",
            "collect": f"http://127.0.0.1:{self.otlp_port}/health",
        }
        t = ("--traces", str(traces))
        sim_ports = ("--prefill-port", str(p_port), "--decode-port", str(d_port))
        self._start("sim", "--tool-calls", "first-tool", *sim_ports, *t)
        ports = ("--prefiller-port", str(p_port), "--decoder-port", str(d_port))
        self._start("proxy", "--port", str(self.proxy_port), *ports, *t)
        self._start("collect", "--otlp-http", f"127.0.0.1:{self.otlp_port}", "--otlp-grpc", "off", *t)

    def _start(self, name: str, *argv: str) -> None:
        """``kvtrace NAME ARGV...``, its output in the log directory."""
        env = {**os.environ, "KVTRACE_BATCH_DELAY_MS": "100", "PYTHONUNBUFFERED": "1"}
        env.pop("KVTRACE_TRACES_DIR", None)
        argv = (sys.executable, "-m", "kvtrace.cli", name, *argv)
        with open(self.log_dir / f"{name}.log", "wb") as log:  # the child keeps its own descriptor
            self.procs[name] = subprocess.Popen(
                argv, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True
            )

    def wait_ready(self) -> None:
        for name, url in self.urls.items():
            wait_for(lambda url=url: _healthy(url), STARTUP_S, f"{name} healthy at {url}")

    def run_agent(self, script: str, session_id: str) -> subprocess.CompletedProcess:
        argv = [
            stacks_python(),
            str(STACKS / script),
            "--base-url",
            f"http://127.0.0.1:{self.proxy_port}/v1",
            "--otlp",
            f"http://127.0.0.1:{self.otlp_port}/v1/traces",
            "--session-id",
            session_id,
        ]
        env = {k: v for k, v in os.environ.items() if not k.startswith(("OTEL_", "OPENAI_", "PYTHONPATH"))}
        env.update(PYTHONUNBUFFERED="1", TRACELOOP_TELEMETRY="false")
        return subprocess.run(argv, cwd=STACKS, env=env, capture_output=True, text=True, timeout=AGENT_S)

    def logs(self) -> str:
        return "\n".join(f"--- {p.name}\n{p.read_text(errors='replace')[-3000:]}" for p in self.log_dir.glob("*.log"))

    def stop(self) -> dict[str, int]:
        """SIGTERM each (the collector last: the proxy and sim write their own files); exit codes."""
        codes = {}
        for name in ("sim", "proxy", "collect"):
            proc = self.procs[name]
            proc.send_signal(signal.SIGTERM)
            try:
                codes[name] = proc.wait(timeout=STOP_S)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                codes[name] = proc.wait()
        return codes

    def kill(self) -> None:
        for proc in self.procs.values():
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
