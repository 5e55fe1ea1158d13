#!/usr/bin/env bash
# Peer fill between two weightcached processes in their own network namespaces (issue 30),
# against the same checkpoint read from disk: node A (10.78.0.1) loads the model from disk
# with its page cache dropped; node B (10.78.0.2), joined to A by a veth pair, fills the same
# model-rank from A over UCX (TCP) with mutual TLS on the peer API. One table row per run;
# the figures are the daemons' own (their "ready ... in X s" and "peer fill ... (Y GB/s)" log
# lines). B shares A's digest store (copied, with its key), so B never reads the checkpoint:
# each run checks B's entry came from peer_fill, then that B's bytes equal the checkpoint
# (weightcachectl verify, after the timing).
#
#   bench/peer_fill_netns.sh [--gib=4] [--runs=2] [--build=build] [--dir=/var/tmp/wc-pf-netns]
#                            [--rate=RATE] [--bin=DIR]
# --bin: a folder holding weightcached, weightcachectl and peer_fill_bench (the device carry's
# bin/) instead of the build tree's.
# --rate (e.g. 10gbit) shapes A's side of the link with tc tbf: a slower network than the
# veth's memory copy. Needs root (namespaces, veth, drop_caches) and iproute2 (else exit 77). The table and
# its command are kept in docs/benchmarks.md ("Peer fill").
set -euo pipefail
gib=4 runs=2 build=build dir=/var/tmp/wc-pf-netns rate='' bin=''
for arg in "$@"; do
  case $arg in
    --gib=*) gib=${arg#*=} ;;
    --runs=*) runs=${arg#*=} ;;
    --build=*) build=${arg#*=} ;;
    --dir=*) dir=${arg#*=} ;;
    --rate=*) rate=${arg#*=} ;;
    --bin=*) bin=${arg#*=} ;;
    *) echo "peer_fill_netns.sh: unknown argument $arg" >&2; exit 2 ;;
  esac
done
# Exit 77 (ctest's "skipped"): this machine cannot run it.
[[ $(id -u) == 0 ]] || { echo "peer_fill_netns.sh: needs root (network namespaces)" >&2; exit 77; }
command -v ip >/dev/null || { echo "peer_fill_netns.sh: needs ip (iproute2)" >&2; exit 77; }
daemon=$build/cmd/weightcached/weightcached
ctl=$build/cmd/weightcachectl/weightcachectl
bench=$build/bench/peer_fill_bench
[[ -z $bin ]] || { daemon=$bin/weightcached ctl=$bin/weightcachectl bench=$bin/peer_fill_bench; }
for b in "$daemon" "$ctl" "$bench"; do
  [[ -x $b ]] || { echo "peer_fill_netns.sh: $b is not built" >&2; exit 2; }
done

ns_a=wcpfb-$$-a ns_b=wcpfb-$$-b
pids=()
cleanup() {
  for p in "${pids[@]}"; do kill -9 "$p" 2>/dev/null || true; done
  ip netns del "$ns_a" 2>/dev/null || true
  ip netns del "$ns_b" 2>/dev/null || true
  rm -rf "$dir"
}
trap cleanup EXIT

