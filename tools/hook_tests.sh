#!/usr/bin/env bash
# Build framejit._C (csrc/eval_frame.c) with gcc for every supported CPython found and run
# tests/hook against each build, without torch.
#
#   tools/hook_tests.sh                 all of 3.11 / 3.12 / 3.13 found under $PYENV_ROOT
#   HOOK_TESTS_DEV=1 tools/hook_tests.sh    the same under `python -X dev`
#   tools/hook_tests.sh -k threads      extra arguments go to pytest
#
# Builds go to build/hook-py3X/, per-version virtual environments (pytest only) to .venv-py3X/
# (`make test` adds torch to .venv-py312 for the capture tests; these runs do not import it);
# both are reused when up to date. Exits non-zero if any version fails to build or test.
set -uo pipefail
cd "$(dirname "$0")/.."

CFLAGS_HOOK="-shared -fPIC -O2 -g -Wall -Wextra -Wno-unused-parameter -Wno-missing-field-initializers"

# One interpreter per supported minor version: the newest pyenv install, else python3.X on PATH.
interpreters=()
for minor in 3.11 3.12 3.13; do
    found=$(tools/find_python.sh "$minor")
    if [ -n "$found" ]; then
        interpreters+=("$found")
    else
        echo "hook tests: no CPython $minor found, skipping it"
    fi
done
if [ ${#interpreters[@]} -eq 0 ]; then
    echo "hook tests: no CPython 3.11-3.13 with python3.X-config found" >&2
    exit 1
fi

pyflags=()
if [ "${HOOK_TESTS_DEV:-0}" != "0" ]; then
    pyflags=(-X dev)
fi

failed=()
for py in "${interpreters[@]}"; do
    minor=$("$py" -c 'import sys; print(f"{sys.version_info[0]}.{sys.version_info[1]}")')
    full=$("$py" -c 'import platform; print(platform.python_version())')
    tag="py${minor/./}"
    suffix=$("$py" -c 'import sysconfig; print(sysconfig.get_config_var("EXT_SUFFIX"))')
    so="build/hook-$tag/_C$suffix"

    if [ ! -f "$so" ] || [ csrc/eval_frame.c -nt "$so" ] || [ "$0" -nt "$so" ]; then
        mkdir -p "build/hook-$tag"
        # shellcheck disable=SC2046,SC2086
        if ! gcc $CFLAGS_HOOK $("$py-config" --includes) csrc/eval_frame.c -o "$so"; then
            echo "hook tests: build FAILED for CPython $full" >&2
            failed+=("$full (build)")
            continue
        fi
    fi

    venv=".venv-$tag"
    if ! "$venv/bin/python" -c 'import pytest' >/dev/null 2>&1; then
        echo "hook tests: creating $venv"
        "$py" -m venv "$venv" && "$venv/bin/python" -m pip install -q pytest || {
            failed+=("$full (venv)")
            continue
        }
    fi

    echo "== hook tests on CPython $full ${pyflags[*]}"
    # -c /dev/null and --confcutdir keep the project's pytest settings and any torch-importing
    # conftest.py above tests/hook out of these torch-free runs.
    if ! FRAMEJIT_C_PATH="$PWD/$so" "$venv/bin/python" "${pyflags[@]}" -m pytest -q \
        -c /dev/null --rootdir=tests/hook --confcutdir=tests/hook -p no:cacheprovider \
        tests/hook "$@"; then
        failed+=("$full")
    fi
done

if [ ${#failed[@]} -gt 0 ]; then
    echo "hook tests FAILED on: ${failed[*]}" >&2
    exit 1
fi
echo "hook tests passed on: $(for py in "${interpreters[@]}"; do "$py" -c 'import platform; print(platform.python_version(), end=" ")'; done)"
