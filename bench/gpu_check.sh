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
# (Reinforge runs alone, with a note, when they are missing).
#
# GPU time is scarce (a lent GPU may have 15 minutes in all, machine start included), so the
# parts run most-informative first, each under its own time limit, within BUDGET_S seconds
# (default 540) for the whole script; what does not fit is listed as "skipped (budget)".
# Every part's output is in OUT/<part>.log and SUMMARY.txt is written as parts finish, so a
# run cut short still returns what it did. PARTS=a,b,... runs only those parts (a second call
# can pick up the skipped ones); a failing part never stops the others; the script exits
# non-zero if any part failed.
#
# Parts, in order: cuda-info, kernels, selftest-tiny (then, only if it failed, the same with
# CUDA_LAUNCH_BLOCKING=1 and attention on CUDA cores, to localise the fault),
# quickstart-cuda, quickstart-cpu, bench-smollm2, bench-qwen, graphs-ab (decode as CUDA
# graphs against eager launches and against steps read before the next is queued), attention-ab (tensor-core against CUDA-core attention on the
# 1.5B shape's train step), selftest-smollm2, sampling-ab (decode with top-p 0.9 and top-k 50,
# the radix-select thresholds, against the full distribution), memcheck, synccheck and
# racecheck (compute-sanitizer's tools on a small tiny-model self-test, where installed; their
# findings exit 86). The bench parts also write each engine's op profile
# (profile-<model>-rollout|train.json: device time per kernel and GEMM shape of one more run),
# and SUMMARY.txt ends with the costliest ops of each.
#
# To rehearse it without a GPU: DEVICE=cuda-emu QUICKSTART_STEPS=1 BENCH=0 bench/gpu_check.sh OUT
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
# Kernels compiled ahead by make_gpu_kit.sh: used when this node's NVRTC has their version.
if [ -d "$kit/cuda-kernels" ]; then
  mkdir -p "$REINFORGE_HOME/cuda-kernels" && cp -n "$kit/cuda-kernels/"*.cubin "$REINFORGE_HOME/cuda-kernels/" 2>/dev/null
fi
# ptxas's register report of those kernels, to read beside this run's profiles.
[ -f "$kit/kernel-resources.txt" ] && cp "$kit/kernel-resources.txt" "$out/"
device="${DEVICE:-cuda}"
budget="${BUDGET_S:-540}"
steps=()
[ -n "${QUICKSTART_STEPS:-}" ] && steps=("trainer.total_steps=$QUICKSTART_STEPS")
summary="$out/SUMMARY.txt"
: > "$summary"
failed=0
t_start=$SECONDS
declare -A rc_of

wanted() { [ -z "${PARTS:-}" ] || [[ ",$PARTS," == *",$1,"* ]]; }

# part NAME LIMIT_S CMD...: runs CMD under `timeout`, at most LIMIT_S seconds and never past
# the budget, with its output in OUT/NAME.log; records the exit code and time.
part() {
  local name="$1" limit="$2"; shift 2
  wanted "$name" || return 0
  local left=$((budget - (SECONDS - t_start)))
  if [ "$left" -lt 15 ]; then
    printf '%-28s skipped (budget)\n' "$name" | tee -a "$summary"
    return 0
  fi
  [ "$limit" -gt "$left" ] && limit=$left
  local t0=$SECONDS
  echo "=== $name (limit ${limit}s): $*" | tee -a "$out/$name.log"
  timeout -k 10 "$limit" "$@" >> "$out/$name.log" 2>&1
  local rc=$?
  rc_of[$name]=$rc
  local note=""
  [ "$rc" -eq 124 ] || [ "$rc" -eq 137 ] && note=" (timed out)"
  printf '%-28s exit %-3s %5ss%s\n' "$name" "$rc" "$((SECONDS - t0))" "$note" | tee -a "$summary"
  [ "$rc" -eq 0 ] || failed=1
  return 0
}

