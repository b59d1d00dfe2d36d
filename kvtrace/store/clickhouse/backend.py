"""Where ClickHouse SQL runs: a ClickHouse server (clickhouse-connect, HTTP) or chDB in process.

:func:`open_backend` takes the ``--clickhouse`` value:

- ``http://[user[:password]@]host[:port][/database]`` or ``https://...``: a ClickHouse server
  through clickhouse-connect (its HTTP interface; port 8123 / 8443 by default).  Parameters are
  bound server-side (``{name:Type}``), never formatted into the SQL;
- ``chdb:PATH``: chDB, ClickHouse embedded in this process, on the database directory ``PATH``
  (what ``kvtrace.store.clickhouse.load`` or any chDB session wrote there).  chDB opens one
  directory per process: a second, different ``PATH`` is refused.

Both return Arrow tables and run every query with :data:`.dialect.SETTINGS`.
"""

from __future__ import annotations

import contextlib
import os
import re
import threading
import urllib.parse
import uuid
from typing import Any, ClassVar

import pyarrow as pa

from kvtrace.store.clickhouse import CHDB_PREFIX, ClickHouseError
from kvtrace.store.clickhouse.dialect import SETTINGS
from kvtrace.store.clickhouse.staged import Staged


class BackendError(ClickHouseError):
    """ClickHouse could not be reached or refused a statement (one line)."""


def _one_line(exc: BaseException) -> str:
    """The error's first line, without the statement ClickHouse quotes after ``In scope``."""
    text = str(exc).strip()
    if not text:
        return type(exc).__name__
    line = text.splitlines()[0]
    return re.sub(r" In scope .*?(?=( \([A-Z_]+\))?$)", "", line, count=1)


def normalise(table: pa.Table) -> pa.Table:
    """ClickHouse's unsigned counters as BIGINT and dictionary strings decoded, like DuckDB's results."""
    cols, changed = [], False
    for col in table.columns:
        t = col.type
        if pa.types.is_dictionary(t):
            col, changed = col.cast(t.value_type), True
        elif pa.types.is_unsigned_integer(t):  # a 64-bit hash past 2**63 wraps, as a join key may
            col, changed = col.cast(pa.int64(), safe=False), True
        cols.append(col)
    return pa.Table.from_arrays(cols, names=table.column_names) if changed else table


_NULL = "\\N"  # a NULL query parameter, as ClickHouse's parameter syntax spells it


