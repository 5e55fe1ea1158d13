#!/usr/bin/env bash
# On the GPU machine, in one call: issue 4's cold-load benchmark (bench/load_bench.cc): raw
# reads (O_DIRECT, page cache), our LoadRank on cuda-vmm for several LoadOptions, and
# safetensors.torch.load_file(device="cuda") (bench/torch_load_baseline.py), cold and hot,
# on 8 and 32 GiB random-BF16 Llama checkpoints written to the local disk and deleted after.
#
# Here:    WC_CARRY_DIR=$PWD/.device-carry-load WC_CARRY_TARGETS="load_bench" \
#            tests/gpu/prepare-carry.sh build-lb
# Device:  run(kind="nvidia-h200", carry=[".device-carry-load"],
#              command="bash tests/gpu/run-load-bench-on-device.sh")
# Environment: SIZES (8,32), CONFIGS (threads:staging_MiB:buffers:direct,...), DEADLINE (s),
# DISK (local: the machine's disk; ram: a memory-backed block device, see below).
set -u
root=$(cd "$(dirname "$0")/../.." && pwd)
carry=${WC_CARRY_DIR:-$root/.device-carry-load}
OUT=${OUT:-/tmp/wc-load-out}
mkdir -p "$OUT"
export LD_LIBRARY_PATH=$carry/lib
exec > >(tee "$OUT/load_bench.log") 2>&1
section() { printf '\n===== %s =====\n' "$*"; }

section machine
nvidia-smi --query-gpu=name,driver_version,memory.total,memory.used --format=csv
uname -r; nproc; free -g
df -h / /tmp /var/tmp 2>/dev/null
lsblk -o NAME,SIZE,ROTA,TYPE,MOUNTPOINT 2>/dev/null
for q in /sys/block/*/queue; do
  echo "$q: rotational=$(cat $q/rotational) max_sectors_kb=$(cat $q/max_sectors_kb) nr_requests=$(cat $q/nr_requests) read_ahead_kb=$(cat $q/read_ahead_kb 2>/dev/null)"
done
python3 -c 'import torch, safetensors; print("torch", torch.__version__, "safetensors", safetensors.__version__)'
if sync && echo 3 >/proc/sys/vm/drop_caches; then echo "drop_caches: works"; else echo "drop_caches: refused"; fi
if ldd "$carry/bin/load_bench" | grep -q "not found"; then
  echo "using the carried C++ runtime (lib-fallback)"
  export LD_LIBRARY_PATH=$carry/lib:$carry/lib-fallback
fi

# The checkpoint goes on the local disk, not a tmpfs. DISK=ram instead puts it on an ext4
# file system on a loop device whose backing file lives in a tmpfs: a block device as fast
# as memory (an upper bound for a fast NVMe array), whose ext4 page cache drop_caches still
# empties (tmpfs pages are not dropped), so "cold" there means "not in the page cache".
cleanup() { :; }
if [[ ${DISK:-local} == ram ]]; then
  gib=$(( $(tr ',' '\n' <<<"${SIZES:-8,32}" | sort -n | tail -1 | cut -d. -f1) * 12 / 10 + 4 ))
  mkdir -p /mnt/wc-ram-backing /mnt/wc-ram-disk
  mount -t tmpfs -o size=${gib}G tmpfs /mnt/wc-ram-backing &&
    truncate -s ${gib}G /mnt/wc-ram-backing/disk.img &&
    loop=$(losetup --find --show /mnt/wc-ram-backing/disk.img) &&
    mkfs.ext4 -q -F "$loop" && mount "$loop" /mnt/wc-ram-disk || { echo "DISK=ram: setup failed"; exit 1; }
  echo "DISK=ram: ext4 on $loop, backed by a ${gib} GiB tmpfs file"
  cat /sys/block/$(basename "$loop")/queue/read_ahead_kb | xargs echo "  read_ahead_kb"
  cleanup() { umount /mnt/wc-ram-disk; losetup -d "$loop"; umount /mnt/wc-ram-backing; }
  dir=/mnt/wc-ram-disk/wc-load-bench
else
  dir=/var/tmp/wc-load-bench
  [[ $(stat -f -c %T /var/tmp 2>/dev/null) == tmpfs ]] && dir=/root/wc-load-bench
fi
mkdir -p "$dir"
echo "checkpoint dir: $dir ($(stat -f -c %T "$dir"))"

section "load_bench"
timeout "${TIMEOUT:-280}" "$carry/bin/load_bench" --dir="$dir" --sizes_gib="${SIZES:-8,32}" \
  --configs="${CONFIGS:-8:256:4:off,8:256:4:on,16:1024:8:off,16:1024:8:on,32:1024:8:on,16:1024:8:auto}" \
  --torch_script="$root/bench/torch_load_baseline.py" --deadline_s="${DEADLINE:-250}"
rc=$?
rm -rf "$dir"
df -h "$(dirname "$dir")"
cleanup
section "result: exit $rc"
exit $rc
