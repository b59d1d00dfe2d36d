#!/usr/bin/env bash
# The README's test command.  On a fresh machine it installs everything the tests need
# (scripts/install-dev.sh: system packages, ./.venv with the dev extra and vLLM's CPU build, Arize
# Phoenix and the agent stacks in side venvs), then runs the whole test suite, vLLM end-to-end
# tests included.
# Arguments go to pytest.  The fast loop without any of that is `make test` (CONTRIBUTING.md).
set -euo pipefail
cd "$(dirname "$0")/.."
if [ -z "${VIRTUAL_ENV:-}" ]; then
  [ -x .venv/bin/python ] || python3 -m venv .venv
  # shellcheck disable=SC1091
  . .venv/bin/activate
fi
bash scripts/install-dev.sh
export KVTRACE_PHOENIX_BIN="${KVTRACE_PHOENIX_VENV:-$PWD/.venv-phoenix}/bin/phoenix"
export KVTRACE_AGENT_STACKS_PYTHON="${KVTRACE_AGENT_STACKS_VENV:-$PWD/.venv-agents}/bin/python"
export KVTRACE_REQUIRE_VLLM=1 HF_HUB_OFFLINE=1 VLLM_NO_USAGE_STATS=1 CI="${CI:-true}"
exec python -m pytest "$@"
