"""kvtrace.demo: ``kvtrace demo``, the whole pipeline on one machine.

Starts a simulated P/D cluster (:mod:`kvtrace.sim`) behind the traced proxy (:mod:`kvtrace.proxy`),
runs a :mod:`kvtrace.bench` agent workload with bidirectional KV transfer on and off, and prints
what :mod:`kvtrace.analysis` finds in the two trace directories.
"""
