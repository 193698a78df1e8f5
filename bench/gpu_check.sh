#!/usr/bin/env bash
# Everything that needs a GPU, in one go: the CUDA engine's self-test against the CPU engine
# (tiny fixtures, then SmolLM2's shape), a GRPO quickstart run on the GPU beside the same run
# on the CPU, and the benchmarks against PyTorch (rollout 64 × 512 new tokens, train step
# 16 × 1024 tokens) on SmolLM2-135M's shape and Qwen2.5-1.5B's shape, with HBM-roofline and
# MFU fractions.
#
#   bench/gpu_check.sh OUT [BIN]
#
# BIN: the reinforge binary (default target/gpu-kit/reinforge from bench/make_gpu_kit.sh,
# else target/release/reinforge); where this machine's glibc is too old for it, it starts
# through the kit's own loader and libraries. Needs python3 with torch + transformers for the PyTorch side
# (Reinforge runs alone, with a note, when they are missing).
#
# What comes back: the device tool returns at most 8 files from OUT, so OUT gets two:
# SUMMARY.txt and results.tgz (every part's log, JSON results and profiles, the quickstart
# runs without their checkpoints), both rewritten after every part, so a run killed at any
# point still returns what it did. The parts work in WORK (default: a new /tmp/gpu-check.*).
#
# GPU time is scarce (a lent GPU may have 15 minutes in all, machine start included), so the
# parts run most-informative first, each under its own time limit, within BUDGET_S seconds
# (default 540; give the device tool's timeout_s at least BUDGET_S + 30) for the whole
# script. A part that would get less than half its limit is skipped ("skipped (budget)"), and
# one cut short by the budget is marked so, not failed. Only the first self-test checks NCCL
# (a world of one rank), so an NCCL that stalls costs its deadline once.
# PARTS=a,b,... runs only those parts (a second call can pick up the skipped ones); a failing
# part never stops the others; the script exits non-zero if any part failed.
#
# Parts, in order: cuda-info, kernels (the kit's cubins for KERNEL_ARCH, default sm_90, load
# from the cache with this machine's NVRTC), selftest-tiny, selftest-fused-linear (the same
# with REINFORGE_CUDA_DECODE_LINEAR=fused), selftest-dependent (the same, with
# REINFORGE_CUDA_DECODE_LAUNCH=dependent too; then, only if selftest-tiny failed, it again
# with CUDA_LAUNCH_BLOCKING=1 and attention on CUDA cores, to localise the fault),
# quickstart-cuda, train-decode-cuda (5 steps with 8-token answers: decode graphs inside the
# training loop), train-lora-cuda (5 LoRA steps: the adapter's GEMMs, the merged rollout
# copy), quickstart-cpu (unless the kit holds that run's metrics from
# make_gpu_kit.sh), selftest-smollm2, selftest-smollm2-fused (bf16, with
# REINFORGE_CUDA_DECODE_LINEAR=fused and REINFORGE_CUDA_DECODE_LAUNCH=dependent), memcheck, synccheck and racecheck (compute-sanitizer,
# where installed and the GPU is supported; findings exit 86), racecheck-heads (short
# rollouts at head dims 64 and 128 under racecheck), bench-smollm2, bench-qwen,
# graphs-ab (decode as CUDA graphs against eager launches and against steps read before the
# next is queued), sampling-ab (decode with top-p 0.9 and top-k 50, the radix-select
# thresholds, against the full distribution), attention-ab (tensor-core against CUDA-core
# attention on the 1.5B shape's train step), lora-ab (the 1.5B shape's train step in full
# against a rank-16 LoRA adapter), decode-attention-ab (tensor-core against
# CUDA-core decode attention on the 1.5B shape's rollout), decode-split-ab (decode
# attention's keys per block: 64, 320 and 576 against the default), decode-rope-ab (the new
# tokens' RoPE and cache store inside decode attention against a launch of their own),
# decode-linear-ab (decode_linear.cu's kernels — the norms fused into SmolLM2's QKV and
# gate/up GEMMs, o_proj and down on linear_rows — against the norm kernel, cuBLASLt and
# SwiGLU's kernel, on SmolLM2 and the 1.5B shape), decode-launch-ab (those kernels and decode
# attention as programmatic dependent launches against plain ones), decode-breakdown and
# decode-breakdown-qwen (each op's cost in a decode step as it runs: the rollout again with
# that op launched twice; SmolLM2 with every decode knob on and with the defaults, the 1.5B
# shape with the defaults). The bench parts also
# write each engine's op profile (profile-<model>-rollout|train.json: device time per kernel
# and GEMM shape of one more run), and SUMMARY.txt ends with the costliest ops of each. After
# the benches, bench/targets.py writes each performance target's verdict into SUMMARY.txt.
#
# To rehearse it without a GPU: DEVICE=cuda-emu QUICKSTART_STEPS=1 BENCH=0 bench/gpu_check.sh OUT
set -uo pipefail
cd "$(dirname "$0")/.."
out="${1:?usage: bench/gpu_check.sh OUT [BIN]}"
mkdir -p "$out"
out="$(cd "$out" && pwd)"
bin="${2:-}"
[ -n "$bin" ] || for b in target/gpu-kit/reinforge target/release/reinforge; do [ -x "$b" ] && { bin="$b"; break; }; done
[ -x "$bin" ] || { echo "no reinforge binary: pass BIN or run bench/make_gpu_kit.sh"; exit 2; }
bin="$(cd "$(dirname "$bin")" && pwd)/$(basename "$bin")"
work="${WORK:-$(mktemp -d /tmp/gpu-check.XXXXXX)}"
mkdir -p "$work"
work="$(cd "$work" && pwd)"
kit=target/gpu-kit
fixtures="${REINFORGE_FIXTURES:-}"
for f in "$kit/fixtures" shared/fixtures ../shared/fixtures; do [ -z "$fixtures" ] && [ -d "$f/models" ] && fixtures="$f"; done
smol="$kit/models/smollm2-135m-shape"
[ -d "$smol" ] || smol=bench/models/smollm2-135m-shape
qwen=bench/models/qwen2.5-1.5b-shape
export REINFORGE_HOME="${REINFORGE_HOME:-$work/home}"
# Nothing here may reach a network: transformers reads local folders only.
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 HF_HOME="$work/hf" PYTHONUNBUFFERED=1
# Kernels compiled ahead by make_gpu_kit.sh: used when this node's NVRTC has their version.
if [ -d "$kit/cuda-kernels" ]; then
  mkdir -p "$REINFORGE_HOME/cuda-kernels" && cp -n "$kit/cuda-kernels/"*.cubin "$REINFORGE_HOME/cuda-kernels/" 2>/dev/null
