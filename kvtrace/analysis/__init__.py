"""kvtrace.analysis: the answers, as named queries over the store's views.

Where agent time goes (:mod:`.sessions`, over the store's breakdown views), what KV reuse saved
(:mod:`.reuse`), what D held (:mod:`.retention`), TTFT by turn (:mod:`.latency`), whether run B
beat run A (:mod:`.compare`: the one rule of ``kvtrace bench``, the demo, the report and the
dashboard), how often clients break session continuity (:mod:`.continuity`), the four-arm
table of ``kvtrace bench --arms`` (:mod:`.arms`), and the ``kvtrace report`` command
(:mod:`.report`, :mod:`.report_cli`) with its text tables (:mod:`.text`).  Reads the store
through :func:`kvtrace.store.connect`; the dashboard (:mod:`kvtrace.dashboards`) and the demo
call these functions and never build SQL themselves.
"""
