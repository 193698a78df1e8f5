"""Writes the LoRA golden data under lora/<model>/, with Hugging Face PEFT as the
independent reference for the engine's LoRA (adapter loading, forward, gradients,
clip + AdamW step, merge).

For each tiny fixture model (tiny-llama, tiny-qwen2; hidden 64, vocab 256, float32):
  lora/<model>/adapter_config.json, adapter_model.safetensors
      the adapter exactly as PEFT's save_pretrained writes it (lora_B randomised so
      the adapter is not a no-op);
  lora/<model>/golden.json
      seqs, temperature, per-position coefficients a and b, the PEFT model's
      log-probs and entropies (softmax(logits / temperature), each sequence run
      alone), loss = sum a*logprob + b*entropy, its gradients w.r.t. every lora_A /
      lora_B tensor, one clip_grad_norm_(1.0) + AdamW step ("step"), merged weights
      and merged-model logits from merge_and_unload() of the saved adapter
      ("merged"), and the base model's log-probs of seqs[0] ("base_logprobs_seq0").

Regenerate (CI does not install torch/peft), from this directory:
    pip install torch transformers peft
    python make_lora_golden.py [FIXTURE_MODELS_DIR]
FIXTURE_MODELS_DIR defaults to /work/shared/fixtures/models (holding tiny-llama/ and
tiny-qwen2/, each config.json + model.safetensors).
"""
import json
import math
import os
import random
import sys

import peft
import torch
import transformers
from peft import LoraConfig, PeftModel, get_peft_model
from safetensors import safe_open
from transformers import AutoModelForCausalLM

HERE = os.path.dirname(os.path.abspath(__file__))
MODELS_DIR = sys.argv[1] if len(sys.argv) > 1 else "/work/shared/fixtures/models"
OUT_ROOT = os.path.join(HERE, "lora")

TEMPERATURE = 1.3
SEQ_LENS = [7, 12, 5]
LR, BETAS, EPS, WEIGHT_DECAY, MAX_NORM = 1e-2, (0.9, 0.999), 1e-8, 0.01, 1.0
MERGED_WEIGHTS = ["model.layers.0.self_attn.q_proj.weight", "model.layers.1.mlp.down_proj.weight"]

MODELS = {
    "tiny-llama": dict(
        seed=0,
        config=dict(r=4, lora_alpha=8, target_modules="all-linear", lora_dropout=0.0, bias="none", task_type="CAUSAL_LM"),
    ),
    "tiny-qwen2": dict(
        seed=1,
        config=dict(
            r=2, lora_alpha=6, target_modules=["q_proj", "v_proj", "down_proj"], lora_dropout=0.0, bias="none", task_type="CAUSAL_LM"
        ),
    ),
}

PREFIX = "base_model.model."


def load_base(model_dir):
    m = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32, attn_implementation="eager")
    m.eval()
    return m


def tensor_json(t):
    t = t.detach().to(torch.float64).cpu().contiguous()
    return {"shape": list(t.shape), "data": [float(x) for x in t.reshape(-1).tolist()]}


def logits_of(model, seq):
    ids = torch.tensor([seq], dtype=torch.long)
    out = model(input_ids=ids, attention_mask=torch.ones_like(ids), use_cache=False)
    return out.logits[0]  # [len, vocab], float32


def logprobs_entropy(model, seq, temperature):
    """Per position t >= 1: log p(seq[t] | seq[<t]) and entropy of the predictive
    distribution at t-1, under softmax(logits / temperature), in float64."""
    logits = logits_of(model, seq).to(torch.float64)[:-1] / temperature  # predicts seq[1:]
    logp = torch.log_softmax(logits, dim=-1)
    target = torch.tensor(seq[1:], dtype=torch.long)
    lp = logp.gather(-1, target[:, None])[:, 0]
    ent = -(logp.exp() * logp).sum(-1)
    return lp, ent