{ date -u; nvidia-smi || true; "$bin" --version; } > "$out/machine.txt" 2>&1
part cuda-info 30 "$bin" cuda info
part kernels 60 "$bin" cuda compile --arch compute_80,compute_90
tiny=()
[ -n "$fixtures" ] && tiny=(--model "$fixtures/models/tiny-llama" --model "$fixtures/models/tiny-qwen2")
part selftest-tiny 120 "$bin" selftest --device "$device" "${tiny[@]}" --json "$out/selftest-tiny.json"
if [ "${rc_of[selftest-tiny]:-0}" -ne 0 ]; then
  # Synchronous launches name the kernel that faulted; CUDA-core attention tells whether the
  # tensor-core kernels are the cause.
  CUDA_LAUNCH_BLOCKING=1 REINFORGE_CUDA_ATTENTION=cuda-cores \
    part selftest-tiny-cuda-cores 120 "$bin" selftest --device "$device" "${tiny[@]}" --json "$out/selftest-tiny-cuda-cores.json"
fi

# GRPO on the quickstart task, on the GPU and on the CPU: the reward should rise alike.
for dev in "$device" cpu; do
  part "quickstart-$dev" 150 "$bin" train examples/quickstart.toml "trainer.device=\"$dev\"" \
    "trainer.default_local_dir=\"$out/quickstart-$dev\"" 'trainer.logger=["jsonl"]' "${steps[@]}" --resume none