fi
# ptxas's register report of those kernels, to read beside this run's profiles.
[ -f "$kit/kernel-resources.txt" ] && cp "$kit/kernel-resources.txt" "$work/"
device="${DEVICE:-cuda}"
budget="${BUDGET_S:-540}"
steps=()
[ -n "${QUICKSTART_STEPS:-}" ] && steps=("trainer.total_steps=$QUICKSTART_STEPS")
summary="$work/SUMMARY.txt"
: > "$summary"
t_start=$SECONDS
# Per part: ok, failed, timed-out (its own limit), cut (by the budget) or unsupported.
declare -A status_of

wanted() { [ -z "${PARTS:-}" ] || [[ ",$PARTS," == *",$1,"* ]]; }

# What comes back: SUMMARY.txt and one archive of the rest, replaced whole (written aside,
# then renamed), so a run killed mid-way returns the last complete one.
pack() {
  cp "$summary" "$out/SUMMARY.txt"
  # A file over 16 MiB does not come back at all: a log that grew past 2 MB keeps its end.
  find "$work" -name '*.log' -size +2M -exec sh -c 'tail -c 2000000 "$1" > "$1.tail" && mv "$1.tail" "$1"' _ {} \;
  tar -czf "$out/results.tgz.part" -C "$work" --exclude=./home --exclude=./hf --exclude='./quickstart-*/checkpoints' --exclude='./train-decode-*/checkpoints' . 2>/dev/null \
    && mv -f "$out/results.tgz.part" "$out/results.tgz"
}

