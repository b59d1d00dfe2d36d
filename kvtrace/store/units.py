"""Units shared by the views, the analysis and the dashboard (one definition each)."""

from __future__ import annotations

GIB = 2**30
"""Bytes in a GiB: KV held is reported in GiB and GiB·s."""
