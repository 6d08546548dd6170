#!/usr/bin/env bash
# cmake/find_nccl.cmake against NCCL laid out as NVIDIA's Python wheel ships it (lib/libnccl.so.2,
# no libnccl.so; include/nccl.h; in site-packages/nvidia/nccl), with this machine's real NCCL
# hidden (CMAKE_IGNORE_PATH): found through -DNCCL_ROOT, found through a Python that can import
# nvidia.nccl, and, with none, one configure error that names -DNCCL_ROOT and -DLTM_CUDA=OFF.
#   check_find_nccl.sh SOURCE_DIR [real NCCL include dir] [real NCCL library]
set -euo pipefail
src=$1
# The real NCCL's folders, under every name they go by: the folders of the arguments and of every
# nccl.h / libnccl.so* under the usual roots, and each alias of one of those folders among the CUDA
# toolkits' include/lib/lib64/targets folders (/usr/local/cuda/lib64 -> lib, /usr/local/cuda ->
# cuda-13.0, ...). CMAKE_IGNORE_PATH matches folder names exactly, so every alias must be listed.
dirs=()
for d in "${2:-}" "$(dirname "${3:-/nonexistent/x}")"; do
  [ -n "$d" ] && [ -d "$d" ] && dirs+=("$d")
done
while IFS= read -r f; do
  dirs+=("$(dirname "$f")")
done < <(find /usr/local /usr/include /usr/lib /usr/lib64 /opt -maxdepth 6            \( -name nccl.h -o -name 'libnccl.so*' \) 2>/dev/null || true)
aliases=()
for c in /usr/local/cuda* /usr/local/cuda*/targets/*-linux /usr /usr/local /opt/*; do
  for s in include lib lib64 lib/x86_64-linux-gnu; do
    [ -d "$c/$s" ] && aliases+=("$c/$s")
  done
done
hide=""
for d in "${dirs[@]}"; do
  r=$(realpath "$d")
  hide="$hide;$d;$r"
  for a in "${aliases[@]}"; do
    [ "$(realpath "$a")" = "$r" ] && hide="$hide;$a"
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
