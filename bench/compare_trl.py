#!/usr/bin/env python3
"""The whole GRPO step, Reinforge against TRL's GRPOTrainer, on the same machine and settings.

  model:   SmolLM2-135M-Instruct, f32, CPU
  data:    Countdown puzzles from `reinforge data gen countdown --max-number 10` (one parquet,
           verl's schema: a chat `prompt` column), the same rows in the same order on both sides
  step:    4 prompts x 4 samples, 64 new tokens, temperature 1, top-p 1; GRPO advantages;
           KL loss to the reference, coefficient 0.001 (Reinforge: low_var_kl; TRL: its k3,
           beta=0.001); lr 1e-6; one mini-batch, one epoch (TRL: num_iterations=1)
  reward:  Countdown's (format + correct equation) on both sides

Reinforge runs first (`reinforge train`, seconds per step from its `timing_s/step`), then TRL
(wall time between `on_step_begin` and `on_step_end`, generation and scoring included). One
JSON line per step and a summary line with the median seconds per step of each and the ratio
TRL / Reinforge (above 1: Reinforge is faster). Steps after the first are the ones to compare
(the first includes one-time work on both sides).

  python3 bench/compare_trl.py --reinforge target/release/reinforge \
      --model ~/.cache/reinforge/models/smollm2-135m-instruct --steps 3

Needs torch, transformers, trl, datasets (see bench/README.md); without them it exits 2 with a
one-line hint.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import re
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path


def cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def countdown_reward(text: str, numbers: list[int], target: int) -> float:
    """TinyZero's Countdown score, as Reinforge's `countdown` reward: 0 without an
    <answer>, 0.1 for a well-formed but wrong equation, 1 when it uses each number once and
    equals the target."""
    found = re.findall(r"<answer>(.*?)</answer>", text, re.S)
    if not found:
        return 0.0
    eq = found[-1].strip()
    if not re.fullmatch(r"[\d+\-*/() .]+", eq):
        return 0.1
    used = sorted(int(n) for n in re.findall(r"\d+", eq))
    if used != sorted(numbers):
        return 0.1
    try:
        value = eval(eq, {"__builtins__": {}}, {})  # noqa: S307 - digits and operators only
    except Exception:
        return 0.1
    return 1.0 if abs(value - target) < 1e-5 else 0.1


def run_reinforge(args, data: Path, work: Path) -> list[float]:
    cfg = work / "reinforge.toml"
    cfg.write_text(
        f"""
[data]
train_files = ["{data}"]
max_prompt_length = 256
max_response_length = {args.max_new_tokens}
train_batch_size = {args.prompts}
shuffle = false

[actor]
model = "{args.model}"
lr = 1e-6
ppo_mini_batch_size = {args.prompts}
ppo_micro_batch_size = {args.prompts * args.n}
ppo_epochs = 1
use_kl_loss = true
kl_loss_coef = 0.001
kl_loss_type = "low_var_kl"

[rollout]
n = {args.n}
temperature = 1.0

[reward]
kind = "countdown"

[algorithm]
adv_estimator = "grpo"

