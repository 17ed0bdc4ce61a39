#!/usr/bin/env bash
# The capture and model tests on CPython 3.11 and 3.12, in two lanes side by side (one core
# each), and with FX=1 the torch.fx export run (make test-fx) in the second lane after 3.12's.
#
#   PY=.venv/bin/python PY312=.venv-py312/bin/python FX=1 tools/test_py.sh
#
# Lane 1: every test on 3.11 (tests/hook aside: tools/hook_tests.sh runs those). Its output
# streams as it runs.
# Lane 2: the tests on 3.12, less the ones whose code does not depend on the Python version
# (VERSION_FREE: kernels, passes, the graph IR take a finished graph; no bytecode), then the fx
# run. Its output goes to build/test-py312.log and build/test-fx.log, printed after lane 1's.
# On the 2-core project machine (a Zen 3 VM) this balances the lanes, about 16 minutes each,
# where 3.12's full run beside 3.11's, then the fx run, took about 21. PY312 empty: no 3.12 run, said so. Exits non-zero if any
# run fails; every run always runs.
set -uo pipefail
cd "$(dirname "$0")/.."

PY=${PY:-.venv/bin/python}
PY312=${PY312:-}
FX=${FX:-0}
VERSION_FREE=(tests/kernels tests/passes tests/fx_ir)

mkdir -p build
rm -f build/test-py312.status build/test-fx.status

version() { "$1" -c 'import platform; print(platform.python_version())'; }

lane2() {
    if [ -n "$PY312" ]; then
        ignores=(--ignore=tests/hook)
        for path in "${VERSION_FREE[@]}"; do
            ignores+=("--ignore=$path")
        done
        "$PY312" -m pytest tests "${ignores[@]}" > build/test-py312.log 2>&1
        echo $? > build/test-py312.status
    fi
    if [ "$FX" = 1 ]; then
        FRAMEJIT_TEST_BACKEND=fx "$PY" -m pytest tests/capture tests/models tests/api \
            > build/test-fx.log 2>&1
        echo $? > build/test-fx.status
    fi
}

# Each lane runs as a background job in a process group of its own (set -m), which the script
# waits for: an interrupt or a TERM stops the script at once (a foreground command would have
# delayed its trap to that command's end), and its trap stops both lanes' whole groups.
set -m
lane2 &
lane2_pid=$!
echo
echo "== capture and model tests on CPython $(version "$PY")"
"$PY" -m pytest tests --ignore=tests/hook &
lane1_pid=$!
stop_lanes() {
    kill -TERM -- "-$lane1_pid" "-$lane2_pid" 2>/dev/null
}
trap 'stop_lanes; exit 130' INT TERM

status=0
wait "$lane1_pid" || status=1
wait "$lane2_pid"

echo
if [ -n "$PY312" ]; then
    echo "== capture and model tests on CPython $(version "$PY312")" \
         "(not ${VERSION_FREE[*]}: those do not depend on the Python version)"
    cat build/test-py312.log
    [ "$(cat build/test-py312.status 2>/dev/null)" = 0 ] || status=1
else
    echo "== capture and model tests on CPython 3.12: skipped, no CPython 3.12 found"
fi
if [ "$FX" = 1 ]; then
    echo
    echo "== tests/capture tests/models tests/api through the torch.fx export" \
         "(FRAMEJIT_TEST_BACKEND=fx)"
    cat build/test-fx.log
    [ "$(cat build/test-fx.status 2>/dev/null)" = 0 ] || status=1
fi
exit $status
