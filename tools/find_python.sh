#!/usr/bin/env bash
# Print the CPython X.Y interpreter framejit builds and tests with: the newest pyenv install
# under $PYENV_ROOT (default ~/.pyenv), else pythonX.Y on PATH. It must run and have its
# pythonX.Y-config (the headers the C hook is built with). Prints nothing and exits 1 if none.
#
#   tools/find_python.sh 3.12
set -uo pipefail
minor=${1:?usage: tools/find_python.sh 3.X}
PYENV_ROOT=${PYENV_ROOT:-${HOME:-/root}/.pyenv}

usable() {
    [ -x "$1" ] && [ -x "$1-config" ] && "$1" -c 'import sys' >/dev/null 2>&1
}

for dir in $(ls -d "$PYENV_ROOT"/versions/"$minor".* 2>/dev/null | sort -V -r); do
    if usable "$dir/bin/python$minor"; then
        echo "$dir/bin/python$minor"
        exit 0
    fi
done
# (A pyenv shim on PATH that has no such version selected fails to run, and is passed over.)
found=$(command -v "python$minor" 2>/dev/null) && usable "$found" && { echo "$found"; exit 0; }
exit 1
