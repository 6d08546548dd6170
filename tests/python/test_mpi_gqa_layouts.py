"""Grouped-query attention across tensor-parallel ranks (issue 24, the Llama family).

A Llama-family model's query heads and KV heads are split over tp; when tp exceeds the KV heads,
each KV head is replicated on tp / n_kv_head ranks. Every layout must give the one-rank greedy
tokens: 12 query heads over 4 KV heads (head_dim given, rope_theta 500000, untied head) under tp 2,
tp 4 and tp 2 x pp 2; a Qwen2-shaped model (q/k/v biases, tied head) with 8 query heads over 2 KV
heads under tp 4 (KV heads replicated) and tp 2 x pp 2. Random weights from a config (--init
random): each rank draws only its slices, so the layouts see one model. A tp that neither divides
nor is a multiple of the KV heads is refused with a message naming them. A PEFT LoRA adapter on
q/k/v/o/gate/up/down (applied as fused updates: q|k|v and gate|up) gives the one-rank tokens in
every layout, unmerged and merged alike. On the emulated device (--device devsim, the CUDA path's
stand-in) one rank replays captured decode graphs, and tp 2 x pp 2 (Llama) and tp 4 (Qwen2) give
the one-rank CPU tokens."""
import json

import pytest
import torch

from ltm_testing.checkpoint import write_safetensors
from ltm_testing.worker import generate_json, run_worker

LLAMA = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "vocab_size": 499,
         "hidden_size": 64, "intermediate_size": 96, "num_hidden_layers": 4,
         "num_attention_heads": 12, "num_key_value_heads": 4, "head_dim": 16,
         "max_position_embeddings": 64, "rms_norm_eps": 1e-5, "rope_theta": 500000.0,
         "tie_word_embeddings": False, "bos_token_id": 0, "eos_token_id": 0}
QWEN2 = {"architectures": ["Qwen2ForCausalLM"], "model_type": "qwen2", "vocab_size": 499,
         "hidden_size": 64, "intermediate_size": 96, "num_hidden_layers": 4,
         "num_attention_heads": 8, "num_key_value_heads": 2, "max_position_embeddings": 64,
         "rms_norm_eps": 1e-6, "rope_theta": 1000000.0, "tie_word_embeddings": True,
         "sliding_window": 64, "use_sliding_window": False, "bos_token_id": 0, "eos_token_id": 0}


@pytest.fixture(scope="module")
def configs(tmp_path_factory):
    d = tmp_path_factory.mktemp("gqa")
    paths = {}
    for name, shape in (("llama", LLAMA), ("qwen2", QWEN2)):
        (d / f"{name}.json").write_text(json.dumps(shape))
        paths[name] = str(d / f"{name}.json")
    return paths


def make_adapter(folder, shape, r=2, skip=("layers.1.self_attn.v_proj",)):
    """A PEFT folder on every Llama module of every layer (but `skip`), rank r, alpha 2r."""
    d, ff = shape["hidden_size"], shape["intermediate_size"]
    hd = shape.get("head_dim", d // shape["num_attention_heads"])
    q, kv = shape["num_attention_heads"] * hd, shape["num_key_value_heads"] * hd
    io = {"self_attn.q_proj": (d, q), "self_attn.k_proj": (d, kv), "self_attn.v_proj": (d, kv),
          "self_attn.o_proj": (q, d), "mlp.gate_proj": (d, ff), "mlp.up_proj": (d, ff),
          "mlp.down_proj": (ff, d)}
    g = torch.Generator().manual_seed(11)
    records = []
    for layer in range(shape["num_hidden_layers"]):
        for module, (n_in, n_out) in io.items():
            if f"layers.{layer}.{module}" in skip:
                continue
            base = f"base_model.model.model.layers.{layer}.{module}"
            for which, dims in (("A", (r, n_in)), ("B", (n_out, r))):
                t = torch.randn(dims, generator=g) * 0.3
                records.append((f"{base}.lora_{which}.weight", "F32", dims, t.numpy().tobytes()))
    folder.mkdir()
    write_safetensors(str(folder / "adapter_model.safetensors"), records)
    (folder / "adapter_config.json").write_text(json.dumps(
        {"peft_type": "LORA", "r": r, "lora_alpha": 2 * r,
         "target_modules": ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj",
                            "down_proj"]}))
    return str(folder)


