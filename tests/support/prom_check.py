"""A real Prometheus server for the metrics tests, and the checks they run against it.

:class:`Prometheus` starts Debian's ``prometheus`` (2.42) on loopback with a generated config
(1 s scrapes, its own TSDB in a temporary directory) and talks to its HTTP API.  The checks:

- :func:`counters_vs_spans`: the KV counters (and the proxy's, when a proxy is scraped) equal
  counts and sums over the spans in the Parquet store, family by family and label by label;
- :func:`dashboard_queries` / :func:`empty_queries`: every PromQL expression of
  ``dashboards/grafana/kvtrace.json`` (Grafana variables substituted) returns data.

Waits are deadline-bounded polls of the API (:meth:`Prometheus.wait_scraped_after`), never
sleeps.  Used by tests/telemetry/test_real_prometheus.py (simulator) and
tests/vllm/test_metrics_real_prometheus.py (real vLLM).
"""

from __future__ import annotations

import json
import math
import os
import shutil
import subprocess
import urllib.parse
import urllib.request
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path

import pytest

from kvtrace import semconv as sc
from kvtrace import settings
from kvtrace.testing.wait import free_port, wait_for

ROOT = Path(__file__).resolve().parents[2]
DASHBOARD = ROOT / "dashboards" / "grafana" / "kvtrace.json"
# what the dashboard's Grafana variables become in the test's queries
GRAFANA_VARS = {"$__rate_interval": "1m", "$model_name": ".*"}
# prometheus_client >= 0.22 (vLLM's /metrics) writes `vllm:x` in # TYPE but `vllm_x` on OpenMetrics
# samples (reported upstream, prometheus/client_python 1177); this scrape rule puts the colon back (README, "Metrics")
VLLM_COLON_FIX = {
    "source_labels": ["__name__"],
    "regex": "vllm_(.+)",
    "target_label": "__name__",
    "replacement": "vllm:${1}",
}


def healthy(url: str) -> bool:
    """``GET url/health`` answers 200."""
    try:
        with urllib.request.urlopen(url + "/health", timeout=2) as r:
            return r.status == 200
    except OSError:
        return False


def prometheus_binary() -> str:
    """Path of the Prometheus server; skips without one, fails instead under CI=true or
    KVTRACE_REQUIRE_VLLM=1 (the README's test command)."""
    path = settings.PROMETHEUS_BIN.get() or shutil.which("prometheus")
    if path:
        return path
    msg = "the prometheus server is not installed (Debian: apt-get install prometheus; .ci/run installs it)"
    if os.environ.get("CI", "").lower() == "true" or settings.REQUIRE_VLLM.get():
        pytest.fail(msg)
    pytest.skip(msg)


