#!/usr/bin/env bash
# The prepared GPU check (issue 18): tests at world size 1 on CUDA, codec throughput against
# copy_, one epoch's compute of partitions of the generated graph and Tolokers. Writes
# <out>/gpu_check.json (dry run: gpu_check_dry_run.json). Budget: 450 s of work by default.
#
#   tools/gpu_check.sh --tolokers DATASETS_ROOT --out DIR     # on a CUDA machine
#   tools/gpu_check.sh --dry-run --out DIR                    # anywhere (CI): tiny sizes, CPU
#   tools/gpu_check.sh --fetch-wheels                         # here, with a package registry
#
# The GPU machine reaches no package registry; its image has torch (CUDA), Lightning, PyG,
# torchmetrics, numba, pytest but not pymetis. --fetch-wheels downloads what is missing into
# .whl/ (git-ignore it: echo /.whl/ >> .git/info/exclude); carry .whl with the repository and
# this script installs it into /tmp/halo-site first. Everything else runs from this checkout.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
[ -x .venv/bin/python ] && [ -z "${PYTHON:-}" ] && PY=.venv/bin/python

if [ "${1:-}" = "--fetch-wheels" ]; then
  # cp312 wheels for the GPU image (Python 3.12, x86-64); pin what this checkout was tested with.
  ver=$($PY -c "import importlib.metadata as m; print(m.version('pymetis'))")
  $PY -m pip download --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
    --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
    -d .whl "pymetis==$ver"
  ls -l .whl
  exit 0
fi

if compgen -G ".whl/*.whl" >/dev/null; then
  $PY -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/halo-site .whl/*.whl
  export PYTHONPATH="/tmp/halo-site${PYTHONPATH:+:$PYTHONPATH}"
fi
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
$PY -c "import pymetis" 2>/dev/null || echo "[gpu-check] WARNING: pymetis is not importable: the epoch section cannot partition (run tools/gpu_check.sh --fetch-wheels where a registry is reachable, carry .whl)" >&2
exec $PY -m benchmarks.gpu_check "$@"
