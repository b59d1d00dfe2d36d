"""The dashboard opens only what it was started with: a page's directory box refuses a ClickHouse
source, a chDB path and a directory outside the started roots with a clear message, and makes
no outbound connection for them (Streamlit AppTest)."""

from __future__ import annotations

import socket
import threading
from pathlib import Path

import pytest

pytest.importorskip("streamlit")
from streamlit.testing.v1 import AppTest  # noqa: E402

from kvtrace.testing.synth import sample_store  # noqa: E402

APP = Path(__file__).resolve().parents[2] / "dashboards" / "app.py"
NOT_A_DIRECTORY = (
    "is not a directory: this page opens only trace directories below the ones the dashboard was started "
    "with; a ClickHouse table is chosen at start (`kvtrace dashboard --clickhouse URL --table T`)."
)


class Listener:
    """A local listening socket that must receive nothing: a thread accepts and closes at once
    whatever connects (so a client that does connect fails fast instead of hanging on a reply),
    counting it."""

    def __init__(self) -> None:
        self.sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(16)
        self.sock.settimeout(0.05)
        self.port = self.sock.getsockname()[1]
        self.accepted = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._serve, daemon=True)
        self._thread.start()

    def _serve(self) -> None:
        while not self._stop.is_set():
            try:
                conn, _ = self.sock.accept()
            except TimeoutError:
                continue
            except OSError:
                return
            self.accepted += 1
            conn.close()

    def received(self) -> int:
        """Connections so far, including any still in the accept backlog."""
        self._stop.set()
        self._thread.join()
        self.sock.setblocking(False)
        try:
            while True:
                self.sock.accept()[0].close()
                self.accepted += 1
        except BlockingIOError:
            pass
        return self.accepted


@pytest.fixture
def listener():
    server = Listener()
    yield server
    server.sock.close()


@pytest.fixture
def started(tmp_path, monkeypatch):
    """The dashboard as ``kvtrace dashboard --traces .`` in a directory holding one run (the
    issue's set-up: every relative text passes a naive "below the root" check)."""
    sample_store(tmp_path, sessions=2, turns=2)
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("KVTRACE_TRACES_DIR", ".")
    for name in ("KVTRACE_COMPARE_DIR", "KVTRACE_CLICKHOUSE", "KVTRACE_CLICKHOUSE_TABLE"):
        monkeypatch.delenv(name, raising=False)
    return tmp_path


def _with_text(label: str, text: str, page: str = "app_pages/sessions.py") -> AppTest:
    """The page rendered, then ``text`` typed into its text box ``label``."""
    at = AppTest.from_file(str(APP), default_timeout=60).run()
    at.switch_page(page).run()
    assert not at.error, [e.value for e in at.error]
    (box,) = [t for t in at.text_input if t.label == label]
    box.set_value(text).run()
    assert not at.exception, [e.value for e in at.exception]
    return at


def _errors(at: AppTest) -> list[str]:
    return [e.value for e in at.error]


def test_a_clickhouse_url_in_the_directory_box_is_refused_and_nothing_connects(started, listener):
    port = listener.port
    text = f"clickhouse:otel_traces http://127.0.0.1:{port}/"
    at = _with_text("Trace directory", text)
    assert _errors(at) == [f"Trace directory `{text}` {NOT_A_DIRECTORY}"]
    assert not at.title  # the page stopped before reading anything
    assert listener.received() == 0


@pytest.mark.parametrize("form", ["clickhouse:otel_traces chdb:{db}", "chdb:{db}", "CHDB:{db}"])
def test_a_chdb_path_in_the_directory_box_is_refused_and_not_opened(started, tmp_path_factory, form):
    db = tmp_path_factory.mktemp("elsewhere") / "db"  # chDB would create it when opening
    text = form.format(db=db)
    at = _with_text("Trace directory", text)
    assert _errors(at) == [f"Trace directory `{text}` {NOT_A_DIRECTORY}"]
    assert not db.exists()


def test_a_directory_outside_the_started_root_is_refused(started, tmp_path_factory):
    outside = tmp_path_factory.mktemp("other-run")
    sample_store(outside, sessions=1, turns=1)
    at = _with_text("Trace directory", str(outside))
    assert _errors(at) == [
        f"Trace directory `{outside}` is outside the trace directories this dashboard was started with "
        f"(`{started}`); choose one of them or a directory below it."
    ]


def test_the_baseline_box_refuses_a_clickhouse_url_and_nothing_connects(started, listener):
    port = listener.port
    text = f"clickhouse:otel_traces http://default@127.0.0.1:{port}/"
    at = _with_text("Baseline trace directory", text, page="app_pages/compare.py")
    assert _errors(at) == [f"Baseline trace directory `{text}` {NOT_A_DIRECTORY}"]
    assert listener.received() == 0


def test_the_started_directory_still_renders_with_its_data(started):
    at = _with_text("Trace directory", ".")
    assert not at.error, _errors(at)
    assert {m.label: m.value for m in at.metric}["Sessions"] == "2"


def test_the_store_opens_only_started_sources_and_reads_nothing_outside(started, listener, monkeypatch):
    """Below the pages: ``common.store`` itself refuses a ClickHouse key it was not started with,
    and its DuckDB connection cannot read a file outside the trace directory."""
    import duckdb

    from kvtrace.dashboards import common
    from kvtrace.store.reader import StoreError

    monkeypatch.setattr("sys.argv", ["app.py"])
    common.store.clear()
    with pytest.raises(StoreError, match="is not a directory"):
        common.store(f"clickhouse:otel_traces http://127.0.0.1:{listener.port}/")
    con = common.store(".")
    assert con.execute("SELECT count(DISTINCT session_id) FROM sessions").fetchone() == (2,)
    with pytest.raises(duckdb.PermissionException, match="disabled by configuration"):
        con.execute("SELECT * FROM read_csv($p)", {"p": str(APP)})
    common.store.clear()
    assert listener.received() == 0
