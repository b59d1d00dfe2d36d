"""kvtrace.analysis.report: what ``kvtrace report`` and ``kvtrace demo`` print.  :mod:`.text` renders
the analysis results as plain-text and Markdown tables (shared by the demo's console summary and
the report) from :mod:`.cells` (cell formats, Markdown escaping, the pipe table); :mod:`.document`
assembles the report's sections and plots as Markdown or HTML.
"""
