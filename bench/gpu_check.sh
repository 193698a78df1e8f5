#!/usr/bin/env bash
# Everything that needs a GPU, in one go, results under OUT: the CUDA engine's self-test
# against the CPU engine, a GRPO quickstart run on the GPU beside the same run on the CPU, and
# the benchmarks against PyTorch (rollout 64 × 512 new tokens, train step 16 × 1024 tokens) on
# SmolLM2-135M's shape and Qwen2.5-1.5B's shape, with HBM-roofline and MFU fractions.
#
#   bench/gpu_check.sh OUT [BIN]
#
# BIN: the reinforge binary (default target/gpu-kit/reinforge from bench/make_gpu_kit.sh,
# else target/release/reinforge). Needs python3 with torch + transformers for the PyTorch side
# (skipped with a note when missing). Each part goes on when another fails; SUMMARY.txt lists
# them with their exit codes, and the script exits non-zero if any failed.
#
# To rehearse it without a GPU: DEVICE=cuda-emu QUICKSTART_STEPS=2 BENCH=0 bench/gpu_check.sh OUT
set -uo pipefail
cd "$(dirname "$0")/.."
out="${1:?usage: bench/gpu_check.sh OUT [BIN]}"
mkdir -p "$out"
bin="${2:-}"
[ -n "$bin" ] || for b in target/gpu-kit/reinforge target/release/reinforge; do [ -x "$b" ] && { bin="$b"; break; }; done
[ -x "$bin" ] || { echo "no reinforge binary: pass BIN or run bench/make_gpu_kit.sh"; exit 2; }
bin="$(cd "$(dirname "$bin")" && pwd)/$(basename "$bin")"
kit=target/gpu-kit
fixtures="${REINFORGE_FIXTURES:-}"
for f in "$kit/fixtures" shared/fixtures ../shared/fixtures; do [ -z "$fixtures" ] && [ -d "$f/models" ] && fixtures="$f"; done
smol="$kit/models/smollm2-135m-shape"
[ -d "$smol" ] || smol=bench/models/smollm2-135m-shape
qwen=bench/models/qwen2.5-1.5b-shape
export REINFORGE_HOME="${REINFORGE_HOME:-$out/home}"
device="${DEVICE:-cuda}"
steps=()
[ -n "${QUICKSTART_STEPS:-}" ] && steps=("trainer.total_steps=$QUICKSTART_STEPS")
summary="$out/SUMMARY.txt"
: > "$summary"
failed=0

# part NAME CMD...: runs CMD with its output in OUT/NAME.log, records the exit code and time.
part() {
  local name="$1"; shift
  local t0=$SECONDS
  echo "=== $name: $*" | tee -a "$out/$name.log"
  "$@" >> "$out/$name.log" 2>&1
  local rc=$?
  printf '%-28s exit %-3s %5ss\n' "$name" "$rc" "$((SECONDS - t0))" | tee -a "$summary"
  [ "$rc" -eq 0 ] || failed=1
  return 0
}

{ date -u; nvidia-smi || true; "$bin" --version; } > "$out/machine.txt" 2>&1
part cuda-info "$bin" cuda info
part kernels "$bin" cuda compile --arch compute_80,compute_90
models=()
[ -n "$fixtures" ] && models+=(--model "$fixtures/models/tiny-llama" --model "$fixtures/models/tiny-qwen2")
[ "$device" = cuda ] && models+=(--model "$smol")  # SmolLM2's shape: too slow for the emulator
part selftest "$bin" selftest --device "$device" "${models[@]}" --json "$out/selftest.json"

# GRPO on the quickstart task, on the GPU and on the CPU: the reward should rise alike.
for dev in "$device" cpu; do
  part "quickstart-$dev" "$bin" train examples/quickstart.toml "trainer.device=\"$dev\"" \
    "trainer.default_local_dir=\"$out/quickstart-$dev\"" 'trainer.logger=["jsonl"]' "${steps[@]}" --resume none
done
python3 - "$out" >> "$summary" 2>&1 <<'EOF'
import json, sys, os
for dev in (os.environ.get("DEVICE", "cuda"), "cpu"):
    p = os.path.join(sys.argv[1], f"quickstart-{dev}", "metrics.jsonl")
    try:
        rows = [json.loads(l) for l in open(p)]
    except OSError:
        print(f"quickstart-{dev}: no metrics"); continue
    r = [row.get("critic/score/mean") for row in rows if row.get("critic/score/mean") is not None]
    t = [row.get("timing_s/step") for row in rows if row.get("timing_s/step") is not None]
    if r:
        print(f"quickstart-{dev}: {len(r)} steps, reward first 10 {sum(r[:10])/len(r[:10]):.3f}, last 10 {sum(r[-10:])/len(r[-10:]):.3f}, "
              f"median step {sorted(t)[len(t)//2] if t else float('nan'):.3f}s")
EOF

# Benchmarks: PyTorch and Reinforge side by side, one process each, in one run.
if [ "${BENCH:-1}" = 0 ]; then
  echo "benchmarks: skipped (BENCH=0)" | tee -a "$summary"
elif python3 -c 'import torch, transformers; assert torch.cuda.is_available()' 2>/dev/null; then
  for m in "$smol" "$qwen"; do
    tag=$(basename "$m")
    part "bench-$tag" python3 bench/compare_hf.py --device cuda --model "$m" --reinforge "$bin" \
      --rollout-batch 64 --new-tokens 512 --train-batch 16 --seq-len 1024 --runs 3
    grep '"bench": "compare"' "$out/bench-$tag.log" | tail -1 | sed "s/^/bench-$tag: /" >> "$summary"
  done
else
  echo "benchmarks: python3 with torch (CUDA) and transformers not found; Reinforge alone:" | tee -a "$summary"
  for m in "$smol" "$qwen"; do
    tag=$(basename "$m")
    part "rollout-$tag" "$bin" bench rollout --device cuda --model "$m" --batch 64 --max-new-tokens 512
    part "train-$tag" "$bin" bench train --device cuda --model "$m" --batch 16 --seq-len 1024
  done
fi
echo "results in $out (SUMMARY.txt)"
cat "$summary"
exit "$failed"
