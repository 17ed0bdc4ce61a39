#!/usr/bin/env bash
# Runs THERE, on the GPU machine (the device tool's `run`), from anywhere in the repository:
#
#     bash tools/gpu_run.sh [all|tests|bench|kernels|models|setup]   (default: all = tests, bench)
#
# setup  (always done first; skipped when nothing changed since the last call on a warm machine)
#        a venv .venv-gpu on top of the image's python3 and its packages (torch, triton, networkx,
#        pytest), the wheels of gpu_wheels/ installed offline (bytecode, setuptools; made here by
#        tools/gpu_setup_wheels.sh and carried along), framejit's C extension built in place.
# tests  FRAMEJIT_TEST_GPU=1: tests/kernels and tests/backends on CUDA tensors compiled for real,
#        then every test marked `gpu`.
# bench  kernels, then models:
#   kernels  benchmarks/kernels.py --quick (CSV too);
#   models   benchmarks/models.py --device cuda --quick.
#
# Logs (and benchmarks/kernels.py's CSV) go to $OUT when it is set, else build/gpu-run/; each
# step's output is also printed. Every step runs even if an earlier one failed; the exit status
# says whether all of them passed. PYTHON picks the base interpreter (default python3);
# GPU_TEST_WORKERS the pytest-xdist workers for the kernel tests (default 8, 0 for none);
# STEP_TIMEOUT (seconds) stops any one step that runs longer, so that the later steps still run
# inside the device's 10-minute limit per command.

set -u -o pipefail
cd "$(dirname "$0")/.."
export PYTHONUNBUFFERED=1

what=${1:-all}
case $what in
    all | tests | bench | kernels | models | setup) ;;
    *) echo "usage: bash tools/gpu_run.sh [all|tests|bench|kernels|models|setup]" >&2; exit 2 ;;
esac

logs=${OUT:-build/gpu-run}
mkdir -p "$logs"
base_py=${PYTHON:-python3}
venv=.venv-gpu
py=$venv/bin/python
status=0

setup() {
    local stamp want
    want=$(cat csrc/eval_frame.c pyproject.toml gpu_wheels/*.whl 2>/dev/null | sha1sum | cut -d' ' -f1)
    stamp=$venv/.gpu-run-stamp
    if [ -x "$py" ] && [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$want" ] \
        && "$py" -c "import framejit" 2>/dev/null; then
        echo "setup: $venv is up to date"
        return 0
    fi
    rm -rf "$venv"
    # --without-pip: the image's pip serves the venv too (through the .pth below), and venv's
    # ensurepip may be missing from the image.
    "$base_py" -m venv --system-site-packages --without-pip "$venv" || return 1
    # The image's python3 is itself a venv (/opt/torch/.venv): a venv made from it sees only
    # the base interpreter's packages, not torch. Add the parent environment's site-packages
    # (with its own .pth files) after the new venv's.
    local site
    site=$("$py" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])') || return 1
    "$base_py" - "$site/_gpu_run_parent.pth" <<'EOF' || return 1
import site, sys
lines = [f"import site; site.addsitedir({d!r})" for d in site.getsitepackages()] if sys.prefix != sys.base_prefix else []
open(sys.argv[1], "w").write("\n".join(lines) + "\n")
EOF
    if ls gpu_wheels/*.whl >/dev/null 2>&1; then
        "$py" -m pip install --disable-pip-version-check -q --no-index --no-deps --no-cache-dir --ignore-installed \
            gpu_wheels/*.whl || return 1
    elif ! "$py" -c "import bytecode" 2>/dev/null; then
        echo "setup: no gpu_wheels/ and no bytecode: run 'bash tools/gpu_setup_wheels.sh' on the" \
             "machine with registry access and pass carry: [\"gpu_wheels\"] to run" >&2
        return 1
    fi
    # The repository's own build (pyproject.toml, setuptools); the editable install builds
    # framejit/_C.cpython-312-*.so in place. If setuptools cannot, compile the one C file directly.
    if ! "$py" -m pip install --disable-pip-version-check -q --no-build-isolation --no-deps -e .; then
        echo "setup: pip install -e . failed; compiling csrc/eval_frame.c directly" >&2
        local include suffix
        include=$("$py" -c 'import sysconfig; print(sysconfig.get_paths()["include"])')
        suffix=$("$py" -c 'import sysconfig; print(sysconfig.get_config_var("EXT_SUFFIX"))')
        ${CC:-cc} -shared -fPIC -O2 -Wall -Wno-unused-function -I"$include" csrc/eval_frame.c \
            -o "framejit/_C$suffix" || return 1
    fi
    "$py" -c "import framejit" || return 1
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
    local xdist=()
    local workers=${GPU_TEST_WORKERS:-8}
    if [ "$workers" != 0 ] && "$py" -c "import xdist" 2>/dev/null; then
        xdist=(-n "$workers")
    fi
    step tests_kernels env FRAMEJIT_TEST_GPU=1 "$py" -m pytest tests/kernels tests/backends \
        -m "not slow" -rfE "${xdist[@]}"
    step tests_gpu env FRAMEJIT_TEST_GPU=1 "$py" -m pytest tests -m gpu -rfE
}

bench_kernels() {
    step bench_kernels "$py" benchmarks/kernels.py --quick --csv "$logs/kernels.csv"
}

bench_models() {
    step bench_models "$py" benchmarks/models.py --device cuda --quick
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
    setup) ;;
esac
exit $status
