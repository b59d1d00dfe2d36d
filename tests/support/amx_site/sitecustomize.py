"""Loaded by every vLLM process the P/D rig starts (``PYTHONPATH``): asks Linux for the AMX tile
state before vLLM's CPU attention runs.

vLLM's CPU build (0.32) picks its AMX attention kernel on AMX hosts for bfloat16 and block sizes
that are multiples of 32, but never requests the tile state (``arch_prctl(ARCH_REQ_XCOMP_PERM)``);
it works only when oneDNN's AMX matmul ran first in the process and requested it.  A decode
worker's first forward after a pull is a one-token query, whose matmuls take oneDNN's non-AMX path,
so its first AMX instruction is vLLM's and the kernel kills the engine with SIGILL.  An offline run
whose first prompt is one token shows the same; ``torch._C._cpu._init_amx()`` (torch's own
request) before it fixes both.  Permission is per process, so each engine process asks for itself.
"""

try:
    import torch

    torch._C._cpu._init_amx()
except Exception:  # no torch, or a CPU without AMX: nothing to ask for
    pass
