#!/usr/bin/env bash
# Fails unless an executable imports NCCL's communicator set-up and all-reduce from libnccl
# (dynamic symbol table, undefined entries): the NCCL device communicator is linked into the
# rank, not left out by the linker.
#   check_nccl_imports.sh BINARY SOURCE_DIR
# Reported skipped (exit 77) while the rank set-up (launcher/model_setup.cpp) does not construct
# the NCCL communicator yet; from then on the imports must be there.
# ncclCommInitRankConfig is the non-blocking form of ncclCommInitRank that NcclCommunicator
# uses (it polls initialisation under the watchdog); either counts.
set -euo pipefail
bin=$1
if ! grep -q 'NcclCommunicator>' "$2/launcher/model_setup.cpp"; then
  echo "skipped: launcher/model_setup.cpp does not construct the NCCL communicator yet"
  exit 77
fi
imports=$(nm -D --undefined-only "$bin" | awk '{print $NF}' | sed 's/@.*//')
missing=0
for sym in 'ncclCommInitRank(Config)?' ncclAllReduce; do
  if printf '%s\n' "$imports" | grep -Eqx "$sym"; then
    echo "ok: $bin imports $(printf '%s\n' "$imports" | grep -Ex "$sym" | head -1)"
  else
    echo "FAIL: $bin does not import $sym"
    missing=1
  fi
done
lib=$(ldd "$bin" | awk '/libnccl/ {print $1, $3}')
[ -n "$lib" ] || { echo "FAIL: $bin does not load libnccl"; missing=1; }
[ -z "$lib" ] || echo "ok: $bin loads $lib"
exit $missing
