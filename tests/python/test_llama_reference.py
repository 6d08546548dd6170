"""The Llama-family reference (ltm_testing/llama_reference.py) and the random HF folders
(ltm_testing/llama_checkpoint.py) checked on their own, before anything is compared with them:
hand-computed RoPE values (rotate-half pairs i and i + head_dim/2, not adjacent elements),
position 0 untouched, scores that depend on relative positions only, linear and llama3 scaling,
grouped-query attention equal to multi-head attention with the KV weights repeated, biases
where each family has them, tied heads, and the folders read back as written."""
import json
import math
import os

import pytest
import torch

from ltm_testing.llama_checkpoint import (load_llama_checkpoint, load_llama_config,
                                          make_llama_checkpoint, tensor_shapes)
from ltm_testing.llama_reference import LlamaReference, rope_inv_freq

SHAPE = dict(vocab_size=211, hidden_size=96, intermediate_size=160, n_layer=2, n_head=12,
             n_kv_head=4)


def prompt(n, seed=0, vocab=SHAPE["vocab_size"]):
    g = torch.Generator().manual_seed(seed)
    return torch.randint(0, vocab, (n,), generator=g).tolist()


def model(tmp_path, family="llama", **kw):
    path = str(tmp_path / family)
    args = dict(SHAPE, std=0.2, qk_std=0.3, seed=3)
    args.update(kw)
    weights = make_llama_checkpoint(path, family, **args)
    return path, weights, load_llama_config(path)


def test_rope_hand_computed():
    # head_dim 4, theta 100: inv_freq = [1, 1/10]; element i pairs with i + 2.
    config = dict(hidden_size=4, num_attention_heads=1, rope_theta=100.0)
    ref = LlamaReference({"embed_tokens.weight": torch.zeros(1, 4)}, dict(
        config, num_hidden_layers=0, model_type="llama"))
    assert torch.allclose(rope_inv_freq(config), torch.tensor([1.0, 0.1], dtype=torch.float64))
    v = torch.tensor([[[1.0, 2.0, 3.0, 4.0]] * 3], dtype=torch.float64)  # 1 head, 3 positions
    out = ref._rope(v, 3)[0]
    for p in range(3):
        a, b = p * 1.0, p * 0.1
        want = [1 * math.cos(a) - 3 * math.sin(a), 2 * math.cos(b) - 4 * math.sin(b),
                3 * math.cos(a) + 1 * math.sin(a), 4 * math.cos(b) + 2 * math.sin(b)]
        assert out[p].tolist() == pytest.approx(want, abs=1e-12)


def test_rope_keeps_position_zero_and_scores_depend_on_distance_only():
    config = dict(hidden_size=64, num_attention_heads=2, rope_theta=500000.0,
                  num_hidden_layers=0, model_type="llama")
    ref = LlamaReference({"embed_tokens.weight": torch.zeros(1, 64)}, config)
    g = torch.Generator().manual_seed(0)
    q = torch.randn(1, 1, 32, generator=g, dtype=torch.float64).expand(1, 40, 32)
    k = torch.randn(1, 1, 32, generator=g, dtype=torch.float64).expand(1, 40, 32)
    rq, rk = ref._rope(q, 40)[0], ref._rope(k, 40)[0]
    assert torch.equal(rq[0], q[0, 0]) and torch.equal(rk[0], k[0, 0])
    assert not torch.allclose(rq[5], q[0, 0])
    for m, n in ((7, 3), (20, 9), (38, 0)):
        for shift in (1, -(n)):
            assert float(rq[m] @ rk[n]) == pytest.approx(float(rq[m + shift] @ rk[n + shift]),
                                                         abs=1e-9)
    # Rotations keep norms.
    assert torch.allclose(rq.norm(dim=-1), q[0].norm(dim=-1))


def test_linear_rope_scaling_divides_positions():
    base = dict(hidden_size=32, num_attention_heads=1, rope_theta=10000.0)
    plain = rope_inv_freq(base)
    scaled = rope_inv_freq(dict(base, rope_scaling={"type": "linear", "factor": 4.0}))
    assert torch.allclose(scaled * 4, plain)


def test_llama3_rope_scaling_values():
    # Llama 3.1's numbers: head_dim 128, theta 500000, factor 8, low 1, high 4, old context 8192.
    scaling = {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
               "high_freq_factor": 4.0, "original_max_position_embeddings": 8192}
    base = dict(hidden_size=4096, num_attention_heads=32, rope_theta=500000.0)
    plain, scaled = rope_inv_freq(base), rope_inv_freq(dict(base, rope_scaling=scaling))
    wavelen = 2 * math.pi / plain
    short, long = wavelen < 8192 / 4, wavelen > 8192 / 1
    assert short.sum() > 0 and long.sum() > 0 and (~short & ~long).sum() > 0
    assert torch.equal(scaled[short], plain[short])
    assert torch.allclose(scaled[long], plain[long] / 8)
    mid = ~short & ~long
    # In between: (1 - s) f / 8 + s f with s = (8192 / wavelen - 1) / 3, so between f / 8 and f.
    s = (8192 / wavelen[mid] - 1) / 3
    assert torch.allclose(scaled[mid], (1 - s) * plain[mid] / 8 + s * plain[mid])
    assert ((scaled[mid] < plain[mid]) & (scaled[mid] > plain[mid] / 8)).all()


