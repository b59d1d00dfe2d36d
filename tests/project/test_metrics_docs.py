"""docs/metrics.md is generated from semconv, metric names are typed only there, and the Grafana
dashboard is importable as is (datasource variable) and queries only metrics that exist."""

from __future__ import annotations

import json
import re
from pathlib import Path

from kvtrace import semconv as sc

ROOT = Path(__file__).resolve().parents[2]
DASHBOARD = ROOT / "dashboards" / "grafana" / "kvtrace.json"


def test_metrics_doc_is_generated_from_semconv():
    assert (ROOT / "docs" / "metrics.md").read_text() == sc.render_metrics_markdown()


def test_every_metric_is_documented_with_its_labels():
    for name, spec in sc.METRICS.items():
        assert spec["type"] in ("counter", "gauge", "histogram") and spec["doc"], name
        assert set(spec["labels"]) <= set(sc.LABEL_VALUES), name
    kv = [n for n in sc.METRICS if n.startswith("vllm:kvtrace_")]
    assert all(sc.METRICS[n]["labels"][:2] == (sc.LABEL_MODEL_NAME, sc.LABEL_ENGINE) for n in kv)
    assert all(re.fullmatch(r"[a-zA-Z_:][a-zA-Z0-9_:]*", n) for n in sc.METRICS)


def test_hand_written_docs_name_only_real_metrics_and_leave_the_list_to_the_generated_page():
    """README and the hand-written docs name kvtrace's metrics only as examples: each one exists in
    the contract; the full list lives in the generated docs/metrics.md, which README links."""
    suffixes = ("_total", "_bucket", "_sum", "_count", "_created")
    for page in [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]:
        if page.relative_to(ROOT).as_posix() == "docs/metrics.md":
            continue
        named = set(
            re.findall(r"\b(vllm:kvtrace_[a-z_]+|kvtrace_proxy_[a-z_]+|kvtrace_dropped_[a-z_]+)", page.read_text())
        )
        base = {
            next((n[: -len(x)] for x in suffixes if n.endswith(x) and n[: -len(x)] in sc.METRICS), n) for n in named
        }
        assert base <= set(sc.METRICS), (page.name, base - set(sc.METRICS))
    assert "(docs/metrics.md)" in (ROOT / "README.md").read_text()


def _panels():
    return json.loads(DASHBOARD.read_text())["panels"]


def test_dashboard_is_importable_with_a_datasource_variable():
    dash = json.loads(DASHBOARD.read_text())
    variables = {v["name"]: v for v in dash["templating"]["list"]}
    assert variables["datasource"]["type"] == "datasource" and variables["datasource"]["query"] == "prometheus"
    assert "__inputs" not in dash and "id" not in dash  # nothing tied to one Grafana instance
    ids = [p["id"] for p in _panels()]
    assert len(ids) == len(set(ids))
    for panel in _panels():
        if panel["type"] == "row":
            continue
        assert panel["datasource"] == {"type": "prometheus", "uid": "${datasource}"}, panel["title"]
        assert panel["targets"] and all(t["datasource"]["uid"] == "${datasource}" for t in panel["targets"])
        grid = panel["gridPos"]
        assert grid["x"] + grid["w"] <= 24


def test_dashboard_queries_only_known_metrics():
    exprs = " ".join(t["expr"] for p in _panels() for t in p.get("targets", ()))
    used = set(re.findall(r"\b((?:vllm:|kvtrace_)[a-z_:]+?)(?:_total|_bucket|_sum|_count)?\b(?=[{\[)\s])", exprs))
    assert used <= set(sc.METRICS), used - set(sc.METRICS)
    for name in (
        sc.METRIC_KV_DECISIONS,
        sc.METRIC_KV_PROMPT_TOKENS,
        sc.METRIC_KV_TRANSFER_BYTES,
        sc.METRIC_KV_RETAINED_BYTES,
        sc.METRIC_KV_RETENTION_ENDS,
        sc.METRIC_PROXY_TTFT,
        sc.VLLM_METRIC_TTFT,
        sc.VLLM_METRIC_NIXL_XFER_TIME,
    ):
        assert name in used, name