[trainer]
default_local_dir = "{work / 'reinforge-run'}"
total_steps = {args.steps}
save_freq = 0
test_freq = 0
val_before_train = false
logger = ["jsonl"]
dashboard = false
"""
    )
    t = time.time()
    subprocess.run([args.reinforge, "train", str(cfg), *args.set, "--resume", "none"], check=True, stdout=sys.stderr)
    print(f"reinforge: {args.steps} steps in {time.time() - t:.1f}s (model load included)", file=sys.stderr)
    rows = [json.loads(l) for l in (work / "reinforge-run" / "metrics.jsonl").read_text().splitlines()]
    for i, r in enumerate(rows):
        phases = {k.removeprefix("timing_s/"): round(v, 2) for k, v in r.items() if k.startswith("timing_s/") and k != "timing_s/step"}
        print(f"reinforge: step {i + 1}: {r['timing_s/step']:.1f}s {phases}", file=sys.stderr)
    return [r["timing_s/step"] for r in rows]


def run_trl(args, data: Path) -> list[float]:
    try:
        import torch
        from datasets import Dataset
        from transformers import AutoModelForCausalLM, AutoTokenizer, TrainerCallback
        from trl import GRPOConfig, GRPOTrainer
    except ImportError as e:
        print(f"error: {e}: install torch, transformers, trl and datasets (bench/README.md)", file=sys.stderr)
        sys.exit(2)
    import pyarrow.parquet as pq

    torch.manual_seed(0)
    table = pq.read_table(data).to_pylist()
    rows = []
    for r in table:
        gt = r["reward_model"]["ground_truth"]
        gt = json.loads(gt) if isinstance(gt, str) else gt
        rows.append({"prompt": [dict(m) for m in r["prompt"]], "numbers": list(gt["numbers"]), "target": int(gt["target"])})
    ds = Dataset.from_list(rows)

    def reward(completions, numbers, target, **_):
        texts = [c[-1]["content"] if isinstance(c, list) else c for c in completions]
        return [countdown_reward(t, n, g) for t, n, g in zip(texts, numbers, target)]

    times: list[float] = []

    class StepTimer(TrainerCallback):
        def on_step_begin(self, *_, **__):
            self.t = time.perf_counter()

        def on_step_end(self, *_, **__):
            times.append(time.perf_counter() - self.t)
            print(f"trl: step {len(times)}: {times[-1]:.1f}s", file=sys.stderr)

    with tempfile.TemporaryDirectory() as out:
        config = GRPOConfig(
            output_dir=out,
            use_cpu=True,
            bf16=False,
            fp16=False,
            learning_rate=1e-6,
            beta=0.001,
            num_generations=args.n,
            per_device_train_batch_size=args.prompts * args.n,
            gradient_accumulation_steps=1,
            num_iterations=1,
            max_completion_length=args.max_new_tokens,
            temperature=1.0,
            top_p=1.0,
            max_steps=args.steps,
            logging_steps=1,
            save_strategy="no",
            report_to=[],
            shuffle_dataset=False,
            seed=0,
            # TRL turns it on by default; Reinforge keeps activations (actor.gradient_checkpointing
            # = false), so the like-for-like step keeps them too. --trl-gradient-checkpointing
            # measures TRL's default.
            gradient_checkpointing=args.trl_gradient_checkpointing,
        )
        model = AutoModelForCausalLM.from_pretrained(args.model, torch_dtype=torch.float32)
        tok = AutoTokenizer.from_pretrained(args.model)
        trainer = GRPOTrainer(model=model, reward_funcs=reward, args=config, train_dataset=ds, processing_class=tok, callbacks=[StepTimer()])
        trainer.train()
    return times


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--reinforge", required=True, help="the reinforge binary")
    p.add_argument("--model", default=os.path.expanduser("~/.cache/reinforge/models/smollm2-135m-instruct"))
    p.add_argument("--steps", type=int, default=3)
    p.add_argument("--prompts", type=int, default=4)
    p.add_argument("--n", type=int, default=4, help="samples per prompt")
    p.add_argument("--max-new-tokens", type=int, default=64)
    p.add_argument("--only", choices=["reinforge", "trl"], help="run one side")
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                   help="a config override for Reinforge's side, e.g. actor.share_prompts=false (repeatable)")
    p.add_argument("--trl-gradient-checkpointing", action="store_true", help="TRL's default (off here: Reinforge does not checkpoint)")
    args = p.parse_args()
    if not Path(args.model, "config.json").exists():
        print(f"error: no model at {args.model}: `reinforge model fetch smollm2-135m-instruct` or pass --model DIR", file=sys.stderr)
        sys.exit(2)
    with tempfile.TemporaryDirectory() as w:
        work = Path(w)
        data = work / "countdown.parquet"
        subprocess.run(
            [args.reinforge, "data", "gen", "countdown", "--n", str(args.prompts * args.steps), "--seed", "1", "--max-number", "10", "--out", str(data)],
            check=True,
            stdout=sys.stderr,
        )
        ours = run_reinforge(args, data, work) if args.only != "trl" else []
        theirs = run_trl(args, data) if args.only != "reinforge" else []
    for i in range(max(len(ours), len(theirs))):
        print(json.dumps({"step": i + 1, "reinforge_s": ours[i] if i < len(ours) else None, "trl_s": theirs[i] if i < len(theirs) else None}))
    later = lambda xs: xs[1:] if len(xs) > 1 else xs  # noqa: E731
    summary = {
        "cpu": cpu_model(),
        "isa": os.environ.get("REINFORGE_ISA", "auto"),
        "settings": {"prompts": args.prompts, "n": args.n, "max_new_tokens": args.max_new_tokens, "steps": args.steps, "trl_gradient_checkpointing": args.trl_gradient_checkpointing, "reinforge_overrides": args.set},
    }
    if ours:
        summary["reinforge_s_per_step"] = statistics.median(later(ours))
    if theirs:
        summary["trl_s_per_step"] = statistics.median(later(theirs))
    if ours and theirs:
        summary["ratio"] = summary["trl_s_per_step"] / summary["reinforge_s_per_step"]
    print(json.dumps(summary))


if __name__ == "__main__":
    main()
