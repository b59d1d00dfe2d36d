"""The OTel Collector configurations in collectors/ parse, name real collector-contrib components,
wire every pipeline to defined components, and fan out to kvtrace collect."""

from __future__ import annotations

import pathlib
import re

import pytest

yaml = pytest.importorskip("yaml")

ROOT = pathlib.Path(__file__).resolve().parents[2]
CONFIGS = sorted((ROOT / "collectors").glob("*.yaml"))

# Component type names of the otelcol-contrib distribution (cmd/otelcontribcol/builder-config.yaml
# of open-telemetry/opentelemetry-collector-contrib, plus the core components it bundles).  The
# trace-relevant part; a config naming anything else fails.
VALID = {
    "receivers": {
        "otlp",
        "jaeger",
        "zipkin",
        "kafka",
        "opencensus",
        "nop",
        "skywalking",
        "datadog",
        "awsxray",
        "hostmetrics",
        "prometheus",
        "filelog",
    },
    "processors": {
        "batch",
        "memory_limiter",
        "attributes",
        "filter",
        "resource",
        "resourcedetection",
        "span",
        "tail_sampling",
        "probabilistic_sampler",
        "transform",
        "groupbytrace",
        "groupbyattrs",
        "k8sattributes",
        "redaction",
        "routing",
    },
    "exporters": {
        "otlp",
        "otlphttp",
        "debug",
        "nop",
        "clickhouse",
        "zipkin",
        "kafka",
        "file",
        "loadbalancing",
        "elasticsearch",
        "opensearch",
        "datadog",
        "awsxray",
        "googlecloud",
        "azuremonitor",
        "sentry",
        "otelarrow",
        "doris",
    },
    "extensions": {
        "health_check",
        "healthcheckv2",
        "pprof",
        "zpages",
        "basicauth",
        "bearertokenauth",
        "headers_setter",
        "oauth2client",
        "file_storage",
        "oidc",
        "sigv4auth",
    },
    "connectors": {"forward", "spanmetrics", "servicegraph", "routing", "count", "failover"},
}
SECTIONS = ("receivers", "processors", "exporters", "connectors")
_ENV = re.compile(r"\$\{env:([A-Z0-9_]+)(?::-([^}]*))?\}")


def _load(path: pathlib.Path) -> dict:
    return yaml.safe_load(path.read_text())


def _type(component_id: str) -> str:
    return component_id.split("/", 1)[0]


def test_there_are_fanout_and_clickhouse_configs():
    names = {p.stem for p in CONFIGS}
    assert {"fanout-tempo", "fanout-jaeger", "fanout-phoenix", "clickhouse"} <= names


@pytest.mark.parametrize("path", CONFIGS, ids=lambda p: p.name)
def test_components_are_valid_and_wired(path):
    config = _load(path)
    for section in (*SECTIONS, "extensions"):
        for component_id in config.get(section) or {}:
            assert _type(component_id) in VALID[section], f"{path.name}: unknown {section} type {component_id}"
    service = config["service"]
    for ext in service.get("extensions", []):
        assert ext in config["extensions"], f"{path.name}: extension {ext} not defined"
    used = {section: set() for section in SECTIONS}
    assert service["pipelines"], f"{path.name}: no pipelines"
    for name, pipeline in service["pipelines"].items():
        assert _type(name) in ("traces", "metrics", "logs"), name
        assert pipeline["receivers"] and pipeline["exporters"], f"{path.name}: {name} incomplete"
        for section in ("receivers", "processors", "exporters"):
            for component_id in pipeline.get(section, []):
                defined = {**(config.get(section) or {}), **(config.get("connectors") or {})}
                assert component_id in defined, f"{path.name}: {name} uses undefined {component_id}"
                used[section].add(component_id)
    for section in ("receivers", "processors", "exporters"):
        assert set(config.get(section) or {}) == used[section], f"{path.name}: unused {section}"
    if "memory_limiter" in used["processors"]:
        for pipeline in service["pipelines"].values():
            assert pipeline["processors"][0] == "memory_limiter"  # collector docs: first in the chain


@pytest.mark.parametrize("path", CONFIGS, ids=lambda p: p.name)
def test_fans_out_to_kvtrace_collect_on_loopback(path):
    config = _load(path)
    exporters = config["exporters"]
    kvtrace = [cid for cid in exporters if cid.endswith("/kvtrace")]
    assert len(kvtrace) == 1 and _type(kvtrace[0]) in ("otlp", "otlphttp")
    pipelines = config["service"]["pipelines"]
    fed = {
        e
        for name, p in pipelines.items()
        if _type(name) == "traces" and "otlp" in p["receivers"]
        for e in p["exporters"]
    }
    assert kvtrace[0] in fed and len(fed) >= 2  # the same spans to kvtrace collect and another backend
    endpoint = exporters[kvtrace[0]]["endpoint"]
    default = _ENV.sub(lambda m: m.group(2) or "", endpoint)
    assert "127.0.0.1:" in default
    for receiver in (config["receivers"]["otlp"]["protocols"] or {}).values():
        assert receiver["endpoint"].startswith("127.0.0.1:")


def test_clickhouse_variant_writes_otel_traces():
    from kvtrace.store import clickhouse

    config = _load(ROOT / "collectors" / "clickhouse.yaml")
    exporter = config["exporters"]["clickhouse"]
    assert exporter["traces_table_name"] == clickhouse.TABLE
    assert exporter["create_schema"] is True
    # its own pipeline, large batches (the materialized views cost a fixed CPU per insert), while
    # kvtrace collect keeps the 5 s batches (docs/clickhouse.md, "Cost to writers")
    [(name, pipeline)] = [(n, p) for n, p in config["service"]["pipelines"].items() if "clickhouse" in p["exporters"]]
    assert pipeline["exporters"] == ["clickhouse"] and pipeline["receivers"] == ["otlp"]
    batches = [config["processors"][x] for x in pipeline["processors"] if _type(x) == "batch"]
    assert batches == [{"send_batch_size": 100000, "timeout": "30s"}]
    others = [
        config["processors"][x]
        for p in config["service"]["pipelines"].values()
        if p is not pipeline
        for x in p["processors"]
        if _type(x) == "batch"
    ]
    assert others == [{"send_batch_size": 100000, "timeout": "5s"}]