@dataclass
class Prometheus:
    """One Prometheus server; ``jobs`` = job name -> ``host:port`` targets (path /metrics)."""

    workdir: Path
    jobs: dict[str, list[str]]
    fix_vllm_colons: set[str] = field(default_factory=set)  # jobs that get VLLM_COLON_FIX
    port: int = field(default_factory=free_port)
    proc: subprocess.Popen | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def config(self) -> dict:
        scrape = []
        for job, targets in self.jobs.items():
            entry = {
                "job_name": job,
                "scrape_interval": "1s",
                "scrape_timeout": "900ms",
                "static_configs": [{"targets": list(targets)}],
            }
            if job in self.fix_vllm_colons:
                entry["metric_relabel_configs"] = [VLLM_COLON_FIX]
            scrape.append(entry)
        return {"global": {"scrape_interval": "1s", "evaluation_interval": "1s"}, "scrape_configs": scrape}

    def start(self, deadline_s: float = 60) -> Prometheus:
        self.workdir.mkdir(parents=True, exist_ok=True)
        cfg = self.workdir / "prometheus.yml"
        cfg.write_text(json.dumps(self.config(), indent=1))  # JSON is YAML
        log = open(self.workdir / "prometheus.log", "wb")
        self.proc = subprocess.Popen(
            [
                prometheus_binary(),
                f"--config.file={cfg}",
                f"--storage.tsdb.path={self.workdir / 'data'}",
                f"--web.listen-address=127.0.0.1:{self.port}",
                "--storage.tsdb.retention.time=1h",
            ],
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        self.wait_for(self._ready, deadline_s, "Prometheus ready")
        return self

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)

    def log_tail(self, n: int = 40) -> str:
        path = self.workdir / "prometheus.log"
        return "\n".join(path.read_text(errors="replace").splitlines()[-n:]) if path.exists() else ""

    # ------------------------------------------------------------------ HTTP API
    def _ready(self) -> bool:
        if self.proc is not None and self.proc.poll() is not None:
            raise RuntimeError(f"prometheus exited with {self.proc.returncode}:\n{self.log_tail()}")
        try:
            with urllib.request.urlopen(self.url + "/-/ready", timeout=2) as r:
                return r.status == 200
        except OSError:
            return False

    def api(self, path: str, **params) -> object:
        url = f"{self.url}/api/v1/{path}"
        if params:
            url += "?" + urllib.parse.urlencode(params)
        with urllib.request.urlopen(url, timeout=30) as r:
            body = json.loads(r.read())
        assert body["status"] == "success", body
        return body["data"]

    def query(self, expr: str) -> list[dict]:
        """Instant query at now: a list of {"metric": labels, "value": float}."""
        data = self.api("query", query=expr)
        if data["resultType"] == "scalar":
            return [{"metric": {}, "value": float(data["result"][1])}]
        return [{"metric": r["metric"], "value": float(r["value"][1])} for r in data["result"]]

    def by(self, expr: str, *labels: str) -> dict[tuple, float]:
        """``expr`` as {label values: value}, zero values dropped."""
        return {
            tuple(r["metric"].get(lb, "") for lb in labels): r["value"] for r in self.query(expr) if r["value"] != 0
        }

    def targets(self) -> list[dict]:
        return self.api("targets", state="active")["activeTargets"]

    def wait_for(self, fn, deadline_s: float, what: str, interval: float = 0.2):
        """:func:`vllm_pd.wait_for` (deadline-bounded poll); a timeout carries Prometheus's log tail."""
        try:
            return wait_for(fn, deadline_s=deadline_s, what=what, interval=interval)
        except TimeoutError as exc:
            raise TimeoutError(f"{exc}\n{self.log_tail()}") from None

    def wait_up(self, deadline_s: float = 60) -> None:
        """Every target scraped successfully at least once."""

        def up():
            ts = self.targets()
            return len(ts) == sum(len(t) for t in self.jobs.values()) and all(t["health"] == "up" for t in ts)

        self.wait_for(up, deadline_s, "every target up")

    def wait_scraped_after(self, wall_time: float, deadline_s: float = 30) -> None:
        """Every target had a successful scrape that started after ``wall_time`` (time.time())."""

        def scraped():
            ts = self.targets()
            return all(t["health"] == "up" and _epoch(t["lastScrape"]) > wall_time for t in ts) and ts

        self.wait_for(scraped, deadline_s, "a scrape of every target after the workload")


def _epoch(rfc3339: str) -> float:
    # Prometheus writes nanoseconds; Python takes microseconds
    head, _, rest = rfc3339.partition(".")
    frac = "".join(c for c in rest if c.isdigit())[:6]
    zone = rest[len("".join(c for c in rest if c.isdigit())) :] or "Z"
    return datetime.fromisoformat(f"{head}.{frac or '0'}{zone.replace('Z', '+00:00')}").timestamp()


# ---------------------------------------------------------------------------- the dashboard
def dashboard_queries(path: Path = DASHBOARD) -> list[tuple[str, str]]:
    """(panel title, PromQL) of every target of the Grafana dashboard, variables substituted."""
    dash = json.loads(path.read_text())
    out = []
    for panel in dash["panels"]:
        for target in panel.get("targets", ()):
            expr = target["expr"]
            for var, value in GRAFANA_VARS.items():
                expr = expr.replace(var, value)
            assert "$" not in expr, f"unsubstituted Grafana variable in {panel['title']!r}: {expr}"
            out.append((panel["title"], expr))
    return out


def empty_queries(prom: Prometheus, queries: list[tuple[str, str]]) -> list[tuple[str, str]]:
    """The queries that return no series at all."""
    return [(title, expr) for title, expr in queries if not prom.query(expr)]


# ---------------------------------------------------------------------------- counters vs spans
def _rows(traces: Path, sql: str) -> list[tuple]:
    from kvtrace.store import connect

    con = connect(traces, allow_empty=True)
    try:
        return con.execute(sql).fetchall()
    finally:
        con.close()


