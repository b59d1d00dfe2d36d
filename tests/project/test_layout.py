"""The package layout follows the data: agent -> proxy -> sim | vllm -> emit -> store <- collect
-> analysis -> dashboards / report; bench and demo drive it.  This test reads every import in
kvtrace/ and dashboards/ (module level and inside functions) and fails on an edge the table
below does not allow, and on any cycle between packages."""

from __future__ import annotations

import ast
from collections import defaultdict
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

BASE = {"semconv", "settings", "errors"}
# package -> the kvtrace packages (or top-level modules) it may import
ALLOWED: dict[str, set[str]] = {
    "semconv": set(),
    "settings": set(),
    "errors": set(),
    "kvrules": {"semconv"},  # vLLM's reuse rules, shared by the simulator and the what-if replay
    "kvdigest": {"semconv", "settings", "kvrules"},  # identity of retained KV: D makes it, P checks it
    "store": BASE,
    "telemetry": BASE | {"store"},  # OTel providers and exporters, fast spans, Prometheus exposition
    "emit": BASE | {"telemetry"},
    "agent": BASE | {"telemetry", "jsoncodec"},
    "routing": {"semconv"},  # a fleet's routing policies: the proxy's, whoever runs it (kvtrace.routing)
    "_cjson": set(),  # kvtrace/_cjson.c, the C extension of jsoncodec
    "jsoncodec": {"_cjson"},  # JSON of the serving hot paths (orjson when installed), its C pre-check
    "proxy": BASE | {"telemetry", "routing", "jsoncodec"},
    "sim": BASE | {"telemetry", "emit", "kvrules", "kvdigest", "jsoncodec"},
    "vllm": BASE | {"telemetry", "emit", "kvdigest"},
    "collect": BASE | {"telemetry", "store"},
    "analysis": BASE | {"store", "kvrules"},
    "dashboards": BASE | {"store", "analysis"},
    # bench drives the pipeline: --clock virtual runs sim + proxy in its own process (bench/inproc.py)
    "bench": BASE | {"telemetry", "agent", "store", "analysis", "sim", "proxy", "routing"},
    "testing": BASE | {"telemetry", "store", "emit"},
    "demo": BASE | {"telemetry", "agent", "proxy", "sim", "store", "analysis", "bench", "dashboards"},
    # the commands: thin modules (parse, call, print) over every package above
    "cli": BASE
    | {
        "telemetry",
        "agent",
        "proxy",
        "routing",
        "sim",
        "vllm",
        "emit",
        "store",
        "collect",
        "analysis",
        "dashboards",
        "bench",
        "demo",
        "kvtrace",
    },
    "kvtrace": {"telemetry"},  # kvtrace/__init__.py
}


def _unit(path: Path) -> str:
    """The layout unit of a source file: its package under kvtrace/, or its top-level module."""
    rel = path.relative_to(ROOT)
    if rel.parts[0] == "dashboards":
        return "dashboards"
    if len(rel.parts) == 2:  # kvtrace/<module>.py
        return "kvtrace" if rel.name == "__init__.py" else rel.stem
    return rel.parts[1]


def _imported_units(tree: ast.AST) -> set[str]:
    out: set[str] = set()
    for node in ast.walk(tree):
        names: list[str] = []
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names = [node.module] if node.module != "kvtrace" else [f"kvtrace.{a.name}" for a in node.names]
        for name in names:
            parts = name.split(".")
            if parts[0] == "kvtrace" and len(parts) > 1:
                # `from kvtrace import configure`: a name kvtrace/__init__.py re-exports from telemetry
                out.add(parts[1] if parts[1] in ALLOWED else "kvtrace" if parts[1] == "__version__" else "telemetry")
    return out


