"""scripts/lib/bench_serve_report.py, the summary of scripts/bench_serve: the FLOP rate divides by
the best roofline of the run, ratios are taken within each round, and the targets' verdicts
follow the medians (fed made-up rounds; no server runs)."""
import json
import os
import subprocess

SOURCE_DIR = os.environ.get("LTM_SOURCE_DIR", os.path.join(os.path.dirname(__file__), "..", ".."))
REPORT = os.path.join(SOURCE_DIR, "scripts", "lib", "bench_serve_report.py")


def limits_line(fma, read=28.0):
    return json.dumps({"measurement": "limits", "threads": 2, "probe_isa": "avx2",
                       "fma_peak_gflop_s": fma, "read_bandwidth_gb_s": read,
                       "gflop_per_generated_token": 0.5, "prompt_tokens": 32, "new_tokens": 64,
                       "request_gflop": 32.0})


def report(tmp_path, rounds, fmas, pipeline="0"):
    limits = tmp_path / "limits.jsonl"
    limits.write_text("\n".join(limits_line(f) for f in fmas) + "\n")
    stdin = "".join(" ".join(str(x) for x in r) + "\n" for r in rounds)
    p = subprocess.run(["/usr/bin/python3", REPORT, str(limits), pipeline, "avx2"], input=stdin,
                       capture_output=True, text=True, timeout=60)
    assert p.returncode == 0, p.stderr
    return p.stdout


def test_fractions_use_the_best_roofline_and_ratios_stay_within_rounds(tmp_path):
    # c1, c32, llama c32, four pipeline figures, load average.
    rounds = [(10, 90, 40, 0, 0, 0, 0, 1.0), (20, 200, 90, 0, 0, 0, 0, 2.0),
              (30, 240, 100, 0, 0, 0, 0, 3.0)]
    out = report(tmp_path, rounds, [80.0, 100.0, 90.0])
    assert "FMA roofline 100.0 GFLOP/s" in out, out
    # Round 2: 200 tokens/s x 0.5 GFLOP = 100 GFLOP/s = 1.000 of the best roofline.
    assert "round 2 (load 2.00): c1 20.0, c32 200.0 tokens/s (c32/c1 10.00); c32 100.0 GFLOP/s = 1.000" in out, out
    # c32/c1 per round 9, 10, 8 -> median 9; vs llama 2.25, 2.22, 2.40 -> median 2.25;
    # fractions 0.45, 1.0, 1.2 -> median 1.0.
    assert "c32/c1 9.00 (range 8.00-10.00)" in out, out
    assert "c32 ltm / llama-server 2.25" in out, out
    assert ("targets (medians): c32/c1 >= 8: 9.00 met; c32 >= 0.75 of the FMA roofline: 1.00 met; "
            "c32 >= 2x llama-server: 2.25 met") in out, out


def test_targets_not_met_are_said(tmp_path):
    out = report(tmp_path, [(40, 280, 140, 0, 0, 0, 0, 8.0)], [200.0])
    assert ("c32/c1 >= 8: 7.00 NOT met; c32 >= 0.75 of the FMA roofline: 0.70 NOT met; "
            "c32 >= 2x llama-server: 2.00 met") in out, out
    assert "llama-server" in out and "micro-batches" not in out, out
