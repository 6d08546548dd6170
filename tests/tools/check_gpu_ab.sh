#!/usr/bin/env bash
# scripts/gpu_ab against a stub ltm-bench (no GPU needed) whose figures depend on the switches'
# environment: each pair's median new / old ratio must come out as the stub's (prefill 1.5,
# bias 1.1, int8 reads 1.2, decode lanes 1.05, int8 mma 1.3) with the runs alternated; a failing
# ltm-bench must make it exit 1; a budget too small for all runs must stop it with the pairs it
# could not finish named; no ltm-bench must exit 2.
#   check_gpu_ab.sh SOURCE_DIR PYTHON
# shellcheck source=tests/tools/check_lib.sh
source "$(dirname "$0")/check_lib.sh"

stub() {  # stub DIR EXIT SLEEP
  mkdir -p "$1/launcher"
  cat > "$1/launcher/ltm-bench" <<PY
#!$py
import json, os, sys, time
time.sleep($3)
e = os.environ.get
prefill = 100.0 * (1.5 if e("LTM_CUDA_PREFILL_MMA") != "0" else 1.0)
decode = 100.0 * (1.1 if e("LTM_CUDA_BIAS_AT_LOAD") != "0" else 1.0)
decode *= 1.05 if e("LTM_CUDA_DECODE_VECS") != "1" else 1.0
if "int8" in sys.argv:
    decode *= 1.2 if e("LTM_CUDA_INT8_READS") != "2" else 1.0
    if sys.argv[sys.argv.index("--batch") + 1] == "64":
        decode *= 1.3 if e("LTM_CUDA_INT8_MMA") != "0" else 1.0
print(json.dumps({"measurement": "prefill", "tokens_per_s": prefill}))
print(json.dumps({"measurement": "decode", "tokens_per_s": decode}))
sys.exit($2)
PY
  chmod +x "$1/launcher/ltm-bench"
}

run() {  # run NAME ARGS...: rc in $rc, output in $tmp/NAME.out
  local name=$1
  shift
  OUT="$tmp/$name/out" timeout 120 "$py" "$src/scripts/gpu_ab" "$@" > "$tmp/$name.out" 2>&1
  rc=$?
}

stub "$tmp/ok" 0 0
run ok --build "$tmp/ok" --rounds 3
[ "$rc" -eq 0 ] || fail "passing stub: exit $rc"
"$py" - "$tmp/ok/out/ab.json" <<'PY' || bad=1
import json, sys
j = json.load(open(sys.argv[1]))
want = {"prefill_mma": 1.5, "bias_at_load": 1.1, "int8_reads": 1.2, "decode_lanes": 1.05,
        "int8_mma": 1.3}
for name, ratio in want.items():
    p = j["pairs"][name]
    if len(p["ratios"]) != 3 or abs(p["median_ratio"] - ratio) > 1e-9:
        print(f"FAIL: {name}: ratios {p['ratios']}, median {p['median_ratio']}, want {ratio}")
        sys.exit(1)
    order = [r["path"] for r in p["runs"]]
    if order != ["new", "old", "old", "new", "new", "old"]:
        print(f"FAIL: {name}: runs not alternated: {order}")
        sys.exit(1)
PY
grep -q '^result: prefill_mma: prefill new / old .* median 1.500 over 3 round' "$tmp/ok.out" ||
  fail "no result line for prefill_mma: $(cat "$tmp/ok.out")"

stub "$tmp/bad" 1 0
run bad --build "$tmp/bad" --rounds 1 --only int8_reads
[ "$rc" -eq 1 ] || fail "failing stub: exit $rc, want 1"
grep -q '^result: int8_reads round 1 new: ltm-bench exit 1' "$tmp/bad.out" ||
  fail "failing stub: no failure line: $(cat "$tmp/bad.out")"

stub "$tmp/slow" 0 0.4
run slow --build "$tmp/slow" --rounds 5 --budget 2
[ "$rc" -eq 0 ] || fail "budget: exit $rc"
grep -q 'budget of 2 s spent' "$tmp/slow/out/ab.json" || fail "budget: no stop recorded"

run none --build "$tmp/none"
[ "$rc" -eq 2 ] || fail "no ltm-bench: exit $rc, want 2"

[ $bad -eq 0 ] && echo "ok: scripts/gpu_ab"
exit $bad