def _graph() -> dict[str, dict[str, list[str]]]:
    """unit -> imported unit -> files that import it."""
    graph: dict[str, dict[str, list[str]]] = defaultdict(lambda: defaultdict(list))
    files = sorted((ROOT / "kvtrace").rglob("*.py")) + sorted((ROOT / "dashboards").rglob("*.py"))
    for path in files:
        unit = _unit(path)
        for target in _imported_units(ast.parse(path.read_text(), str(path))):
            if target != unit:
                graph[unit][target].append(str(path.relative_to(ROOT)))
    return graph


def test_every_unit_is_in_the_table():
    units = {_unit(p) for p in (ROOT / "kvtrace").rglob("*.py")} | {"dashboards"}
    assert units <= set(ALLOWED), f"add these to ALLOWED with their place in the pipeline: {units - set(ALLOWED)}"


def test_no_forbidden_edge():
    bad = []
    for unit, targets in _graph().items():
        for target, files in targets.items():
            if target not in ALLOWED[unit]:
                bad.append(f"{unit} -> {target} ({', '.join(sorted(set(files)))})")
    assert bad == []


def test_no_cycle_between_packages():
    graph = {u: set(ts) for u, ts in _graph().items()}
    state: dict[str, int] = {}

    def visit(node: str, path: list[str]) -> None:
        state[node] = 1
        for nxt in sorted(graph.get(node, ())):
            if state.get(nxt) == 1:
                pytest.fail("import cycle: " + " -> ".join(path + [node, nxt]))
            if nxt not in state:
                visit(nxt, path + [node])
        state[node] = 2

    for node in sorted(graph):
        if node not in state:
            visit(node, [])


def test_the_table_itself_is_acyclic():
    """The allowed edges form a DAG, so no future edge the table permits can close a cycle."""
    state: dict[str, int] = {}

    def visit(node: str) -> None:
        state[node] = 1
        for nxt in ALLOWED[node]:
            assert state.get(nxt) != 1, f"ALLOWED has a cycle through {node} -> {nxt}"
            if nxt not in state:
                visit(nxt)
        state[node] = 2

    for node in ALLOWED:
        if node not in state:
            visit(node)


def test_sim_does_not_import_vllm_code_and_agent_is_instrumentation_only():
    graph = _graph()
    assert "vllm" not in graph.get("sim", {})
    assert not {"bench", "proxy", "sim", "analysis", "store"} & set(graph.get("agent", {}))
    agent_modules = {p.stem for p in (ROOT / "kvtrace" / "agent").glob("*.py")}
    assert not agent_modules & {"bench", "runner", "scenarios", "workload", "distributions", "stats", "vllm_inputs"}


def test_every_package_says_what_it_is_for():
    for init in sorted((ROOT / "kvtrace").glob("*/__init__.py")):
        doc = ast.get_docstring(ast.parse(init.read_text())) or ""
        assert len(doc.split()) >= 15, f"{init.relative_to(ROOT)}: the docstring should say what the package is for"


def test_every_command_is_a_thin_module_of_the_cli_package():
    """One rule for commands: ``kvtrace/cli/<command>.py`` defines ``add_arguments(parser)`` and
    ``run(args)`` (its docstring is the command's --help) and stays small; what a command does lives
    in its package.  The dispatcher lists exactly these modules."""
    from kvtrace.cli import COMMANDS

    cli = ROOT / "kvtrace" / "cli"
    modules = {p.stem for p in cli.glob("*.py")} - {"__init__", "__main__", "options"}
    assert {m.rsplit(".", 1)[1] for m in COMMANDS.values()} == modules
    for name in sorted(modules):
        tree = ast.parse((cli / f"{name}.py").read_text())
        defs = {n.name: n for n in tree.body if isinstance(n, ast.FunctionDef)}
        assert {"add_arguments", "run"} <= set(defs), name
        assert len(ast.get_docstring(defs["run"]) or "") > 40, f"{name}.run needs a docstring: it is the --help"
        assert len((cli / f"{name}.py").read_text().splitlines()) <= 250, f"kvtrace/cli/{name}.py: move the work out"