# part NAME LIMIT_S CMD...: runs CMD under `timeout`, at most LIMIT_S seconds and never past
# the budget, with its output in WORK/NAME.log; records its status and time.
part() {
  local name="$1" limit="$2"; shift 2
  wanted "$name" || return 0
  local left=$((budget - (SECONDS - t_start)))
  # With less than half its limit left a part would likely be cut: leave the time to the
  # parts that fit, and this one to a second call (PARTS=...).
  if [ "$left" -lt 25 ] || [ $((2 * left)) -lt "$limit" ]; then
    printf '%-28s skipped (budget: %ss left)\n' "$name" "$left" | tee -a "$summary"
    pack
    return 0
  fi
  local cut=0
  # A part cut to the time left also leaves room for timeout's kill grace and the last pack.
  [ "$limit" -gt $((left - 10)) ] && { limit=$((left - 10)); cut=1; }
  local t0=$SECONDS
  echo "=== $name (limit ${limit}s): $*" | tee "$work/$name.log"
  timeout -k 10 "$limit" "$@" >> "$work/$name.log" 2>&1
  local rc=$?
  local status=ok note=""
  if [ "$rc" -eq 124 ] || [ "$rc" -eq 137 ]; then
    status=timed-out note=" (timed out)"
    [ "$cut" = 1 ] && status=cut note=" (cut short by the budget)"
  elif [ "$rc" -ne 0 ]; then
    status=failed
  fi
  status_of[$name]=$status
  printf '%-28s exit %-3s %5ss%s\n' "$name" "$rc" "$((SECONDS - t0))" "$note" | tee -a "$summary"
  pack
  return 0
}

starts=1
"$bin" --version > "$work/version.txt" 2> "$work/start.txt" || starts=0
# A glibc older than the build machine's: start the binary through the loader and libraries the
# kit carries beside it (make_gpu_kit.sh), ahead of the node's own, which still serve the CUDA
# driver. --library-path is the loader's alone, so the processes the binary starts (python3,
# nvidia-smi) keep the node's; one that starts reinforge again is given the wrapper
# (REINFORGE_WORKER_BIN), since the binary's own path would now name the loader.
start_note=""
glibc_dir="$(dirname "$bin")/glibc"
[ -d "$glibc_dir" ] || glibc_dir="$PWD/$kit/glibc"
if [ "$starts" = 0 ] && [ -f "$glibc_dir/ld-linux-x86-64.so.2" ]; then
  mv "$work/start.txt" "$work/start-direct.txt"
  # Carrying may drop the execute bit; the wrapper lives beside the loader, where the kit's
  # files already run (a noexec /tmp would stop a wrapper in WORK).
  chmod u+x "$glibc_dir/ld-linux-x86-64.so.2" 2>/dev/null
  wrapper="$glibc_dir/run-reinforge"
  { : > "$wrapper"; } 2>/dev/null || wrapper="$work/run-reinforge"
  {
    echo '#!/usr/bin/env bash'
    printf '[ -n "${REINFORGE_WORKER_BIN:-}" ] || export REINFORGE_WORKER_BIN=%q\n' "$wrapper"
    printf 'exec %q --argv0 %q --library-path %q"${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}" %q "$@"\n' \
      "$glibc_dir/ld-linux-x86-64.so.2" "$bin" "$glibc_dir" "$bin"
  } > "$wrapper"
  chmod +x "$wrapper"
  "$wrapper" --version > "$work/version.txt" 2> "$work/start.txt" && starts=1
  why="the binary did not start on its own"
  grep -q 'GLIBC_' "$work/start-direct.txt" && why="this machine's glibc is older than the binary needs"
  why="$why: $(head -1 "$work/start-direct.txt" | cut -c1-300)"
  if [ "$starts" = 1 ]; then
    bin="$wrapper"
    start_note="started through the kit's glibc ($why)"
  else
    start_note="the kit's glibc did not start it either ($why)"
  fi
elif [ "$starts" = 0 ]; then
  start_note="no glibc of the kit's at $glibc_dir to start it with (make the kit with bench/make_gpu_kit.sh)"
fi
{
  date -u
  echo "kit: $(cat "$kit/COMMIT" 2>/dev/null || echo 'no COMMIT file')"
  timeout 20 nvidia-smi || true
  cat "$work/version.txt" "$work/start.txt"
} > "$work/machine.txt" 2>&1
sed -n 2p "$work/machine.txt" | tee -a "$summary"
[ -n "$start_note" ] && echo "$start_note" | tee -a "$summary"
# A binary that cannot start here (a glibc older than the build machine's) would fail every
# part: say why once, and stop.
if [ "$starts" = 0 ]; then
  {
    echo "the reinforge binary does not start on this machine: $(head -c 600 "$work/start.txt")"
    echo "this machine: $(ldd --version 2>&1 | head -1); the kit: $(cat "$kit/COMMIT" 2>/dev/null)"
  } | tee -a "$summary"
  pack
  exit 1
