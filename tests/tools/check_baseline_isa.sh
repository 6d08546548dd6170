#!/usr/bin/env bash
# Fails when an executable runs AVX, AVX-512 or AMX instructions outside the CPU kernels'
# dispatched units (functions in the avx2::, avx512::, amx:: namespaces and fast_math.h's
# per-ISA namespaces): such code would die with SIGILL on a CPU without that vector unit.
#   check_baseline_isa.sh BINARY [native]     ("native": an LTM_NATIVE build; exit 77 = skipped)
set -euo pipefail
bin=$1
if [ "${2:-}" = native ]; then
  echo "skipped: an LTM_NATIVE build runs -march=native code everywhere by design"
  exit 77
fi
bad=$(objdump -d --no-show-raw-insn -C "$bin" | awk '
  /^[0-9a-f]+ <.*>:$/ { fn = $0; next }
  /%ymm|%zmm|%k[0-7],|%tmm|tileloadd|ldtilecfg/ {
    if (fn !~ /::(avx2|avx512|amx)::|fm_avx/) print fn
  }' | sort -u)
n=$(printf '%s' "$bad" | grep -c . || true)
if [ "$n" -gt 0 ]; then
  echo "$bin: $n function(s) outside the dispatched kernels use AVX/AVX-512/AMX registers:"
  printf '%s\n' "$bad" | head -20
  exit 1
fi
echo "$bin: no AVX/AVX-512/AMX instruction outside the dispatched kernels"
