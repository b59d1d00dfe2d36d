"""kvtrace.collect: ``kvtrace collect``, an OTLP receiver (gRPC and HTTP, protobuf and JSON)
that writes what it receives into the Parquet store (:mod:`kvtrace.store`), with a bounded
queue and back-pressure.  Spans from anything that speaks OTLP (vLLM's own ``llm_request``
spans, kvtrace processes elsewhere, an OTel Collector) land beside kvtrace's own.
"""