rm -rf "$dir"
mkdir -p "$dir"
prepared=$("$bench" --prepare --backend=host --gib="$gib" --dir="$dir")
cert=$(awk '$1 == "cert" {print $2}' <<<"$prepared")
key=$(awk '$1 == "key" {print $2}' <<<"$prepared")
ca=$(awk '$1 == "ca" {print $2}' <<<"$prepared")
bytes=$(cat "$dir"/m/*.safetensors | wc -c)

if ! err=$(ip netns add "$ns_a" 2>&1); then
  # A container without CAP_SYS_ADMIN / CAP_NET_ADMIN: no namespaces to make.
  echo "peer_fill_netns.sh: cannot make network namespaces here: $err" >&2
  exit 77
fi
ip netns add "$ns_b"
ip link add eth0 netns "$ns_a" type veth peer name eth0 netns "$ns_b"
ip -n "$ns_a" addr add 10.78.0.1/24 dev eth0
ip -n "$ns_b" addr add 10.78.0.2/24 dev eth0
for ns in "$ns_a" "$ns_b"; do
  ip -n "$ns" link set eth0 up
  ip -n "$ns" link set lo up
done
# `link set up` returns before the veth pair has its carrier, and UCX lists only running
# interfaces when a daemon starts: one started too early had tcp/lo alone and could not reach
# its peer ("Destination is unreachable", one smoke run in four here).
for ns in "$ns_a" "$ns_b"; do
  for _ in $(seq 100); do
    [[ $(ip -n "$ns" -o link show eth0) == *LOWER_UP* ]] && break
    sleep 0.05
  done
  [[ $(ip -n "$ns" -o link show eth0) == *LOWER_UP* ]] ||
    { echo "peer_fill_netns.sh: eth0 in $ns has no carrier after 5 s" >&2; exit 1; }
done
if [[ -n $rate ]]; then
  ip netns exec "$ns_a" tc qdisc add dev eth0 root tbf rate "$rate" burst 4mb latency 50ms
fi

# start NAME NS ADDRESS [FLAGS...]: weightcached in NS, its peer API on ADDRESS:7443 (it
# preloads m). ready NAME: waits until NAME's log says m is ready and prints that line.
start() {
  local name=$1 ns=$2 addr=$3
  shift 3
  ip netns exec "$ns" env UCX_TLS=tcp "$daemon" --socket_dir="$dir/$name" --backend=host \
    --metrics_address=off --keeper_socket=off \
    --model=name=m,model_dir="$dir/m" --digest_store="$dir/$name-digests.json" \
    --peer_listen="$addr:7443" --peer_tls_cert_file="$cert" --peer_tls_key_file="$key" \
    --peer_tls_ca_file="$ca" --peer_identity=certificate "$@" >"$dir/$name.log" 2>&1 &
  pids+=($!)
}
ready() {
  local name=$1 i
  for ((i = 0; i < 6000; i++)); do
    if grep -q "model m ready" "$dir/$name.log"; then
      grep "model m ready" "$dir/$name.log"
      return 0
    fi
    sleep 0.1
  done
  echo "peer_fill_netns.sh: daemon $name did not get m ready in 600 s; its log:" >&2
  cat "$dir/$name.log" >&2
  return 1
}
stop_all() {
  for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
  for p in "${pids[@]}"; do wait "$p" 2>/dev/null || true; done
  pids=()
}
drop_cache() {
  sync
  if echo 3 >/proc/sys/vm/drop_caches 2>/dev/null; then echo cold; else echo "page cache not dropped"; fi
}
seconds_of() { sed -nE 's/.* in ([0-9.]+) s.*/\1/p' <<<"$1" | tail -1; }

# Identity first: the first start hashes the checkpoint's files into A's digest store (a read);
# B gets a copy of that store and its key, so neither hashes again.
start a "$ns_a" 10.78.0.1
ready a >/dev/null
stop_all
cp "$dir/a-digests.json" "$dir/b-digests.json"
cp "$dir/a-digests.json.key" "$dir/b-digests.json.key" 2>/dev/null || true

printf '| model | disk load (A) | GB/s | peer fill (B from A) | GB/s | pulls alone, GB/s | B equal to the checkpoint |\n'
printf '|---:|---:|---:|---:|---:|---:|---|\n'
for ((run = 0; run < runs; run++)); do
  cache=$(drop_cache)
  start a "$ns_a" 10.78.0.1
  line_a=$(ready a)
  start b "$ns_b" 10.78.0.2 --peers=10.78.0.1:7443 --peer_trust=single
  line_b=$(ready b)
  fill=$(grep "peer fill of m: .* GB/s" "$dir/b.log" | tail -1 || true)
  if [[ $line_b != *"from peer_fill)"* || -z $fill ]]; then
    echo "peer_fill_netns.sh: B did not fill from A: $line_b" >&2
    cat "$dir/b.log" >&2
    exit 1
  fi
  if "$ctl" --socket="$dir/b" verify m >"$dir/verify.log" 2>&1; then equal=yes; else equal=NO; fi
  ta=$(seconds_of "$line_a")
  tb=$(seconds_of "$line_b")
  logged=$(sed -nE 's/.*\(([0-9.]+) GB\/s\).*/\1/p' <<<"$fill")
  awk -v b="$bytes" -v ta="$ta" -v tb="$tb" -v c="$cache" -v l="$logged" -v e="$equal" \
    'BEGIN { printf "| %.2f GB | %.3f s (%s) | %.2f | %.3f s | %.2f | %s | %s |\n",
                    b / 1e9, ta, c, b / 1e9 / ta, tb, b / 1e9 / tb, l, e }'
  [[ $equal == yes ]] || { cat "$dir/verify.log" >&2; exit 1; }
  stop_all
done
