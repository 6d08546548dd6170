"""A config-only model (--init random) is the same model in every layout (issue 10, item 2).

Each rank makes only its own slices of the random weights, from a counter-based generator (a value
depends only on the seed, the tensor and the element's index); so tp 2, pp 2 and tp 2 x pp 2 must
give the one-rank greedy tokens, and another seed must give other tokens. Weights are drawn at std
0.2 so that the greedy output depends on the context."""
import json

import pytest

from ltm_testing.worker import generate_json, run_worker

SHAPE = {"model_type": "gpt2", "vocab_size": 499, "n_positions": 64, "n_embd": 64, "n_layer": 4,
         "n_head": 4, "n_inner": None, "bos_token_id": 0, "eos_token_id": 0}


@pytest.fixture(scope="module")
def config(tmp_path_factory):
    path = tmp_path_factory.mktemp("random_init") / "tiny.json"
    path.write_text(json.dumps(SHAPE))
    return str(path)


def tokens(config, tp, pp, seed=3):
    out = generate_json(config, prompt_ids=[5, 17, 42, 7, 300], max_new_tokens=24, ranks=tp * pp,
                        extra=["--tp", tp, "--pp", pp, "--ignore-eos", "--threads", "1",
                               "--init-std", "0.2", "--init-seed", seed])
    return out["generated_ids"]


def test_every_layout_builds_the_same_random_model(config):
    base = tokens(config, 1, 1)
    assert len(set(base)) > 4, base
    for tp, pp in [(2, 1), (1, 2), (2, 2)]:
        assert tokens(config, tp, pp) == base, (tp, pp)
    assert tokens(config, 1, 1, seed=4) != base


def test_init_random_takes_a_folders_shape_and_ignores_its_weights(config, tmp_path):
    folder = tmp_path / "shape_only"
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps(SHAPE))  # no weight files at all
    out = generate_json(str(folder), prompt_ids=[5, 17, 42, 7, 300], max_new_tokens=24,
                        extra=["--init", "random", "--ignore-eos", "--threads", "1",
                               "--init-std", "0.2", "--init-seed", 3])
    assert out["generated_ids"] == tokens(config, 1, 1)
    p = run_worker(["--model", str(folder), "--prompt-ids", "1,2", "--max-new-tokens", "2"],
                   check=False, timeout=60)
    assert p.returncode != 0  # without --init random the folder's (missing) weights are read
    p = run_worker(["--model", config, "--init", "checkpoint", "--prompt-ids", "1,2",
                    "--max-new-tokens", "2"], check=False, timeout=60)
    assert p.returncode != 0 and "is a config file, not a checkpoint folder" in p.stderr, p.stderr
    p = run_worker(["--model", config, "--init", "zeros", "--prompt-ids", "1,2"], check=False,
                   timeout=60)
    assert p.returncode == 2 and "--init must be checkpoint or random" in p.stderr, p.stderr
