#!/usr/bin/env bash
# cmake/find_nccl.cmake against NCCL laid out as NVIDIA's Python wheel ships it (lib/libnccl.so.2,
# no libnccl.so; include/nccl.h; in site-packages/nvidia/nccl), with this machine's real NCCL
# hidden (CMAKE_IGNORE_PATH): found through -DNCCL_ROOT, found through a Python that can import
# nvidia.nccl, and, with none, one configure error that names -DNCCL_ROOT and -DLTM_CUDA=OFF.
#   check_find_nccl.sh SOURCE_DIR [real NCCL include dir] [real NCCL library]
set -euo pipefail
src=$1
# The real NCCL's folders, under every name they go by (/usr/local/cuda/lib64 -> lib, ...).
hide=""
for d in "${2:-}" "$(dirname "${3:-/nonexistent/x}")"; do
  [ -n "$d" ] && [ -d "$d" ] || continue
  for p in "$(dirname "$d")" "$(dirname "$(realpath "$d")")"; do
    hide="$hide;$p/include;$p/lib;$p/lib64;$p/targets/x86_64-linux/include"
    hide="$hide;$p/targets/x86_64-linux/lib;$d;$(realpath "$d")"
  done
done
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
wheel=$tmp/site-packages/nvidia/nccl
mkdir -p "$wheel/include" "$wheel/lib"
echo '/* stand-in */' > "$wheel/include/nccl.h"
: > "$wheel/lib/libnccl.so.2"
: > "$wheel/__init__.py"
probe() {  # probe NAME [cmake args]: configures the probe project, output in $tmp/NAME.log
  local name=$1
  shift
  env -u NCCL_ROOT -u NCCL_HOME -u VIRTUAL_ENV -u CONDA_PREFIX HOME="$tmp/home" \
    cmake -S "$src/tests/tools/find_nccl" -B "$tmp/$name" "-DCMAKE_IGNORE_PATH=$hide" \
    -DLTM_SYSTEM_PYTHON=/nonexistent "$@" > "$tmp/$name.log" 2>&1
}
fail() { echo "FAIL: $*"; cat "$tmp"/*.log; exit 1; }

probe root "-DNCCL_ROOT=$wheel" || fail "configure with -DNCCL_ROOT failed"
grep -q "NCCL: $wheel/lib/libnccl.so.2 (header in $wheel/include)" "$tmp/root.log" ||
  fail "-DNCCL_ROOT: the wheel's libnccl.so.2 not found"
echo "ok: -DNCCL_ROOT=<wheel>/nvidia/nccl finds lib/libnccl.so.2 and include/nccl.h"

if command -v python3 > /dev/null; then
  PYTHONPATH=$tmp/site-packages probe python || fail "configure with the wheel on PYTHONPATH failed"
  grep -q "NCCL: $wheel/lib/libnccl.so.2" "$tmp/python.log" ||
    fail "the wheel importable as nvidia.nccl was not found"
  echo "ok: a python3 that imports nvidia.nccl leads to the wheel"
fi

# Only the (absent) roots, no default folder: whatever else this machine has (a second NCCL in a
# Python wheel, say) cannot be found.
if probe none -DLTM_NCCL_ROOTS_ONLY=ON; then
  fail "configure succeeded with no NCCL anywhere"
fi
n=$(grep -c "but NCCL was not found" "$tmp/none.log" || true)
[ "$n" = 1 ] || fail "expected one 'NCCL was not found' message, got $n"
grep -q -- "-DNCCL_ROOT=" "$tmp/none.log" && grep -q -- "-DLTM_CUDA=OFF" "$tmp/none.log" ||
  fail "the message does not say what to do"
echo "ok: no NCCL: one configure error naming -DNCCL_ROOT and -DLTM_CUDA=OFF"
rm -f "$tmp"/*.log
