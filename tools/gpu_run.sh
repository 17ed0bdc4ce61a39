#!/usr/bin/env bash
# Runs THERE, on the GPU machine (the device tool's `run`), from anywhere in the repository:
#
#     bash tools/gpu_run.sh [all|tests|bench|kernels|models|profile|setup]   (default: all = tests, bench)
#
# setup  (always done first; skipped when nothing changed since the last call on a warm machine)
#        the image's python3 with its packages (torch, triton, networkx, pytest, pytest-xdist);
#        bytecode from the wheel in gpu_wheels/ (made here by tools/gpu_setup_wheels.sh and
#        carried along) installed offline into build/gpu-site; framejit's two C extensions
#        compiled in place with cc.
# tests  FRAMEJIT_TEST_GPU=1: tests/kernels and tests/backends on CUDA tensors compiled for real
#        (the C renderer's own tests and fuzzer, which run on the CPU in `make test`, left out),
#        then every test marked `gpu`.
# bench  kernels, then models:
#   kernels  benchmarks/kernels.py --quick (CSV too; KERNELS_ARGS replaces --quick);
#   models   benchmarks/models.py --device cuda --quick.
# profile  benchmarks/gpu_profile.py: wall vs GPU time and kernels per call of four models, and the
#        host time of one fused launch, for eager, framejit and Inductor (not part of all).
#
# Logs (and benchmarks/kernels.py's CSV) go to $OUT when it is set, else build/gpu-run/; each
# step's output is also printed. Every step runs even if an earlier one failed; the exit status
# says whether all of them passed. PYTHON picks the base interpreter (default python3);
# GPU_TEST_WORKERS the pytest-xdist workers for the kernel tests (default 16, 0 for none);
# STEP_TIMEOUT (seconds) stops any one step that runs longer, so that the later steps still run
# inside the device's 10-minute limit per command.

set -u -o pipefail
cd "$(dirname "$0")/.."
export PYTHONUNBUFFERED=1

what=${1:-all}
case $what in
    all | tests | bench | kernels | models | profile | setup) ;;
    *) echo "usage: bash tools/gpu_run.sh [all|tests|bench|kernels|models|profile|setup]" >&2; exit 2 ;;
esac

logs=${OUT:-build/gpu-run}
mkdir -p "$logs"
py=${PYTHON:-python3}
# The carried wheels go to a target folder (no venv: the image's python3 is itself a venv, and
# a venv made from it would not see torch); the repository root makes framejit importable from
# the benchmarks' folder too.
site=build/gpu-site
export PYTHONPATH="$PWD/$site:$PWD${PYTHONPATH:+:$PYTHONPATH}"
status=0

setup() {
    local stamp want
    want=$(cat csrc/*.c gpu_wheels/*.whl 2>/dev/null | sha1sum | cut -d' ' -f1)
    stamp=$site/.gpu-run-stamp
    if [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$want" ] \
        && "$py" -c "import framejit._C, framejit._claunch, bytecode" 2>/dev/null; then
        echo "setup: $site and the C extensions are up to date"
        return 0
    fi
    rm -rf "$site"
    mkdir -p "$site"
    if ls gpu_wheels/bytecode-*.whl >/dev/null 2>&1; then
        "$py" -m pip install --disable-pip-version-check -q --no-index --no-deps --no-compile \
            --no-cache-dir --target "$site" gpu_wheels/bytecode-*.whl || return 1
    elif ! "$py" -c "import bytecode" 2>/dev/null; then
        echo "setup: no gpu_wheels/ and no bytecode: run 'bash tools/gpu_setup_wheels.sh' on the" \
             "machine with registry access and pass carry: [\"gpu_wheels\"] to run" >&2
        return 1
    fi
    # framejit's two C extensions (pyproject.toml's ext-modules), compiled in place.
    local include suffix
    include=$("$py" -c 'import sysconfig; print(sysconfig.get_paths()["include"])') || return 1
    suffix=$("$py" -c 'import sysconfig; print(sysconfig.get_config_var("EXT_SUFFIX"))') || return 1
    ${CC:-cc} -shared -fPIC -O2 -Wall -Wno-unused-function -I"$include" csrc/eval_frame.c \
        -o "framejit/_C$suffix" || return 1
    ${CC:-cc} -shared -fPIC -O2 -Wall -I"$include" csrc/claunch.c -o "framejit/_claunch$suffix" || return 1
    "$py" -c "import framejit._C, framejit._claunch, bytecode; print('setup: framejit imports')" || return 1
    echo "$want" >"$stamp"
}

# step NAME COMMAND...: runs it, its output to the screen and to $logs/NAME.log.
step() {
    local name=$1
    shift
    echo
    echo "==== $name: $*"
    local t0=$SECONDS
    local limit=()
    if [ -n "${STEP_TIMEOUT:-}" ] && [ "$name" != setup ]; then
        limit=(timeout "$STEP_TIMEOUT")
    fi
    "${limit[@]}" "$@" 2>&1 | tee "$logs/$name.log"
    local rc=${PIPESTATUS[0]}
    echo "==== $name: exit $rc after $((SECONDS - t0)) s"
    [ "$rc" -eq 0 ] || status=1
    return "$rc"
}

about() {
    if command -v nvidia-smi >/dev/null; then
        nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.sm,clocks.mem --format=csv
    fi
    "$py" - <<'EOF'
import sys, torch, triton
print(f"Python {sys.version.split()[0]} at {sys.executable}; torch {torch.__version__}; "
      f"triton {triton.__version__}; CUDA available: {torch.cuda.is_available()}")
if torch.cuda.is_available():
    print("device:", torch.cuda.get_device_name())
EOF
}

tests() {
    local extra=()
    local workers=${GPU_TEST_WORKERS:-16}
    if [ "$workers" != 0 ] && "$py" -c "import xdist" 2>/dev/null; then
        extra+=(-n "$workers")
    fi
    if "$py" -c "import pytest_timeout" 2>/dev/null; then
        extra+=(--timeout 120)
    fi
    local c_only=()
    for f in tests/kernels/test_c.py tests/kernels/test_c_*.py tests/kernels/test_pattern_fuzz.py; do
        c_only+=(--ignore "$f")
    done
    # One pool of compile workers per xdist worker would be 256 processes: none here (tests_gpu
    # has one, and a test of it).
    step tests_kernels env FRAMEJIT_TEST_GPU=1 FRAMEJIT_COMPILE_WORKERS=0 "$py" -m pytest tests/kernels tests/backends \
        -m "not slow and not fuzz" "${c_only[@]}" -rfE -p no:cacheprovider "${extra[@]}"
    step tests_gpu env FRAMEJIT_TEST_GPU=1 "$py" -m pytest tests -m gpu -rfE -p no:cacheprovider
}

bench_kernels() {
    # shellcheck disable=SC2086  # KERNELS_ARGS is a list of options
    step bench_kernels "$py" benchmarks/kernels.py ${KERNELS_ARGS:---quick} --csv "$logs/kernels.csv"
}

bench_models() {
    step bench_models "$py" benchmarks/models.py --device cuda --quick
}

profile() {
    step profile "$py" benchmarks/gpu_profile.py
}

if ! step setup setup; then
    echo "setup failed: nothing else runs" >&2
    exit 1
fi
about 2>&1 | tee "$logs/about.log"
case $what in
    all) tests; bench_kernels; bench_models ;;
    tests) tests ;;
    bench) bench_kernels; bench_models ;;
    kernels) bench_kernels ;;
    models) bench_models ;;
    profile) profile ;;
    setup) ;;
esac
exit $status
