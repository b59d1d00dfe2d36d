#!/usr/bin/env bash
# The fast tests (store, emit, telemetry/fast spans, semconv, layout) against the oldest and the
# newest versions pyproject.toml allows of the core dependencies (+ the proxy extra, for the
# proxy's fast spans).  Two virtual environments, made with uv (installed from PyPI when not on
# PATH): `lowest` resolves every direct dependency to its lower bound (uv's
# --resolution lowest-direct), `highest` to the newest allowed.  The test tools are the newest in
# both.  kvtrace is installed from the working tree (not editable) and tested as installed.
#
#   scripts/deps_bounds.sh            # both; exit status non-zero if either fails
#   scripts/deps_bounds.sh lowest     # one
#
# KVTRACE_DEPS_DIR: where the environments go (default: a temporary directory, removed after);
# PYTHON: the interpreter (default python3.11, the oldest Python kvtrace supports; python3 where
# the machine has no 3.11).
set -euo pipefail

ROOT=$(cd "$(dirname "$0")/.." && pwd)
PYTHON=${PYTHON:-$(command -v python3.11 || command -v python3)}
MODES=("$@")
[ ${#MODES[@]} -gt 0 ] || MODES=(lowest highest)
if [ -n "${KVTRACE_DEPS_DIR:-}" ]; then
    WORK=$KVTRACE_DEPS_DIR
    mkdir -p "$WORK"
else
    WORK=$(mktemp -d)
    trap 'rm -rf "$WORK"' EXIT
fi

UV=$(command -v uv || true)
if [ -z "$UV" ]; then
    "$PYTHON" -m venv "$WORK/uv-tool"
    "$WORK/uv-tool/bin/pip" install -q --disable-pip-version-check uv
    UV=$WORK/uv-tool/bin/uv
fi

# the fast subset; globs, so that tests moved into package folders (tests/store/...) still count
TESTS=()
for pattern in tests/test_store_*.py tests/store tests/test_recorder.py tests/emit tests/test_fastspans.py \
    tests/test_proxy_fastspans.py tests/telemetry tests/test_telemetry.py tests/test_semconv.py tests/semconv \
    tests/test_layout.py; do
    for path in "$ROOT"/$pattern; do
        [ -e "$path" ] && TESTS+=("$path")
    done
done

status=0
for mode in "${MODES[@]}"; do
    case $mode in
        lowest) resolution=lowest-direct ;;
        highest) resolution=highest ;;
        *) echo "deps_bounds: unknown mode $mode (lowest, highest)" >&2; exit 2 ;;
    esac
    env_dir=$WORK/$mode
    started=$SECONDS
    "$UV" venv -q --clear --python "$PYTHON" "$env_dir"
    "$UV" pip install -q --python "$env_dir/bin/python" --resolution "$resolution" "$ROOT[proxy]"
    # the test tools, newest, without moving what kvtrace's install chose (chdb: the Parquet
    # cross-check of tests/plain_parquet.py)
    "$UV" pip freeze --python "$env_dir/bin/python" | grep -v '^kvtrace' >"$env_dir/chosen.txt"
    "$UV" pip install -q --python "$env_dir/bin/python" -c "$env_dir/chosen.txt" "pytest>=8" "pytest-asyncio>=0.23" \
        "pytest-timeout>=2.3" "hypothesis>=6.100" "chdb>=4.4"
    installed=$SECONDS
    echo "== $mode: $("$UV" pip freeze --python "$env_dir/bin/python" |
        grep -iE '^(opentelemetry-(api|sdk|exporter-otlp-proto-grpc)|pyarrow|duckdb|numpy|aiohttp|orjson|prometheus-client)==' |
        tr '\n' ' ')"
    # the installed kvtrace (built from this tree) runs: not from the tree, whose kvtrace/ lacks
    # kvtrace/dashboards; its own temporary directories, so pytest sweeps no one else's
    if (cd "$env_dir" && "$env_dir/bin/python" -m pytest -q -p no:cacheprovider -c "$ROOT/pyproject.toml" \
        --rootdir "$ROOT" --basetemp "$env_dir/tmp" -m "not slow and not vllm" "${TESTS[@]}"); then
        result=passed
    else
        result=FAILED
        status=1
    fi
    echo "== $mode: $result (install $((installed - started)) s, tests $((SECONDS - installed)) s)"
done
exit $status
