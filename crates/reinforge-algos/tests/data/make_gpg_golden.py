"""Writes gpg_advantage.json: verl 0.9.1's compute_gpg_outcome_advantage (float64) on a few
batches, the reference tests/gpg_advantage.rs checks compute_gpg_outcome_advantage against.

Run once, in the environment make_policy_loss_golden.py describes:
    /tmp/tv/bin/python make_gpg_golden.py > gpg_advantage.json
"""
import json
import random

import numpy as np
import torch
import verl
from verl.trainer.ppo.core_algos import compute_gpg_outcome_advantage


def case(seed, b, t, groups, zero_share):
    rng = random.Random(seed)
    index = [f"p{rng.randrange(groups)}" for _ in range(b)]
    mask = [[1 if j < rng.randint(1, t) else 0 for j in range(t)] for _ in range(b)]
    rewards = [[0.0] * t for _ in range(b)]
    for i in range(b):
        last = max(j for j in range(t) if mask[i][j]) if any(mask[i]) else t - 1
        rewards[i][last] = 0.0 if rng.random() < zero_share else rng.choice([1.0, -0.5, rng.uniform(-2, 2)])
    adv, ret = compute_gpg_outcome_advantage(
        token_level_rewards=torch.tensor(rewards, dtype=torch.float64),
        response_mask=torch.tensor(mask, dtype=torch.float64),
        index=np.array(index, dtype=object),
    )
    return {
        "id": f"gpg-{seed:02d}",
        "inputs": {"token_level_rewards": rewards, "response_mask": mask, "index": index},
        "expected": {"advantages": adv.tolist(), "returns": ret.tolist()},
    }


cases = [case(s, b, t, g, z) for s, (b, t, g, z) in enumerate([(6, 4, 2, 0.3), (8, 5, 3, 0.5), (5, 3, 5, 0.0), (9, 4, 3, 0.9), (4, 3, 1, 1.0)])]
print(json.dumps({"reference": f"verl {verl.__version__} compute_gpg_outcome_advantage, float64", "cases": cases}))