def lora_name(peft_name):
    assert peft_name.startswith(PREFIX), peft_name
    return peft_name[len(PREFIX):]


def make(name, spec):
    model_dir = os.path.join(MODELS_DIR, name)
    out_dir = os.path.join(OUT_ROOT, name)
    os.makedirs(out_dir, exist_ok=True)

    # --- build the adapter, randomise lora_B, save ---------------------------------
    base = load_base(model_dir)
    torch.manual_seed(spec["seed"])
    model = get_peft_model(base, LoraConfig(**spec["config"]))
    model.eval()
    with torch.no_grad():
        for n, p in model.named_parameters():
            if "lora_B" in n:
                p.copy_(torch.randn_like(p) * 0.05)
    print(f"== {name}: peft scaling per module:",
          sorted({float(m.scaling["default"]) for m in model.modules() if hasattr(m, "scaling") and isinstance(m.scaling, dict)}))
    targeted = sorted({n for n, m in model.named_modules() if hasattr(m, "lora_A") and isinstance(m.lora_A, torch.nn.ModuleDict)})
    print(f"   targeted modules ({len(targeted)}):", targeted)
    print("   resolved target_modules:", sorted(model.peft_config["default"].target_modules))
    model.save_pretrained(out_dir)
    # save_pretrained also writes a model card (README.md); the tests do not need it.
    if os.path.exists(os.path.join(out_dir, "README.md")):
        os.remove(os.path.join(out_dir, "README.md"))

    r = spec["config"]["r"]
    with safe_open(os.path.join(out_dir, "adapter_model.safetensors"), "pt") as f:
        keys = sorted(f.keys())
        print(f"   adapter_model.safetensors ({len(keys)} tensors):")
        for k in keys:
            t = f.get_tensor(k)
            print(f"     {k} {list(t.shape)} {t.dtype}")
            assert k.startswith(PREFIX + "model.layers."), k
            assert k.endswith(".lora_A.weight") or k.endswith(".lora_B.weight"), k
            if k.endswith(".lora_A.weight"):
                assert t.shape[0] == r, (k, t.shape)
            else:
                assert t.shape[1] == r, (k, t.shape)
    with open(os.path.join(out_dir, "adapter_config.json")) as f:
        print("   adapter_config.json:", f.read())

    # --- inputs ----------------------------------------------------------------
    rng = random.Random(7)
    seqs = [[rng.randint(3, 255) for _ in range(n)] for n in SEQ_LENS]
    crng = random.Random(11)
    a = [[round(crng.uniform(-1, 1), 4) for _ in range(len(s) - 1)] for s in seqs]
    b = [[round(crng.uniform(-1, 1), 4) for _ in range(len(s) - 1)] for s in seqs]

    # --- trainable params ------------------------------------------------------
    trainable = [(n, p) for n, p in model.named_parameters() if p.requires_grad]
    for n, p in model.named_parameters():
        if "lora_A" not in n and "lora_B" not in n:
            assert not p.requires_grad, f"base parameter requires grad: {n}"
    assert all(("lora_A" in n or "lora_B" in n) for n, _ in trainable)
    # named_parameters carries ".default" (adapter name); the saved keys do not.
    def grad_key(n):
        return lora_name(n).replace(".lora_A.default.", ".lora_A.").replace(".lora_B.default.", ".lora_B.")
    assert sorted(PREFIX + grad_key(n) for n, _ in trainable) == keys

    # --- loss, grads -----------------------------------------------------------
    model.zero_grad(set_to_none=True)
    loss = torch.zeros((), dtype=torch.float64)
    all_lp, all_ent = [], []
    for i, s in enumerate(seqs):
        lp, ent = logprobs_entropy(model, s, TEMPERATURE)
        all_lp.append([float(x) for x in lp.tolist()])
        all_ent.append([float(x) for x in ent.tolist()])
        ai = torch.tensor(a[i], dtype=torch.float64)
        bi = torch.tensor(b[i], dtype=torch.float64)
        loss = loss + (ai * lp).sum() + (bi * ent).sum()
    loss.backward()
    grads = {grad_key(n): tensor_json(p.grad) for n, p in trainable}
    print(f"   loss = {loss.item():.10g}")

    # --- one optimizer step ----------------------------------------------------
    params = [p for _, p in trainable]
    grad_norm = torch.nn.utils.clip_grad_norm_(params, max_norm=MAX_NORM)
    opt = torch.optim.AdamW(params, lr=LR, betas=BETAS, eps=EPS, weight_decay=WEIGHT_DECAY)
    opt.step()
    updated = {grad_key(n): tensor_json(p) for n, p in trainable}
    print(f"   grad_norm (pre-clip) = {grad_norm.item():.10g}")

    # --- unmerged logits of seq0 from the saved adapter, then merge ------------
    with torch.no_grad():
        reloaded = PeftModel.from_pretrained(load_base(model_dir), out_dir)
        reloaded.eval()
        unmerged_logits = logits_of(reloaded, seqs[0]).clone()
        # The reloaded (saved, pre-step) adapter reproduces the log-probs computed before saving.
        re_lp, _ = logprobs_entropy(reloaded, seqs[0], TEMPERATURE)
        assert max(abs(x - y) for x, y in zip(re_lp.tolist(), all_lp[0])) < 1e-6
        merged_model = reloaded.merge_and_unload()
        merged_model.eval()
        sd = merged_model.state_dict()
        merged = {k: tensor_json(sd[k]) for k in MERGED_WEIGHTS}
        merged_logits = logits_of(merged_model, seqs[0])
        diff = (merged_logits - unmerged_logits).abs().max().item()
        print(f"   merged vs unmerged logits max |diff| = {diff:.3g}")
        assert diff <= 1e-5, diff

        base_model = load_base(model_dir)
        base_lp, _ = logprobs_entropy(base_model, seqs[0], TEMPERATURE)
        # The adapter changes things.
        assert max(abs(x - y) for x, y in zip(base_lp.tolist(), all_lp[0])) > 1e-4

    golden = {
        "about": f"{name} + LoRA by peft {peft.__version__}, transformers {transformers.__version__}, "
        f"torch {torch.__version__} (make_lora_golden.py)",
        "lora_config": {k: v for k, v in spec["config"].items()},
        "scaling": spec["config"]["lora_alpha"] / spec["config"]["r"],
        "seqs": seqs,
        "temperature": TEMPERATURE,
        "a": a,
        "b": b,
        "logprobs": all_lp,
        "entropy": all_ent,
        "loss": float(loss.item()),
        "grads": grads,
        "step": {
            "lr": LR,
            "betas": list(BETAS),
            "eps": EPS,
            "weight_decay": WEIGHT_DECAY,
            "max_norm": MAX_NORM,
            "grad_norm": float(grad_norm.item()),
            "updated": updated,
        },
        "merged": merged,
        "merged_logits_seq0": {"shape": list(merged_logits.shape), "data": [float(x) for x in merged_logits.reshape(-1).tolist()]},
        "base_logprobs_seq0": [float(x) for x in base_lp.tolist()],
    }
    with open(os.path.join(out_dir, "golden.json"), "w") as f:
        json.dump(golden, f)
    for fn in sorted(os.listdir(out_dir)):
        print(f"   wrote {os.path.join(out_dir, fn)} ({os.path.getsize(os.path.join(out_dir, fn))} bytes)")


if __name__ == "__main__":
    # With target_modules="all-linear", PEFT stores the resolved module names in
    # adapter_config.json in set order, which depends on string hashing: pin it so
    # reruns write identical files.
    if os.environ.get("PYTHONHASHSEED") != "0":
        os.environ["PYTHONHASHSEED"] = "0"
        os.execv(sys.executable, [sys.executable] + sys.argv)
    torch.set_num_threads(1)
    for name, spec in MODELS.items():
        make(name, spec)
