"""Which packages the wheel holds, and its C extensions (the rest of the build is in pyproject.toml).

Every package under ``kvtrace/``, found, and the Streamlit app: it lives in the top-level
``dashboards/`` folder and ships as ``kvtrace.dashboards``, so ``kvtrace dashboard`` runs from a
wheel as from a checkout.  Its pages import kvtrace as installed (``kvtrace.dashboards.common``).
"""

from setuptools import Extension, find_packages, setup

DASHBOARDS = ["kvtrace.dashboards"] + [f"kvtrace.dashboards.{p}" for p in find_packages("dashboards")]

setup(
    packages=find_packages(include=["kvtrace", "kvtrace.*"]) + DASHBOARDS,
    package_dir={"kvtrace.dashboards": "dashboards"},
    # the digest's tags in C (kvtrace/kvdigest/_ctags.c): optional, so that an install without a
    # compiler still works, on the same tags in Python (kvtrace.kvdigest.IMPLEMENTATION says which)
    ext_modules=[
        Extension(
            "kvtrace.kvdigest._ctags",
            ["kvtrace/kvdigest/_ctags.c"],
            depends=["kvtrace/kvdigest/blake2b.h", "kvtrace/kvdigest/strict_b64.h"],
            optional=True,
        ),
        # the simulator's tokenizer and KV block pool in C (kvtrace/sim/_ctok.c, _ckv.c), optional
        # in the same way (kvtrace.sim.tokenizer.IMPLEMENTATION, kvtrace.sim.kvcache.IMPLEMENTATION)
        Extension("kvtrace.sim._ctok", ["kvtrace/sim/_ctok.c"], optional=True),
        Extension("kvtrace.sim._ckv", ["kvtrace/sim/_ckv.c"], optional=True),
        # the JSON codec's pre-check of a body (kvtrace/_cjson.c), optional in the same way
        Extension("kvtrace._cjson", ["kvtrace/_cjson.c"], optional=True),
    ],
)
