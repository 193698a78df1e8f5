"""Writes policy_loss_modes.json: verl 0.9.1's own policy losses (every `loss_mode` Reinforge
implements), run in float64 torch, with the loss, the metrics verl logs and the gradient of the
loss in `log_prob` from torch autograd. tests/policy_loss_modes.rs checks burn_ops::policy_loss
against it.

Run once, where torch is installed (CI does not install it); verl's package is imported as it
ships, its dependencies only as far as `verl.trainer.ppo.core_algos` needs them:
    python3 -m venv /tmp/tv && /tmp/tv/bin/pip install torch numpy omegaconf packaging ray \
        tensordict transformers codetiming orjson && /tmp/tv/bin/pip install --no-deps verl==0.9.1
    /tmp/tv/bin/python make_policy_loss_golden.py > policy_loss_modes.json
"""
import json
import math
import random

import torch
import verl
from verl.trainer.ppo.core_algos import get_policy_loss_fn
from verl.workers.config import FSDPActorConfig, PolicyLossConfig

B, T = 4, 6
# A padded tail, a gap, one empty row, one full row.
MASK = [
    [1, 1, 1, 1, 0, 0],
    [1, 0, 1, 1, 1, 1],
    [0, 0, 0, 0, 0, 0],
    [1, 1, 1, 1, 1, 1],
]
MASK_NO_EMPTY = [MASK[0], MASK[1], [1, 1, 1, 0, 0, 0], MASK[3]]


def inputs(seed, mask, on_policy=False, seq_adv=False, spread=1.0):
    """Log-probs away from the clip kinks (finite differences and ties stay meaningful)."""
    rng = random.Random(seed)
    old = [[rng.uniform(-2.5, -0.1) for _ in range(T)] for _ in range(B)]
    lp = []
    for row in old:
        out = []
        for o in row:
            if on_policy:
                out.append(o)
                continue
            while True:
                r = rng.uniform(-0.9, 0.9) * spread
                if all(abs(r - k) > 0.02 for k in (math.log(0.8), math.log(1.2), math.log(0.9), math.log(1.28))):
                    break
            out.append(min(o + r, -1e-3))
        lp.append(out)
    adv = []
    for _ in range(B):
        a = rng.uniform(0.2, 2.0) * (1 if rng.random() < 0.5 else -1)
        adv.append([a if seq_adv else a * rng.uniform(0.5, 1.5) for _ in range(T)])
    weights = [[rng.uniform(0.5, 1.5) for _ in range(T)] for _ in range(B)]
    return old, lp, adv, weights


def run(mode, agg, cfg_kw, policy_kw, gbi, old, lp, adv, mask, weights):
    config = FSDPActorConfig(
        rollout_n=1,
        ppo_micro_batch_size_per_gpu=1,
        policy_loss=PolicyLossConfig(loss_mode=mode, **policy_kw),
        global_batch_info=gbi,
        **cfg_kw,
    )
    t = lambda x: torch.tensor(x, dtype=torch.float64)
    lp_t = t(lp).requires_grad_(True)
    w = t(weights) if weights is not None else None
    loss, metrics = get_policy_loss_fn(mode)(
        old_log_prob=t(old),
        log_prob=lp_t,
        advantages=t(adv),
        response_mask=t(mask),
        loss_agg_mode=agg,
        config=config,
        rollout_is_weights=w,
    )
    loss.backward()
    return {
        "loss": loss.item(),
        "metrics": {k.split("/")[-1]: float(v) for k, v in metrics.items()},
        "grad": lp_t.grad.tolist(),
    }


