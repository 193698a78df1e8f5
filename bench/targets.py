#!/usr/bin/env python3
"""The GPU engine's performance targets, read off one bench/gpu_check.sh run.

    python3 bench/targets.py WORK

WORK is gpu_check.sh's working folder: bench-<model>.log (compare_hf.py's JSON lines, or
`reinforge bench`'s alone) and the quickstart runs' metrics.jsonl. Prints one line per target:
what was measured, the bound, and "met", "MISSED" or "not measured" (with why), so the first
look at a GPU run's SUMMARY.txt says where the engine stands. The targets (one H100, measured
side by side in one run):

- rollout, 64 × 512 new tokens: ≥ 10× HF generate; each decode step at ≥ 50 % of the HBM
  roofline (bytes of weights + KV cache a step reads ÷ 3 TB/s);
- train step (forward, backward, AdamW; 16 × 1024 tokens packed): ≥ 1.2× PyTorch; MFU ≥ 40 %
  on Qwen2.5-1.5B's shape;
- weight sync (actor → rollout, same process) < 1 % of the training step.
"""
import json
import os
import sys

ROLLOUT_SPEEDUP = 10.0
ROOFLINE = 0.5
TRAIN_SPEEDUP = 1.2
MFU = 0.40
SYNC_SHARE = 0.01
# Which bench part measured which model (gpu_check.sh's tags), and whether the MFU target
# applies to it.
MODELS = (("smollm2", "SmolLM2-135M", False), ("qwen", "Qwen2.5-1.5B shape", True))


def json_lines(path):
    """Every line of `path` that is a JSON object (a log mixes them with progress text)."""
    out = []
    try:
        # A log cut to its last 2 MB may start inside a UTF-8 character.
        with open(path, encoding="utf-8", errors="replace") as f:
            for line in f:
                line = line.strip()
                if line.startswith("{"):
                    try:
                        out.append(json.loads(line))
                    except ValueError:
                        pass
    except OSError:
        pass
    return out


def verdict(value, bound, at_least=True, fmt="{:.2f}"):
    if value is None:
        return None
    ok = value >= bound if at_least else value < bound
    return f"{fmt.format(value)} ({'≥' if at_least else '<'} {fmt.format(bound)}: {'met' if ok else 'MISSED'})"


def line(what, result, why):
    print(f"  {what:<52} {result if result is not None else 'not measured (' + why + ')'}")


def bench_targets(work, tag, name, mfu_applies):
    rows = json_lines(os.path.join(work, f"bench-{tag}.log"))
    if not rows:
        line(f"{name}: all", None, f"no bench-{tag}.log results: see SUMMARY's part line")
        return
    compare = next((r for r in reversed(rows) if r.get("bench") == "compare"), None)
    # The first of Reinforge's results per bench: when PyTorch needed gradient checkpointing,
    # compare_hf.py runs Reinforge's train step again with it, whose MFU (recomputation is
    # not counted as useful work) and memory are not the ones the targets are about.
    ours = {b: next((r for r in rows if r.get("bench") == b and r.get("impl") == "reinforge"), None) for b in ("rollout", "train")}
    for bench in ("rollout", "train"):
        entry = (compare or {}).get(bench) or {}
        mine = ours[bench] or {}
        ratio = entry.get("ratio")
        why = entry.get("reinforge_error") or entry.get("pytorch_error") or (
            "no PyTorch side in this run" if compare is None else f"no {bench} comparison in bench-{tag}.log" if not entry else "a side gave no speed")
        if bench == "rollout":
            line(f"{name}: rollout vs HF generate", verdict(ratio, ROLLOUT_SPEEDUP, fmt="{:.2f}×"), why)
            frac = mine.get("hbm_roofline_fraction_3tbs")
            line(f"{name}: decode step, fraction of 3 TB/s", verdict(frac, ROOFLINE), "no Reinforge rollout result" if not mine else "not on a GPU")
            if mine.get("hbm_roofline_fraction") is not None:
                line(f"{name}:   (of this GPU's datasheet bandwidth)", f"{mine['hbm_roofline_fraction']:.2f}", "")
        else:
            label = f"{name}: train step vs PyTorch"
            if entry.get("reinforge_gradient_checkpointing"):
                label += " (both recompute)"
            line(label, verdict(ratio, TRAIN_SPEEDUP, fmt="{:.2f}×"), why)
            if entry.get("ratio_without_recompute") is not None:
                line(f"{name}:   (Reinforge without recompute)", f"{entry['ratio_without_recompute']:.2f}×", "")
            if mfu_applies:
                mfu = entry.get("reinforge_mfu", mine.get("mfu"))
                line(f"{name}: MFU", verdict(mfu, MFU), "no Reinforge train result" if not mine else "no bf16 peak known for this GPU")
            peak = mine.get("peak_device_memory_gb")
            if peak is not None:
                theirs = entry.get("pytorch_peak_device_memory_gb")
                line(f"{name}: train peak memory (GB)", f"{peak:.2f}" + (f" (PyTorch {theirs:.2f})" if theirs else ""), "")


def sync_target(work):
    for run in ("quickstart-cuda", "train-decode-cuda"):
        rows = json_lines(os.path.join(work, run, "metrics.jsonl"))
        pairs = [(r["timing_s/update_weights"], r["timing_s/step"]) for r in rows
                 if r.get("timing_s/update_weights") is not None and r.get("timing_s/step")]
        if not pairs:
            line(f"weight sync share of the step ({run})", None, "no metrics")
            continue
        shares = sorted(s / t for s, t in pairs)
        line(f"weight sync share of the step ({run})", verdict(shares[len(shares) // 2], SYNC_SHARE, at_least=False, fmt="{:.2%}"), "")


def main():
    if len(sys.argv) != 2:
        print("usage: bench/targets.py WORK (bench/gpu_check.sh's working folder)", file=sys.stderr)
        return 2
    work = sys.argv[1]
    print("targets (medians of the timed runs):")
    for tag, name, mfu_applies in MODELS:
        bench_targets(work, tag, name, mfu_applies)
    sync_target(work)
    return 0


if __name__ == "__main__":
    sys.exit(main())