def span_totals(traces: Path, *, proxy: bool) -> dict[str, dict[tuple, float]]:
    """Family -> {label values: value} computed from the spans in the Parquet store."""
    dec = "FROM kv_decisions WHERE outcome IS NOT NULL"
    out = {
        "decisions": {
            (d, o): n for d, o, n in _rows(traces, f"SELECT direction, outcome, count(*) {dec} GROUP BY ALL")
        },
        "tokens": {},
        "transfers": {
            (d, s): n
            for d, s, n in _rows(
                traces, "SELECT direction, status, count(*) FROM kv_transfers WHERE status IS NOT NULL GROUP BY ALL"
            )
        },
        "transfer_bytes": {
            (d,): b
            for d, b in _rows(traces, "SELECT direction, sum(bytes) FROM kv_transfers WHERE status = 'ok' GROUP BY ALL")
        },
        "retention_ends": {
            (o,): n
            for o, n in _rows(
                traces, "SELECT outcome, count(*) FROM kv_retention WHERE outcome IS NOT NULL GROUP BY ALL"
            )
        },
        "byte_seconds": {  # one series, no labels
            (): _rows(traces, "SELECT sum(byte_seconds) FROM kv_retention WHERE outcome IS NOT NULL")[0][0]
        },
    }
    for d, local, pulled, recomputed in _rows(
        traces,
        f"SELECT direction, sum(local_hit_tokens), sum(pulled_tokens), sum(recomputed_tokens) {dec} GROUP BY ALL",
    ):
        for source, n in ((sc.SOURCE_LOCAL_HIT, local), (sc.SOURCE_PULLED, pulled), (sc.SOURCE_RECOMPUTED, recomputed)):
            out["tokens"][(d, source)] = n
    if proxy:
        out["proxy_requests"] = {
            (str(s), r): n
            for s, r, n in _rows(traces, "SELECT http_status, offer_reason, count(*) FROM requests GROUP BY ALL")
        }
        out["proxy_ttft"] = {
            (o or sc.OUTCOME_UNKNOWN,): n
            for o, n in _rows(traces, "SELECT outcome, count(*) FROM requests WHERE ttft_ms IS NOT NULL GROUP BY ALL")
        }
    return {k: {lv: float(v) for lv, v in fam.items() if v} for k, fam in out.items()}


def prometheus_totals(prom: Prometheus, *, proxy: bool) -> dict[str, dict[tuple, float]]:
    """The same families as :func:`span_totals`, from Prometheus (summed over instances)."""
    out = {
        "decisions": prom.by(f"sum by (direction, outcome) ({sc.METRIC_KV_DECISIONS}_total)", "direction", "outcome"),
        "tokens": prom.by(f"sum by (direction, source) ({sc.METRIC_KV_PROMPT_TOKENS}_total)", "direction", "source"),
        "transfers": prom.by(
            f"sum by (direction, status) ({sc.METRIC_KV_TRANSFER_DURATION}_count)", "direction", "status"
        ),
        "transfer_bytes": prom.by(f"sum by (direction) ({sc.METRIC_KV_TRANSFER_BYTES}_total)", "direction"),
        "retention_ends": prom.by(f"sum by (outcome) ({sc.METRIC_KV_RETENTION_ENDS}_total)", "outcome"),
        "byte_seconds": prom.by(f"sum({sc.METRIC_KV_RETAINED_BYTE_SECONDS}_total)"),
    }
    if proxy:
        out["proxy_requests"] = prom.by(
            f"sum by (status, offer_reason) ({sc.METRIC_PROXY_REQUESTS}_total)", "status", "offer_reason"
        )
        out["proxy_ttft"] = prom.by(f"sum by (outcome) ({sc.METRIC_PROXY_TTFT}_count)", "outcome")
    return out


def comparable(totals: dict[str, dict[tuple, float]]) -> dict[str, dict[tuple, float]]:
    """Byte-seconds rounded to 6 significant digits (float sums in another order); the rest exact."""
    out = dict(totals)
    out["byte_seconds"] = {k: float(f"{v:.6g}") for k, v in totals["byte_seconds"].items()}
    return out


def finite(values) -> bool:
    return all(math.isfinite(v) for v in values)