def test_grouped_query_attention_equals_multi_head_with_repeated_kv(tmp_path):
    path, weights, config = model(tmp_path)
    ids = prompt(17)
    gqa = LlamaReference(weights, config).logits(ids)
    # The same model as multi-head attention: KV head j // 3 copied for query head j.
    group = config["num_attention_heads"] // config["num_key_value_heads"]
    hd = config["hidden_size"] // config["num_attention_heads"]
    mha_weights = dict(weights)
    for l in range(config["num_hidden_layers"]):
        for name in ("k_proj", "v_proj"):
            key = f"layers.{l}.self_attn.{name}.weight"
            w = weights[key].view(config["num_key_value_heads"], hd, -1)
            mha_weights[key] = w.repeat_interleave(group, dim=0).reshape(-1, w.shape[-1])
    mha_config = dict(config, num_key_value_heads=config["num_attention_heads"])
    mha = LlamaReference(mha_weights, mha_config).logits(ids)
    assert (gqa - mha).abs().max() < 1e-10
    # And the mapping matters: query head j reading KV head j % 4 is another model.
    wrong = LlamaReference(weights, config, kv_map="modulo").logits(ids)
    assert (wrong - gqa).abs().max() > 0.05
    no_rope = LlamaReference(weights, config, rope=False).logits(ids)
    assert (no_rope - gqa).abs().max() > 0.05
    # Position 0 sees no rotation, and only itself.
    assert (no_rope[0] - gqa[0]).abs().max() < 1e-10


def test_causal_prefix_logits_do_not_see_later_tokens(tmp_path):
    path, weights, config = model(tmp_path)
    ref = LlamaReference(weights, config)
    ids = prompt(12)
    full = ref.logits(ids)
    assert (ref.logits(ids[:7]) - full[:7]).abs().max() < 1e-10


def test_qwen2_biases_and_tied_head(tmp_path):
    path, weights, config = model(tmp_path, "qwen2", tie_word_embeddings=True)
    names = set(weights)
    assert "layers.0.self_attn.q_proj.bias" in names and "layers.0.self_attn.v_proj.bias" in names
    assert "layers.0.self_attn.o_proj.bias" not in names
    assert "lm_head.weight" not in names and config["tie_word_embeddings"]
    ids = prompt(9)
    ref = LlamaReference(weights, config)
    got = ref.logits(ids)
    # Biases zeroed: a Llama without biases on the same weights.
    zeroed = {k: (torch.zeros_like(v) if k.endswith(".bias") else v) for k, v in weights.items()}
    llama_config = dict(config, model_type="llama", architectures=["LlamaForCausalLM"])
    plain = LlamaReference({k: v for k, v in zeroed.items() if not k.endswith(".bias")},
                           llama_config).logits(ids)
    assert (LlamaReference(zeroed, config).logits(ids) - plain).abs().max() < 1e-10
    assert (got - plain).abs().max() > 0.05
    # Tied: the head is the embedding.
    assert torch.equal(ref.head, ref.w["embed_tokens.weight"])


def test_llama_attention_bias_has_o_bias(tmp_path):
    path, weights, config = model(tmp_path, attention_bias=True)
    assert {"layers.1.self_attn.q_proj.bias", "layers.1.self_attn.o_proj.bias"} <= set(weights)
    assert "lm_head.weight" in weights


@pytest.mark.parametrize("dtype,shards", [("F32", 1), ("BF16", 3), ("F16", 2)])
def test_folder_reads_back_as_written(tmp_path, dtype, shards):
    path = str(tmp_path / "m")
    weights = make_llama_checkpoint(path, "llama", dtype=dtype, shards=shards, seed=5, **SHAPE)
    files = sorted(os.listdir(path))
    if shards == 1:
        assert "model.safetensors" in files
    else:
        with open(os.path.join(path, "model.safetensors.index.json")) as f:
            index = json.load(f)
        assert len(set(index["weight_map"].values())) == shards
        assert "lm_head.weight" in index["weight_map"]
        assert "model.embed_tokens.weight" in index["weight_map"]
    back = load_llama_checkpoint(path)
    assert set(back) == set(weights) == {n for n, _ in tensor_shapes(load_llama_config(path))}
    for name, value in weights.items():
        assert torch.equal(back[name], value), name
    config = load_llama_config(path)
    assert config["architectures"] == ["LlamaForCausalLM"]
    assert config["num_key_value_heads"] == 4
    assert config["torch_dtype"] == {"F32": "float32", "BF16": "bfloat16", "F16": "float16"}[dtype]


def test_mistral_sliding_window_config(tmp_path):
    path, weights, config = model(tmp_path, "mistral", sliding_window=4096)
    assert config["sliding_window"] == 4096 and config["architectures"] == ["MistralForCausalLM"]
    with pytest.raises(ValueError, match="sliding_window"):
        LlamaReference(weights, config)
    path, weights, config = model(tmp_path, "mistral")
    assert config["sliding_window"] is None
    LlamaReference(weights, config).logits(prompt(3))


def test_gpt2_tokenizer_json_written(tmp_path):
    gpt2 = os.environ.get("LTM_GPT2_DIR")
    if not gpt2 or not os.path.exists(os.path.join(gpt2, "vocab.json")):
        pytest.fail("$LTM_GPT2_DIR is not set: run scripts/fetch_gpt2_vocab")
    path = str(tmp_path / "m")
    make_llama_checkpoint(path, "qwen2", tokenizer_from=gpt2, vocab_size=50304, hidden_size=32,
                          intermediate_size=64, n_layer=1, n_head=4, n_kv_head=2)
    with open(os.path.join(path, "tokenizer.json"), encoding="utf-8") as f:
        tok = json.load(f)
    assert len(tok["model"]["vocab"]) == 50257
    config = load_llama_config(path)
    assert config["eos_token_id"] == config["bos_token_id"] == 50256
