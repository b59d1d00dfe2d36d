"""The kvtrace span contract: every span name, attribute key, event name and enumerated value.

Nothing else in kvtrace types one of these strings.  OpenTelemetry names are reused where one
exists (``gen_ai.*`` GenAI semantic conventions, ``session.id``, ``error.type``, ``server.*``,
``http.*``); everything else lives under the ``kvtrace.`` namespace.  The ``gen_ai.*`` names follow
the GenAI conventions of :data:`GENAI_SEMCONV_VERSION` (docs/semconv.md says more).

``docs/semconv.md`` is generated from :data:`SPANS`, :data:`RESOURCE`, :data:`EVENTS` and
:data:`KV_TRANSFER_FIELDS` with ``python -m kvtrace.semconv``; a test fails when a constant
defined here is missing from it.

Timebase: every span carries wall-clock timestamps of the process that emitted it, except a run on
the virtual clock (``kvtrace.sim.clock`` ``virtual``, a resource attribute of its simulated workers),
whose timestamps are simulated.  The served simulator compresses time by ``kvtrace.sim.time_scale``
(a resource attribute); multiply its durations by that factor to read them in simulated model time.
"""

from kvtrace.semconv.conventions import *  # noqa: F403  (other conventions, roles: ``sc.ROLE_RULES``)
from kvtrace.semconv.metrics import *  # noqa: F403  (the Prometheus families: ``sc.METRICS``)
from kvtrace.semconv.names import *  # noqa: F403  (the names: ``sc.SPAN_KV_DECISION``)
from kvtrace.semconv.render import render_markdown, render_metrics_markdown  # noqa: F401
from kvtrace.semconv.spec import *  # noqa: F403  (what they mean: ``sc.SPANS``, ``sc.METRICS``)