done
python3 - "$out" "$device" >> "$summary" 2>&1 <<'EOF'
import json, sys, os
for dev in (sys.argv[2], "cpu"):
    p = os.path.join(sys.argv[1], f"quickstart-{dev}", "metrics.jsonl")
    try:
        rows = [json.loads(l) for l in open(p)]
    except OSError:
        continue
    def med(key):
        v = sorted(row[key] for row in rows if row.get(key) is not None)
        return v[len(v) // 2] if v else float("nan")
    r = [row.get("critic/score/mean") for row in rows if row.get("critic/score/mean") is not None]
    if r:
        step, sync = med("timing_s/step"), med("timing_s/update_weights")
        print(f"quickstart-{dev}: {len(r)} steps, reward first 10 {sum(r[:10])/len(r[:10]):.3f}, last 10 {sum(r[-10:])/len(r[-10:]):.3f}, "
              f"median step {step:.3f}s, weight sync {sync:.2e}s ({100 * sync / step:.3f}% of the step), "
              f"mfu {med('perf/mfu/actor'):.3f}, peak {med('perf/max_memory_allocated_gb'):.2f} GB")
EOF

# Benchmarks: PyTorch and Reinforge side by side, one process each, in one run.
have_torch=0
python3 -c 'import torch, transformers; assert torch.cuda.is_available()' 2>/dev/null && have_torch=1
bench() {  # bench TAG MODEL LIMIT
  local tag="$1" m="$2" limit="$3"
  if [ "$have_torch" = 1 ]; then
    part "bench-$tag" "$limit" python3 bench/compare_hf.py --device cuda --model "$m" --reinforge "$bin" \
      --rollout-batch 64 --new-tokens 512 --train-batch 16 --seq-len 1024 --runs 3 --reinforge-profile "$out/profile-$tag"
    grep '"bench": "compare"' "$out/bench-$tag.log" 2>/dev/null | tail -1 | sed "s/^/bench-$tag: /" >> "$summary"
  else
    part "bench-$tag" "$limit" sh -c "'$bin' bench rollout --device cuda --model '$m' --batch 64 --max-new-tokens 512 --profile '$out/profile-$tag-rollout.json' && '$bin' bench train --device cuda --model '$m' --batch 16 --seq-len 1024 --profile '$out/profile-$tag-train.json'"
  fi
}
if [ "${BENCH:-1}" = 0 ]; then
  echo "benchmarks: skipped (BENCH=0)" | tee -a "$summary"
else
  [ "$have_torch" = 1 ] || echo "benchmarks: python3 with torch (CUDA) and transformers not found; Reinforge alone" | tee -a "$summary"
  bench smollm2 "$smol" 150
  bench qwen "$qwen" 240
  # Decode replayed as CUDA graphs with steps queued ahead (default), against kernel-by-kernel
  # launches, and against reading each step's tokens before queuing the next.
  part graphs-ab 120 sh -c "'$bin' bench rollout --device cuda --model '$smol' --batch 64 --max-new-tokens 512 --repeats 2 && '$bin' bench rollout --device cuda --model '$smol' --batch 64 --max-new-tokens 512 --repeats 2 --enforce-eager && '$bin' bench rollout --device cuda --model '$smol' --batch 64 --max-new-tokens 512 --repeats 2 --no-async-scheduling"
  grep -h '"bench"' "$out/graphs-ab.log" 2>/dev/null | sed 's/^/graphs-ab: /' >> "$summary"
  # The same train step with attention on tensor cores (default) and on CUDA cores.
  part attention-ab 120 sh -c "'$bin' bench train --device cuda --model '$qwen' --batch 16 --seq-len 1024 --repeats 2 && REINFORGE_CUDA_ATTENTION=cuda-cores '$bin' bench train --device cuda --model '$qwen' --batch 16 --seq-len 1024 --repeats 2"
  grep -h '"bench"' "$out/attention-ab.log" 2>/dev/null | sed 's/^/attention-ab: /' >> "$summary"
fi
[ "$device" = cuda ] && part selftest-smollm2 180 "$bin" selftest --device cuda --model "$smol" --json "$out/selftest-smollm2.json"
if [ "${BENCH:-1}" != 0 ]; then
  # Sampling with top-p and top-k (thresholds by radix selection) against the full distribution.
  part sampling-ab 90 sh -c "'$bin' bench rollout --device cuda --model '$smol' --batch 64 --max-new-tokens 512 --repeats 2 --top-p 0.9 --top-k 50 && '$bin' bench rollout --device cuda --model '$smol' --batch 64 --max-new-tokens 512 --repeats 2"
  grep -h '"bench"' "$out/sampling-ab.log" 2>/dev/null | sed 's/^/sampling-ab: /' >> "$summary"
fi
if command -v compute-sanitizer > /dev/null && [ -n "$fixtures" ]; then
  # The tools' own exit code (86) tells their findings from a failing self-test check (1); a
  # smaller self-test (bf16, short sequences) keeps the slow ones within their limits.
  small=(selftest --device "$device" --model "$fixtures/models/tiny-llama" --dtype bf16 --seq-len 32 --new-tokens 4)
  part memcheck 120 compute-sanitizer --tool memcheck --error-exitcode 86 "$bin" "${small[@]}"
  # What the emulator cannot show: invalid warp-synchronisation masks and barriers, then
  # shared-memory races between a block's warps (it runs a block's threads one after another).
  # racecheck reports some races as warnings, which leave its exit code alone: its summary's
  # hazard count decides.
  part synccheck 90 compute-sanitizer --tool synccheck --error-exitcode 86 "$bin" "${small[@]}"
  part racecheck 150 compute-sanitizer --tool racecheck --error-exitcode 86 "$bin" "${small[@]}"
  hazards=$(grep -ho 'RACECHECK SUMMARY: [0-9]* hazard' "$out/racecheck.log" 2>/dev/null | grep -o '[0-9]*' | sort -n | tail -1)
  if [ -n "$hazards" ] && [ "$hazards" -gt 0 ]; then
    echo "racecheck: $hazards hazards (see racecheck.log)" | tee -a "$summary"
    failed=1
  fi
fi
# Where the benches' time went, op by op (one more run of each, timed kernel by kernel; the
# rollout's eager): the costliest ops of every profile written.
python3 - "$out" >> "$summary" 2>&1 <<'EOF'
import glob, json, os, sys
for path in sorted(glob.glob(os.path.join(sys.argv[1], "profile-*.json"))):
    try:
        p = json.load(open(path))["profile"]
    except (OSError, ValueError, KeyError) as e:
        print(f"{os.path.basename(path)}: unreadable ({e})")
        continue
    busy = p["busy_seconds"]
    print(f"{os.path.basename(path)}: {p['launches']} ops, {busy * 1e3:.1f} ms busy, {p['idle_seconds'] * 1e3:.1f} ms idle")
    g = json.load(open(path)).get("graphs")
    if g:
        print(f"  with CUDA graphs: {g['launches']} ops, {g['busy_seconds'] * 1e3:.1f} ms busy, {g['idle_seconds'] * 1e3:.1f} ms idle (the host between steps)")
    for o in p["ops"][:12]:
        rate = f", {o['flops'] / o['seconds'] / 1e12:.0f} TFLOP/s" if o["flops"] and o["seconds"] else ""
        rate += f", {o['bytes'] / o['seconds'] / 1e9:.0f} GB/s" if o["bytes"] and o["seconds"] else ""
        print(f"  {100 * o['seconds'] / max(busy, 1e-30):5.1f}% {o['seconds'] * 1e3:9.2f} ms {o['calls']:6d}x {o['op']}{rate}")
EOF
echo "results in $out (SUMMARY.txt), $((SECONDS - t_start))s"
cat "$summary"
exit "$failed"