class ChdbBackend:
    """chDB (in-process ClickHouse) on one database directory; queries are serialised."""

    _lock = threading.Lock()
    _path: str | None = None
    _conn = None

    def __init__(self, path: str) -> None:
        try:
            import chdb
        except ImportError:
            raise BackendError("chDB is not installed: pip install 'kvtrace[clickhouse]'") from None
        path = os.path.abspath(path)
        with ChdbBackend._lock:
            if ChdbBackend._path is None:
                try:
                    ChdbBackend._conn = chdb.connect(path)
                except Exception as exc:  # noqa: BLE001 - chDB raises plain RuntimeErrors
                    raise BackendError(f"chDB cannot open {path}: {_one_line(exc)}") from None
                ChdbBackend._path = path
                for name, value in SETTINGS.items():  # per connection, as SET
                    ChdbBackend._conn.query(f"SET {_settings_sql({name: value})}", "CSV")
            elif ChdbBackend._path != path:
                raise BackendError(
                    f"chDB is already open on {ChdbBackend._path} in this process; "
                    f"it opens one database directory per process (asked: {path})"
                )
        self.path = path
        self.description = f"chdb:{path}"

    rows_read = bytes_read = 0
    """Rows and bytes chDB read from storage for this backend's queries so far (tests and
    benchmarks check filter push-down with them)."""
    fallbacks = 0
    """Staged queries (:mod:`.staged`) that ran as their single statement: a stage failed (a
    ``readonly = 1`` user cannot make a temporary table)."""

    def query(self, sql: str, params: dict | None = None) -> pa.Table:
        with ChdbBackend._lock:
            return self._run(sql, params)

    elided = _written = 0
    """Stage tables made empty from their known columns (:meth:`_make`), their SELECT not run."""
    _columns: ClassVar[dict[str, str]] = {}  # a stage's SELECT -> its table's columns, once made (this directory's)
    _aggregates: ClassVar[tuple[frozenset[str], tuple[str, ...]] | None] = None  # aggregates, combinators

    def query_staged(self, staged: Staged, sql: str, params: dict | None = None) -> pa.Table:
        """``staged``'s temporary tables, then its statement, in chDB's one session and under its lock
        (no other query sees or drops them); where a stage fails, ``sql`` (:mod:`.staged`)."""
        with ChdbBackend._lock:
            made: list[str] = []
            try:
                try:
                    empty: set[str] = set()
                    largest = 0  # rows of the largest table made so far
                    for i, (name, _) in enumerate(staged.temps):
                        rows = self._make(staged, i, params, empty, self._plain(staged, i, largest))
                        if not rows:
                            empty.add(name)
                        largest = max(largest, rows)
                        made.append(name)
                    plain = self._plain(staged, len(staged.temps), largest)
                    return self._run(staged.main + (f" SETTINGS {_PLAIN}" if plain else ""), _used(staged.main, params))
                except BackendError:  # the single statement: the same rows, or the error it has
                    self.fallbacks += 1
                    return self._run(sql, params)
            finally:
                if made:
                    self._run(f"DROP TEMPORARY TABLE IF EXISTS {', '.join(made)}", None)

    small_rows = 100_000
    """Statements over stage tables of at most this many rows run with ``query_plan_enable_optimizations
    = 0``: planning them takes longer than the plan saves (docs/benchmarks.md, "100 M spans")."""

    def _plain(self, staged: Staged, i: int, largest: int) -> bool:
        """Statement ``i`` (``len(temps)``: the final one) reads small stage tables only."""
        return bool(staged.local) and staged.local[i] and largest <= self.small_rows

    def _make(self, staged: Staged, i: int, params: dict | None, empty: set[str], plain: bool) -> int:
        """Stage ``i``'s table (under ``_lock``); its rows.  A stage strict in a table already empty
        (:func:`.staged.strict_in`), whose columns a run has seen, is made empty from them: no analysis,
        no plan.  ``plain``: without plan optimizations (:attr:`small_rows`)."""
        name, select = staged.temps[i]
        strict = staged.strict[i] if staged.strict else frozenset()
        columns = ChdbBackend._columns.get(select)
        if strict & empty and columns is not None and not any(map(self._is_aggregate, staged.assumed[i])):
            self._run(f"CREATE TEMPORARY TABLE {name} ({columns}) ENGINE = Memory{_LOW_CARD}", None)
            self.elided += 1
            return 0
        self._run(_create_temp(name, select, plain), _used(select, params))
        written = self._written
        if strict and columns is None:  # it may be made empty later: keep its columns
            described = self._run(f"DESCRIBE TABLE {name}", None).to_pylist()
            ChdbBackend._columns[select] = ", ".join(f"{_quote(r['name'])} {r['type']}" for r in described)
        return written

    def _is_aggregate(self, name: str) -> bool:
        """Whether ``name`` is an aggregate here: one of ``system.functions``' or one with combinators
        (``uniqExactIf``: ``system.aggregate_function_combinators``' suffixes)."""
        if ChdbBackend._aggregates is None:
            names = self._run("SELECT name FROM system.functions WHERE is_aggregate", None).column("name")
            suffixes = self._run("SELECT name FROM system.aggregate_function_combinators", None).column("name")
            ChdbBackend._aggregates = (
                frozenset(n.lower() for n in names.to_pylist()),
                tuple(n.lower() for n in suffixes.to_pylist()),
            )
        aggregates, combinators = ChdbBackend._aggregates
        name = name.lower()
        while name not in aggregates:
            base = next((name[: -len(c)] for c in combinators if name.endswith(c) and len(name) > len(c)), None)
            if base is None:
                return False
            name = base
        return True

    def _run(self, sql: str, params: dict | None) -> pa.Table:
        """One statement (under ``_lock``)."""
        result = _has_result(sql)
        params = _bound(params)
        conn = ChdbBackend._connection()
        try:
            out = conn.query(sql, "Arrow" if result else "CSV", params=params or None)
        except Exception as exc:  # noqa: BLE001
            raise BackendError(_one_line(exc)) from None
        self.rows_read += out.storage_rows_read()
        self.bytes_read += out.storage_bytes_read()
        self._written = out.rows_written()
        if not result:
            return pa.table({})
        return normalise(pa.ipc.open_file(pa.py_buffer(out.bytes())).read_all())

    def command(self, sql: str) -> None:
        with ChdbBackend._lock:
            conn = ChdbBackend._connection()
            try:
                conn.query(sql, "CSV")
            except Exception as exc:  # noqa: BLE001
                raise BackendError(_one_line(exc)) from None

    @staticmethod
    def _connection() -> Any:
        """chDB's connection (under ``_lock``); a backend made before :meth:`shutdown` is refused."""
        if ChdbBackend._conn is None:
            raise BackendError("chDB was shut down in this process; open the backend again")
        return ChdbBackend._conn

    def close(self) -> None:
        """Nothing: every backend of the process shares chDB's one connection (:meth:`shutdown`)."""

    @classmethod
    def shutdown(cls) -> None:
        """Close chDB's connection; the process may then open another directory (backends made
        before stop working).  Tests call it between modules."""
        with cls._lock:
            if cls._conn is not None:
                cls._conn.close()
            cls._conn, cls._path = None, None
            cls._columns, cls._aggregates = {}, None


