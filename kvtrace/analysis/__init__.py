"""kvtrace.analysis: the answers, as named queries over the store's views.

Where agent time goes (:mod:`.breakdown`, :mod:`.sessions`), what KV reuse saved (:mod:`.reuse`),
what D held (:mod:`.retention`), TTFT by turn (:mod:`.latency`), and the ``kvtrace report``
command (:mod:`.report`, :mod:`.report_cli`) with its text tables (:mod:`.text`).  Reads the store
(:mod:`kvtrace.store`); the dashboard (:mod:`kvtrace.dashboards`) and the demo call these
functions and never build SQL themselves.
"""
