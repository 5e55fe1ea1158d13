#!/usr/bin/env bash
# Writes tests/upgrade/a710f38/: the keeper records and digest store that the previous release
# (a710f38) leaves on a node, made by that release's own weightcached and weightcache-keeper
# (host backend), for upgrade_test.cc to adopt with this tree's daemon.
#   bash tests/upgrade/make-fixtures.sh OLD_BUILD TOOL
# OLD_BUILD: a build dir of a710f38 (git worktree add /tmp/base a710f38; in it
#   cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo &&
#   ninja -C build weightcached weightcache-keeper).
# TOOL: this tree's wc_upgrade_fixture (build/tests/upgrade/wc_upgrade_fixture): it writes the
#   checkpoint and reads the records back out of the old keeper (the keeper's wire protocol is
#   the same in both releases).
# What it keeps: records/0.key and 0.record (the old keeper's record of TinyLlama, loaded once by
# the old daemon; no checkpoint and no segment bytes: the test makes both), state/digests.json and
# state/digests.json.key (the old daemon's digest store and its HMAC key: a fixture's key,
# nobody's secret), and COMMIT (the release that wrote them).
set -euo pipefail
old_build=$(realpath "$1")
tool=$(realpath "$2")
commit=a710f38
out="$(cd "$(dirname "$0")" && pwd)/$commit"
work=$(mktemp -d /tmp/wc-fixture.XXXXXX)
pids=()
cleanup() {
  for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
  wait 2>/dev/null || true
  rm -rf "$work"
}
trap cleanup EXIT

"$old_build/cmd/weightcached/weightcached" --version | grep -q . # it runs
rm -rf "$out"
mkdir -p "$out/records" "$out/state" "$work/m"
"$tool" checkpoint "$work/m"

"$old_build/cmd/weightcache-keeper/weightcache-keeper" --socket="$work/k/keeper.sock" \
  >"$work/keeper.log" 2>&1 &
pids+=($!)
"$old_build/cmd/weightcached/weightcached" --socket_dir="$work/s" --backend=host \
  --metrics_address=off --keeper_socket="$work/k/keeper.sock" \
  --digest_store="$work/state/digests.json" --model="name=m,model_dir=$work/m" \
  >"$work/daemon.log" 2>&1 &
daemon=$!
pids+=("$daemon")
# Ready and deposited (deposits follow readiness).
"$tool" wait "$work/k/keeper.sock" 1 || { cat "$work/daemon.log"; exit 1; }
kill -KILL "$daemon"  # as an upgrade's rollout ends it: the keeper keeps the entry
wait "$daemon" 2>/dev/null || true
"$tool" dump "$work/k/keeper.sock" "$out/records"

# Only what the old binaries alone can write is kept: the test writes the checkpoint with the
# same writer and rebuilds each segment from the record's manifest (its digests vouch for it).
rm -f "$out"/records/*.seg*
cp "$work/state/digests.json" "$work/state/digests.json.key" "$out/state/"
git -C "$old_build/.." rev-parse HEAD >"$out/COMMIT"
grep -q "^$(git rev-parse --short=7 "$commit" 2>/dev/null || echo "$commit")" "$out/COMMIT" ||
  echo "warning: $old_build is not a build of $commit" >&2
echo "wrote $out"
