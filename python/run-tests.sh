#!/usr/bin/env bash
# The pytest suite of the `weightcache` package, run the one supported way users install it
# (scripts/install-python.sh: a venv over /usr/bin/python3 with --system-site-packages, the
# package pip-installed offline with libweightcache.so inside), against BUILD_DIR's binaries.
#   bash python/run-tests.sh [BUILD_DIR] [pytest args...]      (ctest runs it as python_pytest)
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
build=$(cd "${1:-$root/build}" && pwd)
shift || true
# Debian's torch, numpy, pytest and grpcio live in /usr/bin/python3's site-packages (another
# python3, e.g. pyenv's, may come first on PATH: it is never used here).
if ! /usr/bin/python3 -c 'import torch, numpy, pytest, grpc, setuptools, wheel' 2>/dev/null; then
  echo "python tests: /usr/bin/python3 lacks torch/numpy/pytest/grpc/setuptools/wheel;" \
       "run: sudo bash scripts/install-deps.sh --test" >&2
  exit 1
fi
venv=$build/python-venv
bash "$root/scripts/install-python.sh" "$venv" "$build"
cd "$root"
export WEIGHTCACHE_BUILD_DIR=$build PYTHONDONTWRITEBYTECODE=1
unset WEIGHTCACHE_SOCKET WEIGHTCACHE_MODEL WEIGHTCACHE_FINGERPRINT WEIGHTCACHE_MODE WEIGHTCACHE_LIB
exec "$venv/bin/python" -m pytest -p no:cacheprovider -q "$@" python/tests