def tokens(config, tp, pp, extra=()):
    out = generate_json(config, prompt_ids=[5, 17, 42, 7, 300, 11, 9, 250], max_new_tokens=20,
                        ranks=tp * pp,
                        extra=["--tp", tp, "--pp", pp, "--ignore-eos", "--threads", "1",
                               "--init-std", "0.3", "--init-seed", 3, *extra])
    return out["generated_ids"]


def test_llama_gqa_layouts_give_one_ranks_tokens(configs):
    base = tokens(configs["llama"], 1, 1)
    assert len(set(base)) > 4, base
    for tp, pp in [(2, 1), (4, 1), (2, 2)]:
        assert tokens(configs["llama"], tp, pp) == base, (tp, pp)
    # Chunked prefill (chunks of 3 prompt tokens) gives the same tokens too.
    assert tokens(configs["llama"], 1, 1, ["--max-batch-tokens", 3]) == base


def test_qwen2_kv_heads_replicated_when_tp_exceeds_them(configs):
    base = tokens(configs["qwen2"], 1, 1)
    assert len(set(base)) > 4, base
    for tp, pp in [(4, 1), (2, 2)]:
        assert tokens(configs["qwen2"], tp, pp) == base, (tp, pp)


def test_lora_on_every_module_in_every_layout(configs, tmp_path):
    # Llama: KV heads split (tp 2) with a pipeline; Qwen2: KV heads replicated (tp 4).
    for name, shape, (tp, pp) in (("llama", LLAMA, (2, 2)), ("qwen2", QWEN2, (4, 1))):
        adapter = make_adapter(tmp_path / name, shape)
        unmerged = ["--lora", f"a={adapter}", "--adapter", "a"]
        want = tokens(configs[name], 1, 1, unmerged)
        assert tokens(configs[name], tp, pp, unmerged) == want, (name, tp, pp)
        if name == "llama":
            assert want != tokens(configs[name], 1, 1), name  # the update matters
            assert tokens(configs[name], 1, 1, ["--lora", f"a={adapter}", "--lora-merge"]) == want


def test_emulated_device_with_decode_graphs_gives_the_cpus_tokens(configs):
    # The emulated device (runtime/backend/devsim_backend.h) queues the Llama ops like the others
    # and replays decode steps as captured graphs.
    out = generate_json(configs["qwen2"], prompt_ids=[5, 17, 42, 7, 300, 11, 9, 250],
                        max_new_tokens=20,
                        extra=["--device", "devsim", "--ignore-eos", "--threads", "1",
                               "--init-std", "0.3", "--init-seed", 3])
    assert out["decode_graphs"]["replays"] > 0, out["decode_graphs"]
    assert out["generated_ids"] == tokens(configs["qwen2"], 1, 1)


def test_emulated_device_groups_give_the_one_rank_tokens(configs):
    # The device path with several ranks (what --device cuda runs over NCCL): activations on the
    # emulated device's communicators, Llama's KV heads split with a pipeline, Qwen2's
    # replicated over tp 4.
    for name, (tp, pp) in (("llama", (2, 2)), ("qwen2", (4, 1))):
        assert tokens(configs[name], tp, pp, ["--device", "devsim"]) == \
            tokens(configs[name], 1, 1), (name, tp, pp)


def test_tp_that_cannot_split_the_kv_heads_is_refused(tmp_path):
    shape = dict(LLAMA, num_attention_heads=6, num_key_value_heads=2, head_dim=16)
    path = tmp_path / "six.json"
    path.write_text(json.dumps(shape))
    p = run_worker(["--model", str(path), "--prompt-ids", "1,2", "--tp", "3", "--threads", "1"],
                   ranks=3, check=False, timeout=120)
    assert p.returncode != 0
    assert "--tp 3 neither divides the model's 2 KV heads" in p.stderr, p.stderr