class ServerBackend:
    """A ClickHouse server through clickhouse-connect (HTTP)."""

    fallbacks = 0
    """As :attr:`ChdbBackend.fallbacks`."""

    def __init__(self, url: str) -> None:
        try:
            import clickhouse_connect
        except ImportError:
            raise BackendError("clickhouse-connect is not installed: pip install 'kvtrace[clickhouse]'") from None
        u = urllib.parse.urlsplit(url)
        secure = u.scheme == "https"
        kwargs: dict[str, Any] = dict(
            host=u.hostname or "127.0.0.1",
            port=u.port or (8443 if secure else 8123),
            secure=secure,
            username=urllib.parse.unquote(u.username or "default"),
            password=urllib.parse.unquote(u.password or ""),
            settings=dict(SETTINGS),
            autogenerate_session_id=False,
            connect_timeout=10,
        )
        database = u.path.strip("/")
        if database:
            kwargs["database"] = database
        try:
            self.client = clickhouse_connect.get_client(**kwargs)
        except Exception as exc:  # noqa: BLE001 - clickhouse-connect raises several kinds
            raise BackendError(f"cannot connect to ClickHouse at {redact(url)}: {_one_line(exc)}") from None
        self.description = redact(url)

    def query(self, sql: str, params: dict | None = None, session: str | None = None) -> pa.Table:
        settings = {"session_id": session} if session else None
        try:
            if not _has_result(sql):
                self.client.command(sql, parameters=params or None, settings=settings)
                return pa.table({})
            return normalise(
                self.client.query_arrow(sql, parameters=params or None, settings=settings, use_strings=True)
            )
        except Exception as exc:  # noqa: BLE001
            raise BackendError(_one_line(exc)) from None

    def query_staged(self, staged: Staged, sql: str, params: dict | None = None) -> pa.Table:
        """``staged``'s temporary tables, then its statement, in an HTTP session of their own (a
        server's temporary tables live in one session; concurrent queries each have theirs); where a
        stage fails, ``sql`` (:mod:`.staged`)."""
        session = uuid.uuid4().hex
        made: list[str] = []
        try:
            try:
                for name, select in staged.temps:
                    self.query(_create_temp(name, select), _used(select, params), session)
                    made.append(name)
                return self.query(staged.main, _used(staged.main, params), session)
            except BackendError:  # e.g. a balancer sent a stage to another replica: the single statement
                self.fallbacks += 1
                return self.query(sql, params)
        finally:
            for name in made:
                with contextlib.suppress(BackendError):  # the session expires with them anyway
                    self.query(f"DROP TEMPORARY TABLE IF EXISTS {name}", None, session)

    def command(self, sql: str) -> None:
        self.query(sql)

    def close(self) -> None:
        self.client.close()


_LOW_CARD = " SETTINGS allow_suspicious_low_cardinality_types = 1"
_PLAIN = "query_plan_enable_optimizations = 0"


def _create_temp(name: str, select: str, plain: bool = False) -> str:
    # the table keeps the types the CTE computes: LowCardinality flags too
    return f"CREATE TEMPORARY TABLE {name} ENGINE = Memory AS {select}{_LOW_CARD}" + (f", {_PLAIN}" if plain else "")


def _bound(params: dict | None) -> dict:
    return {k: _NULL if v is None else v for k, v in (params or {}).items()}


def _quote(name: str) -> str:
    return "`" + name.replace("\\", "\\\\").replace("`", "\\`") + "`"


def _used(sql: str, params: dict | None) -> dict:
    """The parameters ``sql`` reads (each statement of a staged query binds its own)."""
    return {k: v for k, v in (params or {}).items() if "{" + k + ":" in sql}


def _has_result(sql: str) -> bool:
    head = sql.lstrip().lstrip("(").split(None, 1)
    return bool(head) and head[0].upper() in ("SELECT", "WITH", "DESCRIBE", "SHOW", "EXPLAIN")


def _settings_sql(settings: dict) -> str:
    return ", ".join(f"{k} = {v!r}" if isinstance(v, str) else f"{k} = {v}" for k, v in settings.items())


def redact(url: str) -> str:
    u = urllib.parse.urlsplit(url)
    if u.password is None:
        return url
    netloc = f"{u.username}:***@{u.hostname}" + (f":{u.port}" if u.port else "")
    return urllib.parse.urlunsplit((u.scheme, netloc, u.path, u.query, u.fragment))


def open_backend(url: str):
    """A backend for ``url`` (module doc)."""
    if url.startswith(CHDB_PREFIX):
        path = url[len(CHDB_PREFIX) :]
        if not path:
            raise BackendError("chdb: needs a database directory, e.g. --clickhouse chdb:./kvtrace-chdb")
        return ChdbBackend(path)
    scheme = urllib.parse.urlsplit(url).scheme
    if scheme in ("http", "https"):
        return ServerBackend(url)
    raise BackendError(f"--clickhouse {redact(url)}: expected http://HOST:PORT, https://HOST:PORT or chdb:PATH")
