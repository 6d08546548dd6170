"""Reference for the sampler: HF `generate()`'s logits processors, written in PyTorch.

Used two ways:
  - as a script by tests/engine/sampler_test.cpp (SamplerReference):
        test_sampler_reference.py LOGITS.npy HISTORY.npy OUT.npy T TOP_K TOP_P PENALTY [T ...]
    writes, for each (T, TOP_K, TOP_P, PENALTY), the probabilities the sampler should draw from
    (float32, shape [number of parameter sets, V]);
  - as a pytest that checks the reference itself against hand-computed cases.

The processors follow transformers' RepetitionPenaltyLogitsProcessor, TemperatureLogitsWarper,
TopKLogitsWarper and TopPLogitsWarper (min_tokens_to_keep = 1), applied in that order. One
documented difference: ltm breaks ties at the k-th logit by lowest id (exactly k kept), HF keeps
every tied token; the test data has no such ties.
"""

import sys

import numpy as np
import torch


def repetition_penalty(scores, input_ids, penalty):
    score = torch.gather(scores, 1, input_ids)
    score = torch.where(score < 0, score * penalty, score / penalty)
    return scores.scatter(1, input_ids, score)


def temperature(scores, t):
    return scores / t


def top_k(scores, k):
    k = min(k, scores.size(-1))
    indices_to_remove = scores < torch.topk(scores, k)[0][..., -1, None]
    return scores.masked_fill(indices_to_remove, -float("inf"))


def top_p(scores, p):
    sorted_logits, sorted_indices = torch.sort(scores, descending=False)
    cumulative_probs = sorted_logits.softmax(dim=-1).cumsum(dim=-1)
    sorted_indices_to_remove = cumulative_probs <= (1 - p)
    sorted_indices_to_remove[..., -1:] = 0  # keep at least one
    indices_to_remove = sorted_indices_to_remove.scatter(1, sorted_indices, sorted_indices_to_remove)
    return scores.masked_fill(indices_to_remove, -float("inf"))


def processed_probs(logits, history, t, k, p, penalty):
    """logits: [1, V] float32 tensor; history: [1, L] int64. Returns [V] probabilities (float64)."""
    scores = logits.clone()
    if penalty != 1.0 and history.numel() > 0:
        scores = repetition_penalty(scores, history, penalty)
    if t == 0:
        probs = torch.zeros_like(scores, dtype=torch.float64)
        probs[0, int(torch.argmax(scores[0]))] = 1.0
        return probs[0]
    if t != 1.0:
        scores = temperature(scores, t)
    if k > 0:
        scores = top_k(scores, k)
    if p < 1.0:
        scores = top_p(scores, p)
    return torch.softmax(scores.double(), dim=-1)[0]


def main(argv):
    logits_path, history_path, out_path = argv[:3]
    sets = argv[3:]
    assert sets and len(sets) % 4 == 0, "expected groups of T TOP_K TOP_P PENALTY"
    logits = torch.from_numpy(np.load(logits_path).astype(np.float32)).reshape(1, -1)
    history = torch.from_numpy(np.load(history_path).astype(np.int64)).reshape(1, -1)
    rows = []
    for i in range(0, len(sets), 4):
        t, k, p, penalty = float(sets[i]), int(sets[i + 1]), float(sets[i + 2]), float(sets[i + 3])
        rows.append(processed_probs(logits, history, t, k, p, penalty).numpy().astype(np.float32))
    np.save(out_path, np.stack(rows))


# ---- pytest: the reference against hand computations ----


def test_repetition_penalty_hand_computed():
    scores = torch.tensor([[2.0, -1.0, 0.5, 3.0, 0.0]])
    ids = torch.tensor([[0, 1, 1, 4, 0]])
    out = repetition_penalty(scores, ids, 2.0)
    assert torch.equal(out, torch.tensor([[1.0, -2.0, 0.5, 3.0, 0.0]]))


def test_top_p_includes_crossing_token():
    probs = torch.tensor([[0.125, 0.5, 0.0625, 0.25, 0.0625]])
    logits = probs.log()
    kept = lambda p: torch.isfinite(top_p(logits, p))[0].nonzero().flatten().tolist()
    assert kept(0.4) == [1]
    assert kept(0.6) == [1, 3]
    assert kept(0.8) == [0, 1, 3]


def test_top_k_then_top_p_renormalizes():
    logits = torch.tensor([[0.1, 0.4, 0.2, 0.3]]).log()
    probs = processed_probs(logits, torch.zeros((1, 0), dtype=torch.int64), 1.0, 2, 0.5, 1.0)
    assert probs.tolist() == [0.0, 1.0, 0.0, 0.0]


def test_script_round_trip(tmp_path):
    logits = np.array([[0.5, -0.3, 1.7, 0.0]], dtype=np.float32)
    np.save(tmp_path / "l.npy", logits)
    np.save(tmp_path / "h.npy", np.array([2], dtype=np.float32))
    main([str(tmp_path / "l.npy"), str(tmp_path / "h.npy"), str(tmp_path / "o.npy"),
          "0.5", "0", "1.0", "2.0", "0", "0", "1.0", "1.0"])
    out = np.load(tmp_path / "o.npy")
    assert out.shape == (2, 4)
    assert out[1].tolist() == [0.0, 0.0, 1.0, 0.0]  # greedy
    got = out[0]
    want = torch.softmax(torch.tensor([0.5, -0.3, 0.85, 0.0], dtype=torch.float64) / 0.5, dim=0).numpy()
    assert np.abs(got - want).max() < 1e-6


if __name__ == "__main__":
    main(sys.argv[1:])
