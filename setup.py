"""Which packages the wheel holds (the rest of the build is in pyproject.toml).

Every package under ``kvtrace/``, found, and the Streamlit app: it lives in the top-level
``dashboards/`` folder and ships as ``kvtrace.dashboards``, so ``kvtrace dashboard`` runs from a
wheel as from a checkout.  Its pages import kvtrace as installed (``kvtrace.dashboards.common``).
"""

from setuptools import find_packages, setup

DASHBOARDS = ["kvtrace.dashboards"] + [f"kvtrace.dashboards.{p}" for p in find_packages("dashboards")]

setup(
    packages=find_packages(include=["kvtrace", "kvtrace.*"]) + DASHBOARDS,
    package_dir={"kvtrace.dashboards": "dashboards"},
)