fi
part cuda-info 30 "$bin" cuda info
part kernels 60 "$bin" cuda compile --arch "${KERNEL_ARCH:-sm_90}"
tiny=()
[ -n "$fixtures" ] && tiny=(--model "$fixtures/models/tiny-llama" --model "$fixtures/models/tiny-qwen2")
part selftest-tiny 120 "$bin" selftest --device "$device" "${tiny[@]}" --json "$work/selftest-tiny.json"
# The fused norm + linear decode kernels (not the default yet) against the CPU engine too.
REINFORGE_CUDA_DECODE_LINEAR=fused part selftest-fused-linear 90 "$bin" selftest --device "$device" "${tiny[@]}" --no-nccl --json "$work/selftest-fused-linear.json"
# ... and as programmatic dependent launches, which the emulator cannot check.
REINFORGE_CUDA_DECODE_LINEAR=fused REINFORGE_CUDA_DECODE_LAUNCH=dependent part selftest-dependent 90 "$bin" selftest --device "$device" "${tiny[@]}" --no-nccl --json "$work/selftest-dependent.json"
if [ "${status_of[selftest-tiny]:-ok}" = failed ]; then
  # Synchronous launches name the kernel that faulted; CUDA-core attention tells whether the
  # tensor-core kernels are the cause.
  CUDA_LAUNCH_BLOCKING=1 REINFORGE_CUDA_ATTENTION=cuda-cores \
    part selftest-tiny-cuda-cores 120 "$bin" selftest --device "$device" "${tiny[@]}" --no-nccl --json "$work/selftest-tiny-cuda-cores.json"
fi

