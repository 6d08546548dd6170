"""scripts/bench_ab, the alternating A/B of two ways to run ltm-bench: each side gets its own
environment, flags and binary, the order flips every round, B / A is taken within a round, and a
failing side or a bad argument ends the run with a message that names it. Fed a stub ltm-bench
whose rate each side sets, then once on the real ltm-bench."""
import os
import re
import subprocess
import sys

import pytest

SOURCE_DIR = os.environ.get("LTM_SOURCE_DIR", os.path.join(os.path.dirname(__file__), "..", ".."))
BUILD_DIR = os.environ.get("LTM_BUILD_DIR", "")
SCRIPT = os.path.join(SOURCE_DIR, "scripts", "bench_ab")

# The stub logs each call (the side's STUB_SIDE and its argv) and prints ltm-bench's JSON lines:
# a prefill line at 1.0 and one decode line a pass, the rate STUB_RATE, or twice that with --fast.
STUB = """#!{python}
import json, os, sys
args = sys.argv[1:]
with open(os.environ["STUB_LOG"], "a") as f:
    f.write(os.environ.get("STUB_SIDE", "?") + " " + " ".join(args) + "\\n")
if os.environ.get("STUB_FAIL"):
    sys.stderr.write("stub: told to fail\\n")
    sys.exit(3)
rate = float(os.environ.get("STUB_RATE", "100")) * (2 if "--fast" in args else 1)
passes = int(args[args.index("--rounds") + 1])
print(json.dumps({{"measurement": "prefill", "tokens_per_s": 1.0}}))
for p in range(passes):
    print(json.dumps({{"measurement": "round", "round": p + 1}}))
    print(json.dumps({{"measurement": "decode", "tokens_per_s": rate - (passes - 1 - p)}}))
"""


@pytest.fixture
def stub(tmp_path):
    path = tmp_path / "ltm-bench"
    path.write_text(STUB.format(python=sys.executable))
    path.chmod(0o755)
    log = tmp_path / "calls.log"
    return str(path), log


def bench_ab(args, log, env=None):
    e = dict(os.environ, STUB_LOG=str(log))
    e.update(env or {})
    return subprocess.run([sys.executable, SCRIPT] + args, capture_output=True, text=True, env=e,
                          timeout=300)


def test_each_side_gets_its_own_env_flags_and_binary_and_the_order_flips(stub):
    bench, log = stub
    p = bench_ab(["--rounds", "4", "--passes", "2", "--a-bench", bench, "--b-bench", bench,
                  "--a-env", "STUB_SIDE=A STUB_RATE=100", "--b-env", "STUB_SIDE=B STUB_RATE=150",
                  "--b-args", "--fast", "--", "--model", "m.json", "--new-tokens", "8"], log)
    assert p.returncode == 0, p.stderr
    # B: 150 x 2 = 300 (the best of 2 passes: 299, 300) against A's 100 (99, 100).
    assert p.stdout.count("A 100.00 B 300.00 tokens/s, B / A 3.000") == 4, p.stdout
    assert "B / A median 3.000 (3.000-3.000), B faster in 4 of 4 rounds" in p.stdout, p.stdout
    calls = log.read_text().splitlines()
    assert [c.split()[0] for c in calls] == ["A", "B", "B", "A", "A", "B", "B", "A"], calls
    for c in calls:
        side, args = c.split(" ", 1)
        assert args.startswith("--model m.json --new-tokens 8"), c
        assert "--rounds 2 --skip-limits --json" in args, c
        assert ("--fast" in args) == (side == "B"), c


def test_the_measurement_and_the_default_arguments(stub):
    bench, log = stub
    # --measurement picks the line: the stub's prefill is 1.0 on both sides (its decode 100).
    p = bench_ab(["--rounds", "3", "--passes", "1", "--measurement", "prefill", "--a-bench", bench,
                  "--b-bench", bench], log)
    assert p.returncode == 0, p.stderr
    assert "B / A median 1.000 (1.000-1.000), B faster in 0 of 3 rounds" in p.stdout, p.stdout
    assert "prefill, best of 1 passes a side, 3 rounds" in p.stdout, p.stdout
    # Without ltm-bench arguments both sides run the default one-sequence decode.
    calls = log.read_text().splitlines()
    assert len(calls) == 6 and all("--prompt-tokens 1 --new-tokens 128" in c for c in calls), calls


def test_a_failing_side_and_bad_arguments_are_named(stub):
    bench, log = stub
    p = bench_ab(["--rounds", "2", "--a-bench", bench, "--b-bench", bench,
                  "--b-env", "STUB_FAIL=1"], log)
    assert p.returncode != 0
    assert "side B failed (exit 3)" in p.stderr and "stub: told to fail" in p.stderr, p.stderr
    p = bench_ab(["--a-bench", bench, "--b-bench", bench, "--a-env", "NOEQUALS"], log)
    assert p.returncode != 0 and "--a-env takes VAR=value words, got 'NOEQUALS'" in p.stderr
    p = bench_ab(["--a-bench", bench, "--b-bench", bench, "--", "--rounds", "3"], log)
    assert p.returncode != 0 and "--rounds is bench_ab's to set" in p.stderr, p.stderr
    p = bench_ab(["--a-bench", "/nonexistent/ltm-bench", "--b-bench", bench], log)
    assert p.returncode != 0 and "side A's ltm-bench /nonexistent/ltm-bench" in p.stderr
    p = bench_ab(["--rounds", "0", "--a-bench", bench, "--b-bench", bench], log)
    assert p.returncode != 0 and "at least 1" in p.stderr


def test_on_the_real_ltm_bench():
    real = os.path.join(BUILD_DIR, "launcher", "ltm-bench")
    if not os.access(real, os.X_OK):
        pytest.skip("no ltm-bench built (LTM_BUILD_DIR)")
    p = subprocess.run([sys.executable, SCRIPT, "--rounds", "2", "--passes", "1", "--b-args",
                        "--weight-dtype bf16", "--", "--threads", "2", "--prompt-tokens", "1",
                        "--new-tokens", "3"],
                       capture_output=True, text=True, timeout=600,
                       env=dict(os.environ, LTM_BUILD_DIR=BUILD_DIR))
    assert p.returncode == 0, p.stderr
    rounds = re.findall(r"round \d: A ([0-9.]+) B ([0-9.]+) tokens/s, B / A ([0-9.]+)", p.stdout)
    assert len(rounds) == 2, p.stdout
    for a, b, ratio in rounds:
        assert float(a) > 0 and float(b) > 0
        assert abs(float(b) / float(a) - float(ratio)) < 0.002, p.stdout
    assert re.search(r"B / A median [0-9.]+ \([0-9.]+-[0-9.]+\), B faster in \d of 2 rounds",
                     p.stdout), p.stdout
