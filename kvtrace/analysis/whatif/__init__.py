"""kvtrace.analysis.whatif: replay recorded traffic under other retention TTLs and recompute
thresholds, without servers.  :mod:`.data` reads what a trace store recorded (its named queries in
:mod:`.sql`, its numpy arrays built by :mod:`.arrays`), :mod:`.replay` re-decides every turn with
vLLM's rules on a grid of settings (what the settings share computed once by :mod:`.fixed`) and
recommends one, :mod:`.summary` shapes the result for the dashboard and ``kvtrace report``.
"""
