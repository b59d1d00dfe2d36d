"""kvtrace.bench: the multi-turn agent benchmark behind ``kvtrace bench``.

Scenarios and workloads (:mod:`.scenarios`, :mod:`.workload`, :mod:`.distributions`), vLLM's
multi-turn benchmark inputs (:mod:`.vllm_inputs`), the driver that runs sessions through the
traced ``openai`` client of :mod:`kvtrace.agent` (:mod:`.runner`, :mod:`.bench`), statistics
(:mod:`.stats`), the four-arm run of the published against a production configuration on
simulated clusters (:mod:`.arms`) and the command (:mod:`.cli`).  Drives the system; instruments nothing itself.
"""
