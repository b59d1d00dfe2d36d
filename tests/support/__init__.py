"""Plain helpers the tests share (rigs, checks, corpora): ``from support import vllm_rig``.  Fixtures
live in the conftest.py of the folder whose tests use them."""