def cases():
    seed = 0
    full = {"dp_size": 2, "batch_num_tokens": 30, "global_batch_size": 6}
    plain = {}
    asym = {"clip_ratio": 0.2, "clip_ratio_low": 0.1, "clip_ratio_high": 0.28, "clip_ratio_c": 2.0}
    sym = {"clip_ratio": 0.2}
    modes = [
        ("vanilla", [sym, asym], [{}]),
        ("dppo_tv", [{"clip_ratio": 0.05}, {"clip_ratio": 0.1, "clip_ratio_low": 0.02, "clip_ratio_high": 0.15, "clip_ratio_c": 1.05}], [{}]),
        ("dppo_kl", [{"clip_ratio": 0.02}, {"clip_ratio": 0.05, "clip_ratio_low": 0.01, "clip_ratio_high": 0.08, "clip_ratio_c": 1.05}], [{}]),
        ("gspo", [sym, {"clip_ratio": 0.2, "clip_ratio_low": 0.0003, "clip_ratio_high": 0.0004}], [{}]),
        ("sapo", [{"tau_pos": 1.0, "tau_neg": 1.05}, {"tau_pos": 2.0, "tau_neg": 4.0}], [{}]),
        ("gpg", [sym], [{}]),
        ("clip_cov", [sym, asym], [{"clip_cov_ratio": 1.0, "clip_cov_lb": -0.5, "clip_cov_ub": 0.5}, {"clip_cov_ratio": 1.0, "clip_cov_lb": 0.05, "clip_cov_ub": 5.0}]),
        ("kl_cov", [sym], [{"kl_cov_ratio": 0.0002, "ppo_kl_coef": 0.1}, {"kl_cov_ratio": 0.3, "ppo_kl_coef": 1.0}]),
        ("geo_mean", [sym, asym], [{}]),
        ("dro", [sym], [{"dro_beta": 0.5}, {"dro_beta": 2.0}]),
        ("cispo", [sym, asym], [{}]),
    ]
    for mode, cfgs, pols in modes:
        for ci, cfg_kw in enumerate(cfgs):
            # verl's own defaults for these are 0.2, not `clip_ratio`: say them every time.
            cfg_kw = {"clip_ratio_low": cfg_kw.get("clip_ratio", 0.2), "clip_ratio_high": cfg_kw.get("clip_ratio", 0.2), **cfg_kw}
            for pi, policy_kw in enumerate(pols):
                for agg in ["token-mean", "seq-mean-token-mean", "seq-mean-token-sum-norm"]:
                    for gbi in [plain, full]:
                        for weighted in [False, True]:
                            for on_policy in [False, True]:
                                if on_policy and (weighted or gbi or agg != "token-mean"):
                                    continue
                                if mode == "geo_mean" and (agg != "token-mean" or gbi):
                                    continue  # geo_mean ignores both
                                seed += 1
                                mask = MASK if agg != "seq-mean-token-sum-norm" else MASK_NO_EMPTY
                                # Small moves keep DPPO's divergence checks on both sides.
                                spread = 0.15 if mode.startswith("dppo") else 1.0
                                old, lp, adv, w = inputs(seed, mask, on_policy, mode == "geo_mean", spread)
                                weights = w if weighted else None
                                out = run(mode, agg, cfg_kw, policy_kw, gbi, old, lp, adv, mask, weights)
                                yield {
                                    "id": f"{mode}-{seed:03d}",
                                    "loss_mode": mode,
                                    "params": {"loss_agg_mode": agg, **cfg_kw, **policy_kw, **gbi},
                                    "inputs": {
                                        "old_log_prob": old,
                                        "log_prob": lp,
                                        "advantages": adv,
                                        "response_mask": mask,
                                        "rollout_is_weights": weights,
                                    },
                                    "expected": out,
                                }


def near_certain():
    """Probabilities that round to 1 in float32 (confident tokens): DPPO's divergences must
    stay finite there, as verl's 1e-8 keeps them."""
    old = [[0.0, -1e-9, -1e-4, -0.5, -1.0, -2.0]] * 2 + [[-1e-9, 0.0, -0.3, -1e-4, -0.7, -1.5]] * 2
    lp = [[-1e-3, -2e-3, -1e-9, -0.45, -1.1, -1.9]] * 2 + [[-3e-3, -1e-9, -0.2, -1e-3, -0.75, -1.4]] * 2
    adv = [[-1.0] * T, [1.0] * T, [0.7] * T, [-0.4] * T]
    mask = [[1] * T] * B
    for mode in ["dppo_kl", "dppo_tv"]:
        cfg_kw = {"clip_ratio": 0.05, "clip_ratio_low": 0.05, "clip_ratio_high": 0.05}
        out = run(mode, "token-mean", cfg_kw, {}, {}, old, lp, adv, mask, None)
        yield {
            "id": f"{mode}-near-certain",
            "loss_mode": mode,
            "params": {"loss_agg_mode": "token-mean", **cfg_kw},
            "inputs": {"old_log_prob": old, "log_prob": lp, "advantages": adv, "response_mask": mask, "rollout_is_weights": None},
            "expected": out,
        }


doc = {
    "reference": f"verl {verl.__version__} verl/trainer/ppo/core_algos.py, torch {torch.__version__}, float64",
    "cases": list(cases()) + list(near_certain()),
}
print(json.dumps(doc, indent=None))
