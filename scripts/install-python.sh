#!/usr/bin/env bash
# Installs the `weightcache` Python package into a venv, offline, the one supported way:
#   bash scripts/install-python.sh VENV [BUILD_DIR]
# VENV is created (if absent) by /usr/bin/python3 with --system-site-packages, so Debian's
# torch, numpy and setuptools are visible (Debian marks its Python externally managed: no
# pip into it). The package is pip-installed from a staged copy of python/ that holds
# libweightcache.so and weightcached (for spawn mode) from BUILD_DIR (default: build), so
# nothing is downloaded (--no-index, --no-build-isolation) and the source tree stays clean.
# Use it as VENV/bin/python; `python -m weightcache status` checks the install.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
venv=${1:?usage: install-python.sh VENV [BUILD_DIR]}
build=${2:-$root/build}
lib=$build/pkg/client/capi/libweightcache.so
daemon=$build/cmd/weightcached/weightcached
[[ -f $lib ]] || { echo "install-python: $lib not built (ninja -C $build weightcache)" >&2; exit 1; }
[[ -x $venv/bin/python ]] || /usr/bin/python3 -m venv --system-site-packages "$venv"
stage=$(mktemp -d /tmp/weightcache-pkg.XXXXXX)
trap 'rm -rf "$stage"' EXIT
cp -r "$root/python/." "$stage/"
rm -rf "$stage/tests" "$stage/build" "$stage"/*.egg-info
strip --strip-debug -o "$stage/weightcache/libweightcache.so" "$lib"
if [[ -x $daemon ]]; then
  mkdir -p "$stage/weightcache/bin"
  strip --strip-debug -o "$stage/weightcache/bin/weightcached" "$daemon"
fi
"$venv/bin/python" -m pip install --quiet --no-index --no-build-isolation --no-deps \
  --disable-pip-version-check "$stage"
"$venv/bin/python" -c 'import weightcache; print("weightcache", weightcache.__version__,
  "(libweightcache", weightcache.library_version() + ")", "in", weightcache.__file__)'
