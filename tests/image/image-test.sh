#!/usr/bin/env bash
# CI's image job (scripts/test.sh): builds the image from the Dockerfile with the build job's
# binaries and runs it, with no registry: the base is a Debian bookworm rootfs made by
# mmdebstrap from the Debian mirror, imported under the Dockerfile's default name.
#   1. rootfs: mmdebstrap --variant=minbase, cached as $WC_IMAGE_CACHE/bookworm-minbase.tar
#      (default build/image-cache; remade when older than a week)
#   2. podman (as root) with all its storage in a temp dir, removed after: import the rootfs as
#      docker.io/library/debian:bookworm-slim, scripts/build-image.sh --prebuilt BUILD_DIR
#      (target runtime-prebuilt, --pull=never); the label matches VERSION
#   3. in containers from the image: `weightcached --help`, and --version and the user
#      (VERSION, uid 65532); the demo's flow on the host
#      backend with a keeper (demo-in-container.sh); the webhook answering one
#      AdmissionReview over TLS (certificates made here with openssl, curl trusts the CA only)
# Prints each step's time and the image's size.
# Podman options, for a root CI machine without systemd, user namespaces or CAP_SYS_RESOURCE,
# on hybrid cgroups: runc (crun rejects hybrid cgroup v1/v2 mounts), cgroupfs, file events,
# host network (no bridge/iptables setup), and rlimits no higher than this shell's (podman
# asks for more than a process without CAP_SYS_RESOURCE may set).
# Usage: image-test.sh [BUILD_DIR]   (default build)
set -euo pipefail
cd "$(dirname "$0")/../.."
build=${1:-build}
cache=${WC_IMAGE_CACHE:-$build/image-cache}
mirror=${DEBIAN_MIRROR:-http://deb.debian.org/debian}
version=$(<VERSION)
tag="weightcache/weightcache:$version-ci"

for b in weightcached weightcachectl weightcache-keeper weightcache-webhook; do
  [[ -x $build/cmd/$b/$b ]] || { echo "image-test: $build/cmd/$b/$b is missing (run the build job)" >&2; exit 1; }
done
for tool in podman runc mmdebstrap openssl curl python3; do
  command -v "$tool" >/dev/null || { echo "image-test: $tool not installed (scripts/install-deps.sh --test)" >&2; exit 1; }
done

tmp=$(mktemp -d)
# WC_IMAGE_STORAGE_DRIVER=vfs where the temp dir cannot hold overlay mounts (e.g. on overlayfs).
podman=(podman --root "$tmp/storage" --runroot "$tmp/run"
        --storage-driver "${WC_IMAGE_STORAGE_DRIVER:-overlay}"
        --cgroup-manager cgroupfs --events-backend file --runtime runc)
nofile=$(ulimit -Sn)
nproc=$(ulimit -Su)
[[ $nproc == unlimited || $nproc -gt 4096 ]] && nproc=4096
# nproc below the current limit: runc refused setting it even to the same value here.
run_opts=(--pull=never --network=host --ulimit "nofile=$nofile:$nofile"
          --ulimit "nproc=$((nproc - 1)):$((nproc - 1))")
webhook=""
cleanup() {
  [[ -n $webhook ]] && "${podman[@]}" rm -f "$webhook" >/dev/null 2>&1
  # Not `podman system reset`: that also deletes networks, which live outside --root.
  "${podman[@]}" rm -af >/dev/null 2>&1 || true
  "${podman[@]}" rmi -af >/dev/null 2>&1 || true
  findmnt -rn -o TARGET | grep "^$tmp/" | sort -r | xargs -r umount 2>/dev/null || true
  rm -rf "$tmp"
}
trap cleanup EXIT
times=()
step() {  # step NAME: times the rest of the step since the last call
  local now=$SECONDS
  [[ -n ${step_name:-} ]] && times+=("$(printf '%-28s %4d s' "$step_name" $((now - step_start)))")
  step_name=$1
  step_start=$now
  [[ $1 == end ]] || echo "--- image: $1"
}

step rootfs
mkdir -p "$cache"
rootfs="$cache/bookworm-minbase.tar"
if [[ -f $rootfs && -n $(find "$rootfs" -mtime -7) ]]; then
  echo "cached: $rootfs"
else
  mmdebstrap --variant=minbase --format=tar --quiet bookworm "$rootfs.tmp" "$mirror"
  mv "$rootfs.tmp" "$rootfs"
fi
echo "rootfs: $(($(stat -c %s "$rootfs") / 1000000)) MB"

step import
"${podman[@]}" import --quiet "$rootfs" docker.io/library/debian:bookworm-slim >/dev/null

step "build (prebuilt)"
IMAGE_ENGINE="${podman[*]}" bash scripts/build-image.sh --prebuilt "$build" --tag "$tag" -- \
  "${run_opts[@]}" --quiet
label=$("${podman[@]}" image inspect --format \
  '{{index .Labels "org.opencontainers.image.version"}}' "$tag")
[[ $label == "$version" ]] || { echo "FAIL: image label version '$label', VERSION '$version'"; exit 1; }
echo "label org.opencontainers.image.version=$label"

step "weightcached --help"
"${podman[@]}" run --rm "${run_opts[@]}" "$tag" --help >"$tmp/help" ||
  { cat "$tmp/help"; echo "FAIL: weightcached --help"; exit 1; }
grep -q -- '--socket_dir' "$tmp/help" || { cat "$tmp/help"; echo "FAIL: --help lists no flags"; exit 1; }
head -1 "$tmp/help"
got=$("${podman[@]}" run --rm "${run_opts[@]}" "$tag" --version)
[[ $got == "weightcached $version" ]] ||
  { echo "FAIL: weightcached --version printed '$got', VERSION is '$version'"; exit 1; }
echo "$got"
[[ $("${podman[@]}" run --rm "${run_opts[@]}" --entrypoint id "$tag" -u) == 65532 ]] ||
  { echo "FAIL: the image does not run as uid 65532 by default"; exit 1; }

step "demo (daemon+keeper+verify)"
"${podman[@]}" run --rm "${run_opts[@]}" -v "$PWD/tests/image:/checks:ro" --entrypoint bash \
  "$tag" /checks/demo-in-container.sh

step "webhook AdmissionReview"
mkdir "$tmp/tls"
(
  cd "$tmp/tls"
  openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes -keyout ca.key \
    -out ca.crt -days 1 -subj /CN=test-ca 2>/dev/null
  openssl req -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes -keyout tls.key -out tls.csr \
    -subj /CN=localhost 2>/dev/null
  printf 'subjectAltName=DNS:localhost,IP:127.0.0.1\n' >ext
  openssl x509 -req -in tls.csr -CA ca.crt -CAkey ca.key -set_serial 1 -days 1 -extfile ext \
    -out tls.crt 2>/dev/null
  chmod 0644 tls.key  # read by the image's uid 65532; a throwaway key
)
webhook=$("${podman[@]}" run -d "${run_opts[@]}" -v "$tmp/tls:/tls:ro" \
  --entrypoint weightcache-webhook "$tag" --address=127.0.0.1:0 \
  --tls_cert_file=/tls/tls.crt --tls_key_file=/tls/tls.key)
port=""
for _ in $(seq 100); do
  port=$("${podman[@]}" logs "$webhook" 2>/dev/null |
    sed -n 's/^weightcache-webhook: listening on port \([0-9]*\)$/\1/p')
  [[ -n $port ]] && break
  sleep 0.1
done
[[ -n $port ]] || { "${podman[@]}" logs "$webhook"; echo "FAIL: the webhook printed no port"; exit 1; }
cat >"$tmp/review.json" <<'JSON'
{"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview",
 "request": {"uid": "image-1", "operation": "CREATE",
             "kind": {"group": "", "version": "v1", "kind": "Pod"},
             "object": {"apiVersion": "v1", "kind": "Pod",
                        "metadata": {"name": "engine",
                                     "annotations": {"weightcache.io/model": "demo"}},
                        "spec": {"containers": [{"name": "engine", "image": "vllm"}]}}}}
JSON
curl -sS --fail --cacert "$tmp/tls/ca.crt" --max-time 10 -H 'Content-Type: application/json' \
  --data-binary "@$tmp/review.json" "https://localhost:$port/mutate" >"$tmp/response.json" ||
  { "${podman[@]}" logs "$webhook"; echo "FAIL: POST /mutate"; exit 1; }
python3 - "$tmp/response.json" <<'PY' || { cat "$tmp/response.json"; echo; exit 1; }
import base64, json, sys
r = json.load(open(sys.argv[1]))["response"]
assert r["uid"] == "image-1" and r["allowed"] is True and r["patchType"] == "JSONPatch", r
patch = json.dumps(json.loads(base64.b64decode(r["patch"])))
assert "weightcache.io/client" in patch and "WEIGHTCACHE_MODEL" in patch, patch
print("webhook: AdmissionReview answered over TLS, patch adds the resource and the env")
PY
"${podman[@]}" rm -f "$webhook" >/dev/null
webhook=""

step end
size=$("${podman[@]}" image inspect --format '{{.Size}}' "$tag")
echo "image $tag: $((size / 1000000)) MB"
echo "image job steps:"
printf '  %s\n' "${times[@]}"
