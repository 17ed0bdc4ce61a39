#!/usr/bin/env bash
# Runs HERE, on a machine that reaches the package registry, from anywhere in the repository.
#
# Downloads into gpu_wheels/ (ignored by git) the wheels that framejit needs and the GPU
# machine's image lacks. That machine has Python 3.12, torch, triton, networkx and pytest, and
# no registry access; what it misses:
#   bytecode     framejit's bytecode library (pure Python);
#   setuptools   >= 74, which reads the C extension from pyproject.toml ([tool.setuptools]
#                ext-modules); the image's version is not known, so a recent one travels along.
# A device `run` takes the folder with carry: ["gpu_wheels"]; tools/gpu_run.sh installs it
# offline. The folder is emptied first, so it holds one version of each (two stop pip).
#
#     bash tools/gpu_setup_wheels.sh          # PYTHON=... picks the interpreter whose pip is used

set -euo pipefail
cd "$(dirname "$0")/.."

if [ -n "${PYTHON:-}" ]; then
    py=$PYTHON
elif [ -x .venv/bin/python ]; then
    py=.venv/bin/python
else
    py=python3
fi

rm -rf gpu_wheels
mkdir gpu_wheels
# Pure-Python wheels only; --python-version makes pip choose for the GPU machine's 3.12.
for requirement in "bytecode>=0.15" "setuptools>=74"; do
    "$py" -m pip download --disable-pip-version-check --quiet --no-deps --only-binary=:all: \
        --python-version 3.12 --dest gpu_wheels "$requirement"
done
echo "gpu_wheels/ ($(du -sh gpu_wheels | cut -f1)):"
ls -1 gpu_wheels
