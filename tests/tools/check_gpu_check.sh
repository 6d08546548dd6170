#!/usr/bin/env bash
# scripts/gpu_check against stub programs (no GPU needed): a stub set that passes every step
# must pass (exit 0, a PASS line per step, report.json "passed": true); the same set with every
# program failing (each still printing a passing result) and one missing must fail with a FAIL
# line per step, the missing one "not built"; and a machine without a GPU (nvidia-smi failing)
# must fail at once.
#   check_gpu_check.sh SOURCE_DIR PYTHON
# shellcheck source=tests/tools/check_lib.sh
source "$(dirname "$0")/check_lib.sh"

# stubs DIR MODE (pass | fail | nogpu): a PATH folder and a build folder of stub programs.
stubs() {
  local d=$1 mode=$2
  mkdir -p "$d/bin" "$d/build/tests" "$d/build/launcher"
  if [ "$mode" = nogpu ]; then
    printf '#!/bin/sh\necho "NVIDIA-SMI has failed: no devices were found"; exit 9\n' \
      > "$d/bin/nvidia-smi"
  else
    printf '#!/bin/sh\necho "GPU 0: Stub H100 (UUID: GPU-0)"\n' > "$d/bin/nvidia-smi"
  fi
  printf '#!/bin/sh\necho "stub cmake $*"\n' > "$d/bin/cmake"
  local rc=0
  [ "$mode" = pass ] || rc=1
  # gpu tests that run the tests of theirs that match --gtest_filter (a shell glob here); as
  # gtest does, a filter that matches none of them passes.
  gtest_stub() {  # gtest_stub NAME TEST...
    local f=$d/build/tests/$1
    shift
    printf '#!/bin/bash\nf=${1#--gtest_filter=}; n=0\n' > "$f"
    printf 'for t in %s; do [[ $t == $f ]] && n=$((n + 1)); done\n' "$*" >> "$f"
    printf 'echo "[  PASSED  ] $n tests."\n[ $n -eq 0 ] && exit 0\nexit %s\n' "$rc" >> "$f"
  }
  gtest_stub kernels_gpu_test Cuda.Gemm Cuda.LayerNorm
  gtest_stub cuda_graphs_gpu_test Graphs.GraphReplayEqualsEager Sampling.DeviceSamplingEqualsHost
  [ "$mode" = fail ] || gtest_stub nccl_gpu_test Nccl.NcclAllReduceInGraph Nccl.NcclInitTimeout
  local limits='{"device": "stub", "copy_gb_s": 1000.0, "gemm_bf16_tflop_s": 100.0}'
  printf '#!/bin/sh\necho '"'"'%s'"'"'\nexit %s\n' "$limits" "$rc" > "$d/build/tests/ltm-gpu-limits"
  # ltm-bench: 0.9 of the decode limit at batch 1, 0.7 of the prefill one (6.7B shape, bf16 or
  # int8 weights).
  cat > "$d/build/launcher/ltm-bench" <<PY
#!$py
import json, sys
a = sys.argv
batch, prompt, new = (int(a[a.index(k) + 1])
                      for k in ("--batch", "--prompt-tokens", "--new-tokens"))
L, d, vocab = 32, 4096, 50257
wb = 13.3e9 * (1.0625 / 2 if a[a.index("--weight-dtype") + 1] == "int8" else 1)
c = dict(n_layer=L, n_embd=d, vocab_size=vocab, batch=batch, prompt_tokens=prompt,
         new_tokens=new, weight_bytes=wb, kv_dtype="bf16")
decode_limit = batch * 1000e9 / (wb + batch * (prompt + new / 2) * 2 * L * d * 2)
lp = 12.0 * d * d + 13.0 * d
prefill_limit = 100e12 / (2 * lp * L * prompt + 4.0 * L * d * prompt * (prompt + 1) / 2
                          + 2.0 * vocab * d) * prompt
print(json.dumps(dict(c, measurement="prefill", tokens_per_s=0.7 * prefill_limit)))
print(json.dumps(dict(c, measurement="decode", tokens_per_s=0.9 * decode_limit)))
sys.exit($rc)
PY
  # ltm-worker: the same 32 tokens and logits (top-2 margin 10 of 20) on both devices; with
  # --speculative draft the same tokens, drafts accepted, and the draft's device in the log.
  cat > "$d/build/launcher/ltm-worker" <<PY
#!$py
import json, struct, sys
a = sys.argv
rows, vocab = 32, 512
if "--dump-logits" in a:
    vals = [[20.0 if j == (i * 7) % vocab else 10.0 * ((j * 13 + i) % 97) / 97
             for j in range(vocab)] for i in range(rows)]
    hdr = "{'descr': '<f4', 'fortran_order': False, 'shape': (%d, %d), }" % (rows, vocab)
    hdr += " " * ((64 - (10 + len(hdr) + 1) % 64) % 64) + "\n"
    with open(a[a.index("--dump-logits") + 1], "wb") as f:
        f.write(b"\x93NUMPY\x01\x00" + struct.pack("<H", len(hdr)) + hdr.encode("latin1"))
        f.write(struct.pack("<%df" % (rows * vocab), *[x for r in vals for x in r]))
out = {"generated_ids": [(i * 7) % vocab for i in range(rows)]}
if "--speculative" in a:
    out["speculative"] = {"mode": "draft", "proposed_tokens": 25, "accepted_tokens": 25}
    sys.stderr.write("[info] draft model (--speculative draft): stub (4 layers) on cuda:0 (Stub)\n")
print(json.dumps(out))
sys.exit($rc)
PY
  # ncu: two forward steps (each an embedding kernel, then a 1 ms GEMM reading 3 GB) in Nsight
  # Compute's CSV, after the profiled program's own output.
  {
    printf '#!/bin/sh\necho "stub ltm-bench output"\n'
    local header='"ID","Kernel Name","Grid Size","Metric Name","Metric Unit","Metric Value"'
    printf "echo '%s'\n" "$header"
    local id=0 step kernel
    for step in 0 1; do
      for kernel in "void ltm::embedding_kernel(int)|(4, 1, 1)|2,000|1,000" \
                    "nvjet_gemm_NNT|(2, 64, 1)|1,000,000|3,000,000,000"; do
        IFS='|' read -r name grid ns bytes <<< "$kernel"
        printf "echo '\"%s\",\"%s\",\"%s\",\"gpu__time_duration.sum\",\"ns\",\"%s\"'\n" \
          "$id" "$name" "$grid" "$ns"
        printf "echo '\"%s\",\"%s\",\"%s\",\"dram__bytes_read.sum\",\"byte\",\"%s\"'\n" \
          "$id" "$name" "$grid" "$bytes"
        id=$((id + 1))
      done
    done
    printf 'exit %s\n' "$rc"
  } > "$d/bin/ncu"
  chmod +x "$d"/bin/* "$d"/build/tests/* "$d"/build/launcher/*
}

# run NAME MODE: runs scripts/gpu_check on stub set MODE; output in $tmp/NAME.out, rc in $rc.
run() {
  stubs "$tmp/$1" "$2"
  PATH="$tmp/$1/bin:$PATH" OUT="$tmp/$1/out" LTM_GPU_CHECK_BUILD="$tmp/$1/build" \
    LTM_GPU_CHECK_PYTHON="$py" LTM_GPU_CHECK_BUDGET=300 LTM_GPU_CHECK_NCU="$tmp/$1/bin/ncu" \
    timeout 280 bash "$src/scripts/gpu_check" 90 > "$tmp/$1.out" 2>&1
  rc=$?
}
steps="gpu build gpu_test:cuda_graphs_gpu_test gpu_test:kernels_gpu_test model_bf16_vs_cpu_f32
  graph_replay_equals_eager device_sampling_equals_host nccl_allreduce_in_graph
  nccl_init_timeout_abort limits_before bench_decode_b1 bench_decode_b64 bench_prefill_2048
  bench_decode_b1_int8 bench_decode_b64_int8 limits_after targets profile_decode_b1
  profile_prefill_2048"

run pass pass
[ "$rc" -eq 0 ] || fail "a passing stub set: exit $rc"
for s in $steps; do
  grep -q "^PASS $s " "$tmp/pass.out" || fail "passing set: no PASS line for $s"
done
grep -q '"passed": true' "$tmp/pass/out/report.json" || fail "passing set: report.json not passed"
summary="step 1 of 2: 2 kernels, 1.002 ms, 3.00 GB read"
grep -q "^PASS profile_decode_b1 .*$summary" "$tmp/pass.out" ||
  fail "passing set: the profile's summary is not the stub CSV's last step"
grep -q '^FAIL' "$tmp/pass.out" && fail "passing set: a FAIL line"
[ $bad -eq 0 ] && echo "ok: the passing stub set passes ($(grep -c '^PASS' "$tmp/pass.out") steps)"

run failing fail
[ "$rc" -ne 0 ] || fail "a failing stub set: exit 0"
grep -q "^FAIL nccl_allreduce_in_graph .*not built: no test matches" "$tmp/failing.out" ||
  fail "failing set: the missing NCCL tests are not reported 'not built'"
for s in $steps; do
  [ "$s" = gpu ] || [ "$s" = build ] && continue
  grep -q "^FAIL $s " "$tmp/failing.out" || fail "failing set: no FAIL line for $s"
done
grep -q '"passed": false' "$tmp/failing/out/report.json" || fail "failing set: report not failed"
[ $bad -eq 0 ] && echo "ok: the failing stub set fails (exit $rc), a FAIL line per step," \
  "'not built' for the missing program"

run nogpu nogpu
[ "$rc" -ne 0 ] || fail "no GPU: exit 0"
grep -q "^FAIL gpu " "$tmp/nogpu.out" || fail "no GPU: no FAIL line for the gpu step"
grep -q "^FAIL targets .*no GPU" "$tmp/nogpu.out" || fail "no GPU: later steps not listed"
grep -q "stub cmake" "$tmp/nogpu/out/build.log" 2> /dev/null && fail "no GPU: it still built"
[ $bad -eq 0 ] && echo "ok: without a GPU it fails at once (exit $rc)"

if [ $bad -ne 0 ]; then
  for f in "$tmp"/*.out; do echo "== $f"; cat "$f"; done
fi
exit $bad
