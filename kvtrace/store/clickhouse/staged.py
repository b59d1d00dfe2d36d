"""A query run in stages, so that no CTE that reads data is expanded more than once.

ClickHouse inlines a CTE at every reference and analyses it again each time, ``AS MATERIALIZED``
included: the breakdown's query tree held the scan 32 times and its analysis, not its data, was
most of a small question's time.  :func:`stage` finds, in an assembled statement
(:func:`.statement.assemble`), each CTE that reads data and that the statement would expand more than
once (counting every path from the final SELECT), and turns it into a temporary table made once,
before the statement, from its own CTE and those it reads (a CTE made earlier is read from its
table).  The statement then reads the tables.  Anything it cannot prove safe (a name defined twice
with two bodies, a recursive WITH, SQL it cannot parse) is left as one statement.

The backend runs the stages in one session (:meth:`.backend.ChdbBackend.query_staged`); where
temporary tables cannot be made (a ``readonly = 1`` user), it runs the single statement, which
gives the same rows.

Each stage also names the earlier tables it is *strict* in (:func:`strict_in`): any one of them empty,
the stage is empty whatever else it reads (it reads it through FROM, inner joins, or every branch of a
UNION, with no aggregate that answers a row on no input).  A session of one convention leaves the other
conventions' joins empty; chDB then makes those tables empty from their known columns instead of
analysing and planning their SELECTs, which is most of a small question's time.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

import sqlglot
from sqlglot import exp

_WITH = "with_" if "with_" in exp.Select.arg_types else "with"  # SQLGlot renamed the key
TEMP_PREFIX = "kvtrace_stage_"


@dataclass(frozen=True)
class Staged:
    """``temps``: (temporary table, its SELECT) in creation order; ``main``: the statement over them."""

    temps: tuple[tuple[str, str], ...]
    main: str
    strict: tuple[frozenset[str], ...] = ()
    """Per table of ``temps``: the earlier tables it is strict in (module doc)."""
    assumed: tuple[frozenset[str], ...] = ()
    """Per table of ``temps``: the functions it calls, which its strictness takes for plain functions
    unless SQLGlot knows them for aggregates (the backend checks them against the server's)."""
    local: tuple[bool, ...] = ()
    """Per table of ``temps``, then for ``main``: whether it reads stage tables only (no stored data)
    and has no SETTINGS clause of its own (the backend may add one)."""


def _owner(node: exp.Expr) -> exp.CTE | None:
    """The innermost CTE ``node`` is in (None: the final SELECT)."""
    return node.find_ancestor(exp.CTE)


def _resolve(table: exp.Table) -> exp.CTE | None:
    """The CTE a table reference names, by ClickHouse's scoping (None: a stored table)."""
    if table.db:
        return None
    node: exp.Expr | None = table
    while node is not None:
        with_ = node.args.get(_WITH) if isinstance(node, exp.Query) else None
        if isinstance(with_, exp.With):
            ctes = with_.expressions
            up = {id(a) for a in _ancestors(table)}
            inside = next((i for i, c in enumerate(ctes) if id(c) in up), None)
            visible = ctes if inside is None else ctes[:inside]
            found = [c for c in visible if c.alias_or_name == table.name]
            if found:
                return found[-1]
        node = node.parent
    return None


def _ancestors(node: exp.Expr) -> list[exp.Expr]:
    out, p = [], node.parent
    while p is not None:
        out.append(p)
        p = p.parent
    return out


@dataclass
class _Graph:
    ctes: list[exp.CTE]
    owners: dict[int, list[exp.CTE | None]]  # id(CTE) -> the CTE each reference to it is in (None: the final SELECT)
    reads_store: set[int]


def _graph(tree: exp.Expr) -> _Graph:
    ctes = list(tree.find_all(exp.CTE))
    owners: dict[int, list] = {id(c): [] for c in ctes}
    direct: dict[int, set[int]] = {id(c): set() for c in ctes}
    stored: set[int] = set()
    for table in tree.find_all(exp.Table):
        owner, target = _owner(table), _resolve(table)
        if target is None:
            if owner is not None and not table.name.startswith(TEMP_PREFIX):  # a stage's table was read once
                stored.add(id(owner))
            continue
        owners[id(target)].append(owner)
        if owner is not None:
            direct[id(owner)].add(id(target))
    by_id = {id(c): c for c in ctes}
    reads: set[int] = set()

    def reads_store(i: int, seen: frozenset = frozenset()) -> bool:
        if i in reads:
            return True
        nested = {id(c) for c in by_id[i].this.find_all(exp.CTE)}
        found = i in stored or any(
            j not in seen and reads_store(j, seen | {i}) for j in direct[i] | {n for n in nested if n != i}
        )
        if found:
            reads.add(i)
        return found

    for c in ctes:
        reads_store(id(c))
    return _Graph(ctes, owners, reads)


def _order(graph: _Graph) -> list[exp.CTE]:
    """CTEs with every CTE that references them (owner) before them."""
    out: list[exp.CTE] = []
    seen: set[int] = set()

    def visit(c: exp.CTE) -> None:
        if id(c) in seen:
            return
        seen.add(id(c))
        for owner in graph.owners[id(c)]:
            if owner is not None:
                visit(owner)
        out.append(c)

    for c in graph.ctes:
        visit(c)
    return out


def expansions(tree: exp.Expr, made: frozenset[int] = frozenset()) -> dict[int, int]:
    """id(CTE) -> how many times the statement's tree holds it; a CTE in ``made`` (ids) is a table,
    analysed once wherever it is read."""
    graph = _graph(tree)
    count: dict[int, int] = {}
    for c in _order(graph):
        count[id(c)] = _count(graph, c, made, count)
    return count


def _count(graph: _Graph, c: exp.CTE, made: set[int] | frozenset[int], count: dict[int, int]) -> int:
    """How many times ``c`` is held, given its users' counts (a table's user reads it once)."""
    return sum(1 if owner is None or id(owner) in made else count[id(owner)] for owner in graph.owners[id(c)])


def _closure(c: exp.CTE, graph: _Graph) -> list[exp.CTE] | None:
    """The CTEs outside ``c`` that ``c`` reads, directly or not, dependencies first; None when two of
    them share a name (hoisted into one WITH they would not resolve as they did)."""
    inner = {id(x) for x in c.find_all(exp.CTE)}
    out: list[exp.CTE] = []
    seen: set[int] = set()

    def visit(node: exp.CTE) -> None:
        for table in node.this.find_all(exp.Table):
            dep = _resolve(table)
            if dep is None or id(dep) in inner or id(dep) in seen or dep is node:
                continue
            if any(a is dep for a in _ancestors(node)):  # an enclosing CTE: not a dependency
                continue
            seen.add(id(dep))
            visit(dep)
            out.append(dep)

    visit(c)
    names = [d.alias_or_name for d in out]
    return None if len(names) != len(set(names)) or c.alias_or_name in names else out


@functools.lru_cache(maxsize=1024)
def stage(text: str, inline: frozenset[str] = frozenset()) -> Staged | None:
    """``text`` (one ClickHouse statement) in stages (module doc), or None when one statement
    already holds no data-reading CTE twice, or when staging it is not provably the same.  A CTE
    named in ``inline`` is never made a table: it stays expanded at each reference."""
    try:
        tree = sqlglot.parse_one(text, read="clickhouse")
    except sqlglot.errors.ParseError:
        return None
    if not isinstance(tree, exp.Query) or any(w.args.get("recursive") for w in tree.find_all(exp.With)):
        return None
    graph = _graph(tree)
    made: set[int] = set()
    count: dict[int, int] = {}
    for c in _order(graph):
        count[id(c)] = _count(graph, c, made, count)
        if count[id(c)] > 1 and id(c) in graph.reads_store and c.alias_or_name not in inline:
            made.add(id(c))
    if not made:
        return None
    chosen = [c for c in reversed(_order(graph)) if id(c) in made]  # dependencies first
    if any(_closure(c, graph) is None for c in chosen):
        return None
    names = [c.alias_or_name for c in chosen]
    if len(set(names)) != len(names):
        return None  # two CTEs of one name made into tables: leave it whole
    temps = []
    for c in chosen:
        # what it reads now: a CTE made before it is its table, so what that one read is left out
        deps = _closure(c, graph) or []
        name = TEMP_PREFIX + c.alias_or_name
        body = c.this.sql("clickhouse")
        with_ = f"WITH {', '.join(d.sql('clickhouse') for d in deps)} " if deps else ""
        temps.append((name, f"{with_}SELECT * FROM ({body}) AS {name}"))
        c.set("this", sqlglot.parse_one(f"SELECT * FROM {name}", read="clickhouse"))
    _prune(tree)
    strict = [strict_in(select) for _, select in temps]
    main = tree.sql("clickhouse")
    local = tuple(_local(sqlglot.parse_one(sql, read="clickhouse")) for sql in (*(t for _, t in temps), main))
    return Staged(tuple(temps), main, tuple(t for t, _ in strict), tuple(f for _, f in strict), local)


def _local(tree: exp.Expr) -> bool:
    """``tree`` reads stage tables only (every table it names is a CTE or a stage's table) and has no
    SETTINGS clause."""
    if tree.args.get("settings"):
        return False
    tables = tree.find_all(exp.Table)
    return all(_resolve(t) is not None or (t.name.startswith(TEMP_PREFIX) and not t.db) for t in tables)


# ------------------------------------------------------------------------- strictness


def strict_in(select: str) -> tuple[frozenset[str], frozenset[str]]:
    """The stage tables (:data:`TEMP_PREFIX`) that ``select`` is strict in (with any one of them empty,
    it has no rows), provided none of the functions it calls, returned second, is an aggregate that
    SQLGlot does not know for one (the backend checks them against the server's).  Sound, not complete:
    anything it cannot prove adds no table."""
    tree = sqlglot.parse_one(select, read="clickhouse")
    tables = _strict(tree, {})
    if not tables:
        return tables, frozenset()
    calls = (f for f in tree.find_all(exp.Func) if not isinstance(f, exp.AggFunc) and not _windowed(f))
    names = (f.name if isinstance(f, exp.Anonymous) else _called(f) for f in calls)
    return tables, frozenset(n for n in names if n.isidentifier())  # (operators are Funcs too)


def _called(f: exp.Func) -> str:
    """The name ClickHouse calls ``f`` by (its SQL up to the parenthesis)."""
    return f.sql("clickhouse").split("(", 1)[0].strip()


def _strict(q: exp.Expr, memo: dict[int, frozenset[str]]) -> frozenset[str]:
    if isinstance(q, exp.Subquery):
        return _strict(q.this, memo)
    if isinstance(q, exp.Except):
        return _strict(q.this, memo)
    if isinstance(q, exp.Intersect):
        return _strict(q.this, memo) | _strict(q.expression, memo)
    if isinstance(q, exp.Union):
        return _strict(q.this, memo) & _strict(q.expression, memo)
    if not isinstance(q, exp.Select) or _answers_on_no_input(q):
        return frozenset()
    from_ = q.args.get("from_") or q.args.get("from")
    joins = q.args.get("joins") or []
    if from_ is None or any((j.side or "").upper() in ("RIGHT", "FULL") for j in joins):
        return frozenset()
    out = _source(from_.this, memo)
    for j in joins:
        if not j.side and (j.kind or "").upper() in ("", "INNER", "CROSS"):
            out |= _source(j.this, memo)
    return out


def _source(src: exp.Expr, memo: dict[int, frozenset[str]]) -> frozenset[str]:
    if isinstance(src, exp.Subquery):
        return _strict(src.this, memo)
    if not isinstance(src, exp.Table) or not isinstance(src.this, exp.Identifier):  # a table function
        return frozenset()
    cte = _resolve(src)
    if cte is None:
        return frozenset({src.name}) if src.name.startswith(TEMP_PREFIX) and not src.db else frozenset()
    if id(cte) not in memo:
        memo[id(cte)] = frozenset()  # (a cycle proves nothing)
        memo[id(cte)] = _strict(cte.this, memo)
    return memo[id(cte)]


def _answers_on_no_input(q: exp.Select) -> bool:
    """A row from no input: ``ORDER BY ... WITH FILL`` (it makes rows between bounds), an aggregate
    over the whole input (no GROUP BY), or a GROUP BY with totals, rollup, cube, grouping sets or no
    expression.  (A function SQLGlot does not know for an aggregate is taken for a plain one here:
    :func:`strict_in` returns the names.)"""
    order = q.args.get("order")
    if order is not None and any(o.args.get("with_fill") for o in order.expressions):
        return True
    group = q.args.get("group")
    if group is not None:
        return any(group.args.get(k) for k in ("totals", "rollup", "cube", "grouping_sets")) or not group.expressions
    own = (*q.expressions, q.args.get("having"), q.args.get("qualify"), order)
    for part in own:
        for f in part.find_all(exp.AggFunc) if part is not None else ():
            if f.find_ancestor(exp.Select) is q and not _windowed(f):
                return True
    return False


def _windowed(f: exp.Func) -> bool:
    """``f`` is a window's function (``... OVER``), a value per row, not an aggregate of the input (an
    aggregate inside its arguments still is one)."""
    return isinstance(f.parent, exp.Window)


def _prune(tree: exp.Expr) -> None:
    """Drop the CTEs nothing reads any more (what the stages' tables replaced): less to parse."""
    while True:
        used = {id(_resolve(t)) for t in tree.find_all(exp.Table)}
        dead = [c for c in tree.find_all(exp.CTE) if id(c) not in used]
        if not dead:
            return
        for c in dead:
            with_ = c.parent
            c.pop()
            if isinstance(with_, exp.With) and not with_.expressions:
                with_.pop()


def most_expanded(text: str) -> tuple[int, str]:
    """(how many times, name) of the CTE reading stored data that ``text``'s tree holds most often (a
    stage's temporary table is not stored data: its own statement read it); (0, "") when none does."""
    tree = sqlglot.parse_one(text, read="clickhouse")
    graph, count = _graph(tree), expansions(tree)
    return max(((count[id(c)], c.alias_or_name) for c in graph.ctes if id(c) in graph.reads_store), default=(0, ""))
