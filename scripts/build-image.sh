#!/usr/bin/env bash
# Builds the weightcache image from the Dockerfile, tagged with the version in VERSION.
#   scripts/build-image.sh                      compile in the image, CUDA on (Debian's
#                                               nvidia-cuda-toolkit 11.8, sm_90): long, ~GBs
#   scripts/build-image.sh --no-cuda            compile in the image, host backend only
#   scripts/build-image.sh --prebuilt build     no compile: the four binaries of build/ (built
#                                               on Debian bookworm, e.g. by scripts/build.sh),
#                                               debug info stripped
#   ... --tag registry.example.com/weightcache:0.1.0 --push      then push it
#   ... -- --build-arg CUDA_ARCHS="80;90"       anything after -- goes to `<engine> build`
# The engine: $IMAGE_ENGINE (split on spaces, e.g. "podman --root /tmp/x"), else docker, else
# podman. Prints the build time and the image size.
set -euo pipefail
cd "$(dirname "$0")/.."
version=$(<VERSION)
tag="weightcache/weightcache:$version"
prebuilt=""
cuda=ON
push=0
while (($#)); do
  case $1 in
    --prebuilt) prebuilt=${2:?--prebuilt needs a build directory}; shift 2 ;;
    --no-cuda) cuda=OFF; shift ;;
    --tag) tag=${2:?--tag needs a value}; shift 2 ;;
    --push) push=1; shift ;;
    --) shift; break ;;
    -h | --help) sed -n '2,13s/^# \{0,1\}//p' "$0"; exit 0 ;;
    *) echo "build-image: unknown argument $1 (see --help)" >&2; exit 2 ;;
  esac
done
if [[ -n ${IMAGE_ENGINE:-} ]]; then
  read -r -a engine <<<"$IMAGE_ENGINE"
elif command -v docker >/dev/null; then
  engine=(docker)
elif command -v podman >/dev/null; then
  engine=(podman)
else
  echo "build-image: no docker or podman (or set IMAGE_ENGINE)" >&2
  exit 1
fi

args=(--build-arg "VERSION=$version" -t "$tag")
ctx=.
if [[ -n $prebuilt ]]; then
  # A context of four files, not the repository (and not a build tree of gigabytes).
  ctx=$(mktemp -d)
  trap 'rm -rf "$ctx"' EXIT
  mkdir "$ctx/prebuilt"
  for b in weightcached weightcachectl weightcache-keeper weightcache-webhook; do
    f="$prebuilt/cmd/$b/$b"
    [[ -x $f ]] || { echo "build-image: $f is missing (build it first: scripts/build.sh)" >&2; exit 1; }
    cp "$f" "$ctx/prebuilt/"
    if command -v strip >/dev/null; then strip --strip-debug "$ctx/prebuilt/$b"; fi
  done
  args+=(-f "$PWD/Dockerfile" --target runtime-prebuilt)
else
  args+=(--build-arg "WITH_CUDA=$cuda")
fi

start=$SECONDS
"${engine[@]}" build "${args[@]}" "$@" "$ctx"
echo "build-image: built $tag in $((SECONDS - start)) s"
size=$("${engine[@]}" image inspect --format '{{.Size}}' "$tag")
echo "build-image: image size $((size / 1000000)) MB ($size bytes)"
if ((push)); then
  "${engine[@]}" push "$tag"
fi
