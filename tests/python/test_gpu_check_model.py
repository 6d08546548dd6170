"""scripts/gpu_check's model step (scripts/lib/gpu_check_model.py) without a GPU: on the emulated
device (`--device devsim`) its two checkpoints (GPT-2, and Qwen2 for the Llama family) pass, and
the Qwen2 one can tell a wrong rotary embedding from bf16 rounding (a checkpoint whose attention
were nearly uniform would not: any rotation leaves uniform scores as they are), so the step's
pass on a GPU means RoPE and the KV heads' mapping are right there; the draft model on the device
(--draft-device device) gives the tokens of the run without speculation."""
import importlib.util
import json
import os
import shutil
import subprocess

BUILD = os.environ.get("LTM_BUILD_DIR", "build")
SOURCE = os.environ.get("LTM_SOURCE_DIR", ".")
WORKER = os.path.join(BUILD, "launcher", "ltm-worker")
SCRIPT = os.path.join(SOURCE, "scripts", "lib", "gpu_check_model.py")


def load_script():
    spec = importlib.util.spec_from_file_location("gpu_check_model", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_model_step_passes_on_the_emulated_device(tmp_path):
    env = dict(os.environ, OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1")
    p = subprocess.run(["/usr/bin/python3", SCRIPT, WORKER, str(tmp_path), "devsim"],
                       capture_output=True, text=True, timeout=300, env=env)
    results = [line for line in p.stdout.splitlines() if line.startswith("result:")]
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
    assert len(results) == 3, results
    assert results[0].startswith("result: gpt2: 32 greedy tokens identical"), results
    assert results[1].startswith("result: qwen2: 32 greedy tokens identical"), results
    assert results[2].startswith("result: draft on the device: 32 greedy tokens identical"), results
    assert "; on devsim (emulated device" in results[2], results


def test_the_qwen2_checkpoint_tells_a_wrong_rope_from_rounding(tmp_path):
    m = load_script()
    model = str(tmp_path / "qwen2")
    m.make_qwen2_model(model)
    wrong = str(tmp_path / "qwen2_wrong_rope")
    shutil.copytree(model, wrong)
    with open(os.path.join(wrong, "config.json")) as f:
        config = json.load(f)
    config["rope_theta"] = 500000.0  # another rotation: what a wrong RoPE kernel would give
    with open(os.path.join(wrong, "config.json"), "w") as f:
        json.dump(config, f)
    logits = {}
    for name, folder, dtype in (("ref", model, "f32"), ("bf16", model, "bf16"),
                                ("wrong", wrong, "f32")):
        path = str(tmp_path / f"{name}.npy")
        m.run(WORKER, folder, "cpu", dtype, path)
        logits[name] = m.read_npy(path)
    (n, v), ref = logits["ref"]
    rounding = m.logit_gap(ref, logits["bf16"][1], v, n)[0]
    wrong_rope = m.logit_gap(ref, logits["wrong"][1], v, n)[0]
    print(f"bf16 weights and cache: {rounding:.4f}; another rope_theta: {wrong_rope:.4f} "
          f"(tolerance {m.TOL_REL})")
    assert rounding < m.TOL_REL
    assert wrong_rope > 3 * m.TOL_REL