# GRPO on the quickstart task, on the GPU and on the CPU: the reward should rise alike. The
# CPU run needs no GPU: make_gpu_kit.sh runs it into the kit, and it runs here only if not.
train() {  # train PART DEVICE LIMIT [OVERRIDE...]: the quickstart config, its run in WORK/PART
  local name="$1" dev="$2" limit="$3"; shift 3
  part "$name" "$limit" "$bin" train examples/quickstart.toml "trainer.device=\"$dev\"" \
    "trainer.default_local_dir=\"$work/$name\"" 'trainer.logger=["jsonl"]' "$@" --resume none
}
train "quickstart-$device" "$device" 150 "${steps[@]}"
# The quickstart answers in one token, so its rollouts end at the prefill: a few steps with
# longer answers record and replay decode graphs inside the training loop, as real runs do.
train "train-decode-$device" "$device" 90 trainer.total_steps=5 data.max_response_length=8
# LoRA (rank 8 on every linear): training, the merged copy's rollouts, 5 steps.
train "train-lora-$device" "$device" 90 trainer.total_steps=5 actor.lora_rank=8 actor.lora_alpha=16 actor.lr=5e-3
if [ -f "$kit/quickstart-cpu/metrics.jsonl" ] && [ ${#steps[@]} -eq 0 ] && [ "$device" != cpu ]; then
  cp -r "$kit/quickstart-cpu" "$work/quickstart-cpu"
  echo "quickstart-cpu               from the kit ($(cat "$kit/quickstart-cpu/machine.txt" 2>/dev/null))" | tee -a "$summary"
else
  train quickstart-cpu cpu 150 "${steps[@]}"
fi
python3 - "$work" "$device" >> "$summary" 2>&1 <<'PY'
import json, sys, os
for dev in (sys.argv[2], "cpu"):
    p = os.path.join(sys.argv[1], f"quickstart-{dev}", "metrics.jsonl")
    rows = []
    try:
        for line in open(p):
            try:
                rows.append(json.loads(line))
            except ValueError:  # the last line of a run that was killed
                pass
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
PY
pack
[ "$device" = cuda ] && part selftest-smollm2 180 "$bin" selftest --device cuda --model "$smol" --no-nccl --json "$work/selftest-smollm2.json"
# Decoding with every decode knob on at SmolLM2's widths (576 and 1536; o_proj and down split
# three ways over k on a 132-SM GPU), where the tiny fixtures are 64 wide: greedy, graphs kept,
# and dependent launches of decode_linear.cu's kernels against plain ones, bit for bit (bf16:
# the only type with those kernels).
[ "$device" = cuda ] && REINFORGE_CUDA_DECODE_LINEAR=fused REINFORGE_CUDA_DECODE_LAUNCH=dependent part selftest-smollm2-fused 150 "$bin" selftest --device cuda --model "$smol" --dtype bf16 --no-nccl --json "$work/selftest-smollm2-fused.json"

# compute-sanitizer, where installed: on PATH or in the toolkit.
sanitizer=$(command -v compute-sanitizer || ls /usr/local/cuda/bin/compute-sanitizer 2>/dev/null || true)
sanitizer_ok=1
small=()
[ -n "$fixtures" ] && small=(selftest --device "$device" --model "$fixtures/models/tiny-llama" --dtype bf16 --seq-len 32 --new-tokens 4 --no-nccl)
# sanitize TOOL LIMIT: the tool's findings exit 86, a failing self-test check 1; a GPU the tool
# does not support (under gVisor) is noted, and the other tools are not tried.
sanitize() {
  [ -n "$sanitizer" ] && [ ${#small[@]} -gt 0 ] && [ "$sanitizer_ok" = 1 ] || return 0
  part "$1" "$2" "$sanitizer" --tool "$1" --error-exitcode 86 --print-limit 200 "$bin" "${small[@]}"
  if grep -q "Device not supported" "$work/$1.log" 2>/dev/null; then
    status_of[$1]=unsupported
    sanitizer_ok=0
    echo "$1: compute-sanitizer does not support this GPU here (gVisor?): no sanitizer checks" | tee -a "$summary"
    pack
  fi
}
# Correctness before speed: the sanitizers take some 30 s, the benchmarks minutes.
# What the emulator cannot show: invalid warp-synchronisation masks and barriers, then
# shared-memory races between a block's warps (it runs a block's threads one after another).
# racecheck reports some races as warnings, which leave its exit code alone: its summary's
# hazard count decides.
sanitize memcheck 120
sanitize synccheck 90
sanitize racecheck 150
# The self-test's tiny-llama has head dim 16: the decode kernel's shared memory and loads per
# lane differ at SmolLM2's 64 and the 1.5B shape's 128, so a short rollout of each under
# racecheck too, with the fused norm + linear kernels (SmolLM2's; the 1.5B shape is too wide
# for them).
if [ -n "$sanitizer" ] && [ "$sanitizer_ok" = 1 ] && [ "$device" = cuda ]; then
  part racecheck-heads 150 sh -c "for m in '$smol' '$qwen'; do REINFORGE_CUDA_DECODE_LINEAR=fused '$sanitizer' --tool racecheck --error-exitcode 86 --print-limit 200 '$bin' bench rollout --device cuda --model \$m --batch 4 --max-new-tokens 8 --repeats 1 || exit \$?; done"
fi
for log in racecheck racecheck-heads; do
  hazards=$(grep -ho 'RACECHECK SUMMARY: [0-9]* hazard' "$work/$log.log" 2>/dev/null | grep -o '[0-9]*' | sort -n | tail -1)
  if [ -n "$hazards" ] && [ "$hazards" -gt 0 ]; then
    echo "$log: $hazards hazards (see $log.log)" | tee -a "$summary"
    status_of[$log]=failed
  fi
done
# Benchmarks: Reinforge then PyTorch, one process each, in one run.
have_torch=0
timeout 60 python3 -c 'import torch, transformers; assert torch.cuda.is_available()' 2>/dev/null && have_torch=1
# Every result line a bench part printed, into the summary (the compare line comes last: a
# part cut short still has its earlier lines).
results() {  # results PART
  grep -h '"bench"' "$work/$1.log" 2>/dev/null | sed "s/^/$1: /" >> "$summary"
  pack
}
bench() {  # bench TAG MODEL LIMIT
  local tag="$1" m="$2" limit="$3"
  if [ "$have_torch" = 1 ]; then
    part "bench-$tag" "$limit" python3 bench/compare_hf.py --device cuda --model "$m" --reinforge "$bin" \
      --rollout-batch 64 --new-tokens 512 --train-batch 16 --seq-len 1024 --runs 3 --reinforge-profile "$work/profile-$tag" \
      --side-timeout $((limit * 5 / 8))
  else
    part "bench-$tag" "$limit" sh -c "'$bin' bench rollout --device cuda --model '$m' --batch 64 --max-new-tokens 512 --profile '$work/profile-$tag-rollout.json' && '$bin' bench train --device cuda --model '$m' --batch 16 --seq-len 1024 --profile '$work/profile-$tag-train.json'"
  fi
  results "bench-$tag"
}
if [ "${BENCH:-1}" = 0 ]; then
  echo "benchmarks: skipped (BENCH=0)" | tee -a "$summary"
else
  [ "$have_torch" = 1 ] || echo "benchmarks: python3 with torch (CUDA) and transformers not found; Reinforge alone" | tee -a "$summary"
  # HF generate on SmolLM2's 30 layers took 20–50 s per timed run on an H200 (2026-11-27).
  bench smollm2 "$smol" 240
  bench qwen "$qwen" 240
  # Each performance target, measured against its bound: met, MISSED or not measured.
  python3 bench/targets.py "$work" >> "$summary" 2>&1
  pack
fi
if [ "${BENCH:-1}" != 0 ]; then
  # Decode replayed as CUDA graphs with steps queued ahead (default), against kernel-by-kernel
  # launches, and against reading each step's tokens before queuing the next.
  part graphs-ab 120 sh -c "'$bin' bench rollout --device cuda --model '$smol' --batch 64 --max-new-tokens 512 --repeats 2 && '$bin' bench rollout --device cuda --model '$smol' --batch 64 --max-new-tokens 512 --repeats 2 --enforce-eager && '$bin' bench rollout --device cuda --model '$smol' --batch 64 --max-new-tokens 512 --repeats 2 --no-async-scheduling"
  results graphs-ab
  # Sampling with top-p and top-k (thresholds by radix selection) against the full distribution.
  part sampling-ab 90 sh -c "'$bin' bench rollout --device cuda --model '$smol' --batch 64 --max-new-tokens 512 --repeats 2 --top-p 0.9 --top-k 50 && '$bin' bench rollout --device cuda --model '$smol' --batch 64 --max-new-tokens 512 --repeats 2"
  results sampling-ab
  # The same train step with attention on tensor cores (default) and on CUDA cores.
  part attention-ab 120 sh -c "'$bin' bench train --device cuda --model '$qwen' --batch 16 --seq-len 1024 --repeats 2 && REINFORGE_CUDA_ATTENTION=cuda-cores '$bin' bench train --device cuda --model '$qwen' --batch 16 --seq-len 1024 --repeats 2"
  results attention-ab
  # The 1.5B shape's train step fine-tuning every weight against a rank-16 LoRA adapter on
  # every linear (step time, peak memory, optimizer state).
  part lora-ab 120 sh -c "'$bin' bench train --device cuda --model '$qwen' --batch 16 --seq-len 1024 --repeats 2 && '$bin' bench train --device cuda --model '$qwen' --batch 16 --seq-len 1024 --repeats 2 --lora-rank 16"
  results lora-ab
  # Decode attention on tensor cores (default) against the CUDA-core kernel, in the rollout of
  # the 1.5B shape (GQA groups of 6 heads).
  part decode-attention-ab 90 sh -c "'$bin' bench rollout --device cuda --model '$qwen' --batch 64 --max-new-tokens 512 --repeats 2 && REINFORGE_CUDA_ATTENTION=cuda-cores '$bin' bench rollout --device cuda --model '$qwen' --batch 64 --max-new-tokens 512 --repeats 2"
  results decode-attention-ab
  # Decode attention's keys per block (flash-decoding split; by default a quarter of the
  # context the decode buffers are sized for, a multiple of 32, at most 256: 256 here, so a
  # row has one block until its context passes 256): more, smaller splits against fewer,
  # longer ones, on the 1.5B shape and on SmolLM2 (3 KV heads: 192 blocks while one split).
  part decode-split-ab 120 sh -c "for keys in 64 320 576; do REINFORGE_CUDA_DECODE_SPLIT=\$keys '$bin' bench rollout --device cuda --model '$qwen' --batch 64 --max-new-tokens 512 --repeats 2 || exit 1; done; for keys in 64 128; do REINFORGE_CUDA_DECODE_SPLIT=\$keys '$bin' bench rollout --device cuda --model '$smol' --batch 64 --max-new-tokens 512 --repeats 2 || exit 1; done"
  results decode-split-ab
  # The new tokens' RoPE and cache store inside decode attention (default) against
  # rope_kv_store's launch before it, on SmolLM2's 30 layers, where launches weigh most.
  part decode-rope-ab 90 sh -c "'$bin' bench rollout --device cuda --model '$smol' --batch 64 --max-new-tokens 512 --repeats 2 && REINFORGE_CUDA_DECODE_ROPE=separate '$bin' bench rollout --device cuda --model '$smol' --batch 64 --max-new-tokens 512 --repeats 2"
  results decode-rope-ab
  # decode_linear.cu's kernels — the norms fused into the QKV and gate/up projections, o_proj
  # and down with the residual on linear_rows — against the norm kernel + cuBLASLt + SwiGLU
  # kernel (default), on SmolLM2 (with a profile of the fused rollout: each kernel's time) and
  # on the 1.5B shape (too wide for the norm fusion; its o_proj goes to linear_rows).
  part decode-linear-ab 150 sh -c "REINFORGE_CUDA_DECODE_LINEAR=fused '$bin' bench rollout --device cuda --model '$smol' --batch 64 --max-new-tokens 512 --repeats 2 --profile '$work/profile-smol2-fused-rollout.json' && '$bin' bench rollout --device cuda --model '$smol' --batch 64 --max-new-tokens 512 --repeats 2 && REINFORGE_CUDA_DECODE_LINEAR=fused '$bin' bench rollout --device cuda --model '$qwen' --batch 64 --max-new-tokens 512 --repeats 2 && '$bin' bench rollout --device cuda --model '$qwen' --batch 64 --max-new-tokens 512 --repeats 2"
  results decode-linear-ab
  # The layer kernels as programmatic dependent launches (each starts, and streams its
  # weights, while the kernel before finishes) against plain launches, both with
  # decode_linear.cu's kernels, on SmolLM2.
  part decode-launch-ab 90 sh -c "REINFORGE_CUDA_DECODE_LINEAR=fused REINFORGE_CUDA_DECODE_LAUNCH=dependent '$bin' bench rollout --device cuda --model '$smol' --batch 64 --max-new-tokens 512 --repeats 2 && REINFORGE_CUDA_DECODE_LINEAR=fused '$bin' bench rollout --device cuda --model '$smol' --batch 64 --max-new-tokens 512 --repeats 2"
  results decode-launch-ab
  # What each op of a decode step costs as the step runs — in a graph, beside its neighbours,
  # with dependent launches where asked — which no profile shows: the timed rollout again with
  # one op launched twice, for every op (bench rollout --decode-breakdown). SmolLM2 with every
  # decode knob on (the candidate for the roofline target), then with the defaults; then the
  # 1.5B shape's defaults.
  part decode-breakdown 150 sh -c "REINFORGE_CUDA_DECODE_LINEAR=fused REINFORGE_CUDA_DECODE_LAUNCH=dependent '$bin' bench rollout --device cuda --model '$smol' --batch 64 --max-new-tokens 512 --repeats 2 --decode-breakdown && '$bin' bench rollout --device cuda --model '$smol' --batch 64 --max-new-tokens 512 --repeats 2 --decode-breakdown"
  results decode-breakdown
  part decode-breakdown-qwen 120 "$bin" bench rollout --device cuda --model "$qwen" --batch 64 --max-new-tokens 512 --repeats 2 --decode-breakdown
  results decode-breakdown-qwen
  # The breakdowns' tables (per op: calls a step, µs per call, µs a step).
  for log in decode-breakdown decode-breakdown-qwen; do
    [ -f "$work/$log.log" ] && sed -n '/^decode step .* (plain runs before and after/,/^sum /p' "$work/$log.log" | sed "s/^/$log: /" >> "$summary"
  done
  pack
fi
# Where the benches' time went, op by op (one more run of each, timed kernel by kernel; the
# rollout's eager): the costliest ops of every profile written.
python3 - "$work" >> "$summary" 2>&1 <<'PY'
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
PY
failed=0
for name in "${!status_of[@]}"; do
  case "${status_of[$name]}" in failed | timed-out) failed=1 ;; esac
done
echo "done in $((SECONDS - t_start))s; exit $failed" >> "$summary"
pack
echo "results in $out (SUMMARY.txt, results.tgz; unpacked in $work)"
cat "$summary"
exit "$failed"
