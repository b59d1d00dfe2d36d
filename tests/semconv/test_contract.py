"""The span contract is documented, generated docs are current, and no name is typed twice."""

from __future__ import annotations

import ast
import pathlib

from kvtrace import semconv as sc

ROOT = pathlib.Path(__file__).resolve().parents[2]


def _constants() -> dict[str, str]:
    return {k: v for k, v in vars(sc).items() if k.isupper() and isinstance(v, str)}


def test_docs_are_generated_from_semconv():
    assert (ROOT / "docs" / "semconv.md").read_text() == sc.render_markdown()


def test_every_constant_is_documented():
    doc = (ROOT / "docs" / "semconv.md").read_text() + (ROOT / "docs" / "metrics.md").read_text()
    missing = [name for name, value in _constants().items() if f"`{value}`" not in doc]
    assert missing == []


def test_outcomes_are_exactly_the_contract():
    assert sc.OUTCOMES == ("pulled", "below_threshold", "expired", "no_remote", "local_hit", "failed", "unverified")
    assert sc.VERIFIED_VALUES == ("match", "mismatch", "unverifiable")
    assert sc.VERIFY_MODES == ("record", "enforce")
    assert sc.DIRECTIONS == ("d2p", "p2d")
    assert sc.RETENTION_OUTCOMES == ("read", "expired", "released")


def test_otel_names_reused():
    assert sc.GEN_AI_OPERATION_NAME == "gen_ai.operation.name"
    assert sc.SESSION_ID == "session.id"
    assert sc.GEN_AI_USAGE_INPUT_TOKENS == "gen_ai.usage.input_tokens"
    assert (sc.OP_CHAT, sc.OP_EXECUTE_TOOL, sc.OP_INVOKE_AGENT) == ("chat", "execute_tool", "invoke_agent")


def _dotted_names() -> set[str]:
    # attribute / span / event names (dotted); short wire words like "kvtrace" or "turn" are
    # ordinary dict keys in vLLM's JSON and are not policed here
    return {v for v in _constants().values() if "." in v and " " not in v and not v.startswith("x-")}


def test_no_name_is_typed_outside_semconv():
    names = _dotted_names() | set(sc.METRICS) | {f"{n}_total" for n in sc.METRICS}  # metric names too
    offenders = []
    for path in sorted((ROOT / "kvtrace").rglob("*.py")) + sorted((ROOT / "dashboards").rglob("*.py")):
        if path.relative_to(ROOT).parts[:2] == ("kvtrace", "semconv"):
            continue
        for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
            if isinstance(node, ast.Constant) and isinstance(node.value, str) and node.value in names:
                offenders.append(f"{path.relative_to(ROOT)}:{node.lineno} {node.value}")
    assert offenders == []


def test_settings_docs_are_generated():
    from kvtrace import settings

    assert (ROOT / "docs" / "settings.md").read_text() == settings.render_markdown()
    assert all(s.env.startswith("KVTRACE_") and s.doc for s in settings.ALL)


def test_genai_names_follow_the_stated_conventions_version():
    """Every gen_ai.* name kvtrace defines (vLLM's own span names aside) is in the installed
    opentelemetry-semantic-conventions, whose schema list has the version docs/semconv.md states."""
    from opentelemetry.semconv._incubating.attributes import gen_ai_attributes
    from opentelemetry.semconv.schemas import Schemas

    known = {v for k, v in vars(gen_ai_attributes).items() if k.isupper() and isinstance(v, str)}
    vllm_own = {sc.GEN_AI_REQUEST_ID} | {v for k, v in vars(sc).items() if k.startswith("VLLM_LATENCY_")}
    ours = {v for k, v in vars(sc).items() if k.startswith("GEN_AI_") and isinstance(v, str)} - vllm_own
    assert sc.GEN_AI_USAGE_CACHE_READ_INPUT_TOKENS in ours and ours <= known, ours - known
    assert f"https://opentelemetry.io/schemas/{sc.GENAI_SEMCONV_VERSION}" in {s.value for s in Schemas}
    assert f"`{sc.GENAI_SEMCONV_VERSION}`" in (ROOT / "docs" / "semconv.md").read_text()
