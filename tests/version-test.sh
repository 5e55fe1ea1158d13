#!/usr/bin/env bash
# Versions in step: VERSION (the one place; CMake's project version, hence the binaries'
# --version and wc_version()) against every copy that cannot read it: Chart.yaml's appVersion,
# the chart's default image tag (empty = appVersion), the rendered deploy/ manifest's image,
# the Dockerfile's default image label, the Python package. With binaries as arguments, also
# `<binary> --version` == "<name> <VERSION>".
# Usage: version-test.sh <source dir> [binary...]
set -euo pipefail
src=$1
shift
want=$(<"$src/VERSION")
fails=0
check() {  # check WHAT GOT
  if [[ $2 == "$want" ]]; then
    echo "ok: $1 = $2"
  else
    echo "FAIL: $1 is '$2', VERSION is '$want'"
    fails=$((fails + 1))
  fi
}
[[ $want =~ ^[0-9]+\.[0-9]+\.[0-9]+$ ]] || { echo "FAIL: VERSION '$want' is not x.y.z"; exit 1; }
check "helm/weightcache/Chart.yaml appVersion" \
  "$(sed -n 's/^appVersion: *"\{0,1\}\([^"]*\)"\{0,1\} *$/\1/p' "$src/helm/weightcache/Chart.yaml")"
tag=$(awk '/^image:/ {in_image = 1; next} /^[^ #]/ {in_image = 0}
           in_image && $1 == "tag:" {gsub(/"/, "", $2); print $2}' "$src/helm/weightcache/values.yaml")
[[ -z $tag ]] && tag=$want  # "" means the chart's appVersion
check "helm/weightcache/values.yaml image.tag (empty: appVersion)" "$tag"
check "deploy/weightcache.yaml image tag (scripts/render-deploy.sh)" \
  "$(sed -n 's|^ *image: "weightcache/weightcache:\(.*\)"$|\1|p' "$src/deploy/weightcache.yaml" | sort -u)"
check "Dockerfile ARG VERSION default (the image label)" \
  "$(sed -n 's/^ARG VERSION=//p' "$src/Dockerfile")"
check "python/pyproject.toml version" \
  "$(sed -n 's/^version = "\(.*\)"$/\1/p' "$src/python/pyproject.toml")"
check "python/weightcache/__init__.py __version__" \
  "$(sed -n 's/^__version__ = "\(.*\)"$/\1/p' "$src/python/weightcache/__init__.py")"
for bin in "$@"; do
  name=$(basename "$bin")
  out=$("$bin" --version) || { echo "FAIL: $bin --version exited $?"; fails=$((fails + 1)); continue; }
  check "$name --version" "${out#"$name "}"
  [[ $out == "$name "* ]] || { echo "FAIL: $name --version printed '$out'"; fails=$((fails + 1)); }
done
((fails == 0)) || { echo "version-test: $fails mismatch(es): change them all with VERSION"; exit 1; }
echo "version-test: all in step with VERSION ($want)"
