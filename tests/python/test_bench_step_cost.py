"""ltm-bench --step-cost with --step-cost-replay (launcher/step_cost.h, runtime/spec/replay.h):
a greedy one-shot run's JSON replayed through prompt lookup at the step costs just measured.

- the replay line names the file, caps the drafts at min(5, rows - 1) and reports an oracle's and
  DraftLength's speedups, finite and positive, with no more drafts accepted than proposed;
- a file that is not an ltm-worker --output json run, and the flag without --step-cost, are
  refused with exit 2 and a message naming the problem.
"""
import json
import math
import os
import subprocess

import pytest

BUILD = os.environ.get("LTM_BUILD_DIR", "")
SOURCE = os.environ.get("LTM_SOURCE_DIR", "")
BENCH = os.path.join(BUILD, "launcher", "ltm-bench")
WORKER = os.path.join(BUILD, "launcher", "ltm-worker")
MODEL = os.path.join(SOURCE, "models", "kjv-small")


@pytest.fixture(scope="module")
def run_json(tmp_path_factory):
    """A greedy one-shot run that repeats itself (prompt lookup has something to guess)."""
    prompt = "And the earth was without form, and void; and the earth was without form, and"
    out = subprocess.run([WORKER, "--model", MODEL, "--threads", "2", "--prompt", prompt,
                          "--max-new-tokens", "40", "--ignore-eos", "--output", "json"],
                         capture_output=True, text=True, timeout=300, check=True).stdout
    path = tmp_path_factory.mktemp("replay") / "run.json"
    path.write_text(out)
    return str(path)


def bench(*args):
    return subprocess.run([BENCH, "--model", MODEL, "--threads", "2", *args],
                          capture_output=True, text=True, timeout=300)


def test_replay_reports_both_speedups(run_json):
    p = bench("--step-cost", "--step-cost-rows", "3", "--step-cost-rounds", "5",
              "--step-cost-replay", run_json, "--json")
    assert p.returncode == 0, p.stderr
    lines = [json.loads(l) for l in p.stdout.splitlines() if l.startswith("{")]
    replays = [l for l in lines if l.get("measurement") == "spec_replay"]
    assert len(replays) == 1, p.stdout
    r = replays[0]
    assert r["file"] == run_json and r["max_drafts"] == 2
    for key in ("oracle_speedup", "draft_length_speedup", "drafted_only_speedup"):
        assert math.isfinite(r[key]) and r[key] > 0, r
    assert 0 <= r["draft_length_accepted"] <= r["draft_length_proposed"], r
    ratios = [l for l in lines if l.get("measurement") == "step_cost"]
    assert [l["rows_per_sequence"] for l in ratios] == [1, 2, 3]


def test_a_file_that_is_not_a_run_is_refused(tmp_path):
    bad = tmp_path / "bad.json"
    bad.write_text('{"text": "no ids here"}')
    p = bench("--step-cost", "--step-cost-rows", "2", "--step-cost-rounds", "2",
              "--step-cost-replay", str(bad))
    assert p.returncode == 2
    assert str(bad) in p.stderr and "prompt_ids" in p.stderr, p.stderr


def test_replay_needs_step_cost(run_json):
    p = bench("--step-cost-replay", run_json)
    assert p.returncode == 2
    assert "--step-cost-replay needs --step-cost" in p.stderr, p.stderr
