#!/usr/bin/env python3
"""PyTorch + transformers CPU baseline for Reinforge's two headline benchmarks.

  rollout: SmolLM2-135M-Instruct, f32, batch of 16 chat-templated prompts (left padded),
           128 sampled new tokens per row (temperature 1.0, top_p 1.0, top_k off, no early
           stop), KV cache on, under torch.inference_mode().
           tokens_per_s = 16 * 128 / median wall seconds of one `generate` call.
  train:   one optimizer step = forward + backward + AdamW (lr 1e-5, weight decay 0.01)
           on 8 x 256 random token ids (fixed seed), causal-LM loss, f32, eager PyTorch
           (no torch.compile).
           tokens_per_s = 8 * 256 / median step seconds.

Each benchmark runs in its own child process, so `peak_rss_mb` (the whole process's peak
resident set, model load included, like `/usr/bin/time -v` reports) belongs to that
benchmark alone. One JSON object per benchmark goes to stdout; progress goes to stderr.

With `--reinforge BIN` the Rust engine is run on the same machine with the same
parameters and a final JSON line gives both throughputs and ratio = reinforge / pytorch.

With `--device cuda` both run on the GPU: PyTorch's `generate` in bf16 with SDPA, and a train
step under bf16 autocast with SDPA and fused AdamW (f32 master weights); Reinforge's CUDA
engine in bf16 (`reinforge bench ... --device cuda`). A model directory with only
config.json is benched with random weights on both sides (random prompt ids when it has no
tokenizer).

See bench/README.md for how to install a PyTorch that runs here and for examples.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import platform
import resource
import statistics
import subprocess
import sys
import time

# The 16 rollout prompts. The Rust bench reads the identical list from bench/prompts.json
# (a JSON array of strings, written by `--write-prompts`). Each is sent as one user message
# through the model's chat template with the generation prompt appended.
PROMPTS = [
    "What is the capital of France?",
    "Explain photosynthesis in one sentence.",
    "Write a haiku about the ocean.",
    "What is 17 times 23?",
    "Give me three tips for learning a new language.",
    "Why is the sky blue?",
    "Translate 'good morning' into Spanish.",
    "What does a compiler do?",
    "Name a famous painting by Leonardo da Vinci.",
    "How many legs does a spider have?",
    "Suggest a name for a friendly robot.",
    "What is the boiling point of water in Fahrenheit?",
    "Summarize the plot of Romeo and Juliet briefly.",
    "Is a tomato a fruit or a vegetable?",
    "Write a Python function that reverses a string.",
    "What causes the seasons on Earth?",
]

HERE = os.path.dirname(os.path.abspath(__file__))
PROMPTS_JSON = os.path.join(HERE, "prompts.json")

INSTALL_HINT = (
    "compare_hf.py needs torch and transformers: python3 -m venv /work/venv-bench && "
    "/work/venv-bench/bin/pip install torch==2.15.0 transformers==5.23.0 accelerate gguf "
    "(details in bench/README.md)"
)


def log(msg: str) -> None:
    print(f"[compare_hf] {msg}", file=sys.stderr, flush=True)


def write_prompts(path: str = PROMPTS_JSON) -> None:
    with open(path, "w", encoding="utf-8") as f:
        json.dump(PROMPTS, f, indent=2, ensure_ascii=False)
        f.write("\n")
    log(f"wrote {len(PROMPTS)} prompts to {path}")


def check_prompts_file() -> None:
    try:
        with open(PROMPTS_JSON, encoding="utf-8") as f:
            on_disk = json.load(f)
    except FileNotFoundError:
        log(f"warning: {PROMPTS_JSON} missing; run with --write-prompts")
        return
    if on_disk != PROMPTS:
        log(f"warning: {PROMPTS_JSON} differs from PROMPTS in this script; "
            "run with --write-prompts so both sides use the same list")


def rss_mb() -> float:
    """Current resident set (VmRSS) in MiB."""
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024.0
    return float("nan")


def peak_rss_mb() -> float:
    """Peak resident set of this whole process in MiB (Linux ru_maxrss is KiB)."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0


def has_weights(path: str) -> bool:
    return any(os.path.isfile(os.path.join(path, f))
               for f in ("model.safetensors", "model.safetensors.index.json", "pytorch_model.bin"))


def load_model(args, torch):
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

    kw = {"attn_implementation": args.attn}
    if args.gguf:
        src_dir, fname = os.path.split(os.path.abspath(args.gguf))
        kw["gguf_file"] = fname
        tok_kw = {"gguf_file": fname}
        source = args.gguf
    else:
        src_dir = args.model
        tok_kw = {}
        source = args.model
    # On the GPU, rollout weights are bf16; training keeps f32 master weights under autocast.
    dtype = torch.bfloat16 if (args.device == "cuda" and args.child == "rollout") else torch.float32
    t0 = time.perf_counter()
    tok = None  # a config-only directory: random prompt ids
    # transformers 5 returns an empty tokenizer (no vocabulary, no chat template) for a
    # directory with only config.json rather than raising: look for the files first.
    if args.gguf or any(os.path.isfile(os.path.join(src_dir, f)) for f in ("tokenizer.json", "tokenizer_config.json")):
        try:
            tok = AutoTokenizer.from_pretrained(src_dir, **tok_kw)
        except Exception as e:  # a malformed tokenizer benches with random prompt ids
            log(f"{src_dir}: tokenizer not loaded ({type(e).__name__}: {e}); random prompt ids")
            tok = None
        if tok is not None and not getattr(tok, "chat_template", None):
            log(f"{src_dir}: tokenizer without a chat template; random prompt ids")
            tok = None
    if args.model and not has_weights(args.model):
        cfg = AutoConfig.from_pretrained(src_dir)
        torch.manual_seed(0)
        # On the GPU the random init runs there: a 1.5B model's init on the host takes longer
        # than its benchmark.
        with torch.device("cuda" if args.device == "cuda" else "cpu"):
            model = AutoModelForCausalLM.from_config(cfg, attn_implementation=args.attn, torch_dtype=dtype)
        source += " (random init)"
    else:
        try:  # transformers >= 4.56 spells it `dtype`; older ones only know `torch_dtype`
            model = AutoModelForCausalLM.from_pretrained(src_dir, dtype=dtype, **kw)
        except TypeError:
            model = AutoModelForCausalLM.from_pretrained(src_dir, torch_dtype=dtype, **kw)
    model.to(dtype)
    if args.device == "cuda":
        model.to("cuda")
    log(f"loaded {source} in {time.perf_counter() - t0:.1f}s "
        f"({sum(p.numel() for p in model.parameters()) / 1e6:.1f}M params, {dtype}, "
        f"attn={args.attn}, rss {rss_mb():.0f} MiB)")
    return tok, model, source


def sync(torch, args) -> None:
    if args.device == "cuda":
        torch.cuda.synchronize()


def cpu_model() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def common_fields(args, torch, transformers, source):
    return {
        "impl": "pytorch",
        "model": source,
        "model_format": "gguf" if args.gguf else "hf_dir",
        "threads": torch.get_num_threads(),
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "attn": args.attn,
        "cpu": cpu_model(),
        "nproc": os.cpu_count(),
        "device": torch.cuda.get_device_name() if args.device == "cuda" else "cpu",
    }


def bench_rollout(args, torch, transformers) -> dict:
    tok, model, source = load_model(args, torch)
    model.eval()
    prompts = (PROMPTS * ((args.rollout_batch + len(PROMPTS) - 1) // len(PROMPTS)))[: args.rollout_batch]
    if tok is not None:
        tok.padding_side = "left"
        if tok.pad_token is None:
            tok.pad_token = tok.eos_token
        texts = [
            tok.apply_chat_template([{"role": "user", "content": p}], tokenize=False,
                                    add_generation_prompt=True)
            for p in prompts
        ]
        enc = tok(texts, return_tensors="pt", padding=True, add_special_tokens=False)
        pad_id = tok.pad_token_id
    else:
        gen = torch.Generator().manual_seed(1)
        ids = torch.randint(1, max(2, model.config.vocab_size - 256), (len(prompts), 32), generator=gen)
        enc = {"input_ids": ids, "attention_mask": torch.ones_like(ids)}
        texts = prompts
        pad_id = 0
    if args.device == "cuda":
        enc = {k: v.to("cuda") for k, v in enc.items()}
    lens = enc["attention_mask"].sum(dim=1).tolist()
    n_new = args.new_tokens
    gen_kw = dict(
        do_sample=True,
        temperature=1.0,
        top_p=1.0,
        top_k=0,  # generation_config defaults to top_k=50; the benchmark samples the full distribution
        max_new_tokens=n_new,
        min_new_tokens=n_new,  # EOS masked: every row generates exactly n_new tokens
        use_cache=True,
        pad_token_id=pad_id,
    )
    log(f"rollout: batch {len(texts)}, prompt tokens min/max {min(lens)}/{max(lens)}, "
        f"{n_new} new tokens, {args.warmup} warmup + {args.runs} timed runs")
    times, cpu = [], []
    with torch.inference_mode():
        for i in range(args.warmup + args.runs):
            warm = i < args.warmup
            # A warm-up loads kernels and sizes the allocator's pools: a few tokens do that.
            want = min(n_new, 16) if warm else n_new
            kw = dict(gen_kw, max_new_tokens=want, min_new_tokens=want)
            torch.manual_seed(args.seed + i)
            sync(torch, args)
            c0, t0 = time.process_time(), time.perf_counter()
            out = model.generate(**enc, **kw)
            sync(torch, args)
            dt, dc = time.perf_counter() - t0, time.process_time() - c0
            got = out.shape[1] - enc["input_ids"].shape[1]
            if got != want:
                raise SystemExit(f"rollout generated {got} tokens per row, expected {want}")
            kind = "warmup" if warm else "run"
            log(f"  {kind} {i}: {dt:.2f}s  ({len(texts) * want / dt:.1f} new tok/s)")
            if i >= args.warmup:
                times.append(dt)
                cpu.append(dc)
    if args.show_sample and tok is not None:
        log("sample completion: " + repr(tok.decode(out[0, enc["input_ids"].shape[1]:])))
    secs = statistics.median(times)
    res = {"bench": "rollout"}
    res.update(common_fields(args, torch, transformers, source))
    res.update({
        "batch": len(texts),
        "new_tokens": n_new,
        "prompt_tokens_max": int(max(lens)),
        "seconds": secs,
        "tokens_per_s": len(texts) * n_new / secs,
        "runs": times,
        "cpu_seconds": statistics.median(cpu),
        "peak_rss_mb": round(peak_rss_mb(), 1),
        "dtype": "bf16" if args.device == "cuda" else "f32",
    })
    if args.device == "cuda":
        res["peak_device_memory_gb"] = torch.cuda.max_memory_allocated() / 1e9
    return res


def bench_train(args, torch, transformers) -> dict:
    _, model, source = load_model(args, torch)
    model.train()
    if hasattr(model.config, "use_cache"):
        model.config.use_cache = False
    b, s = args.train_batch, args.seq_len
    gen = torch.Generator().manual_seed(args.seed)
    ids = torch.randint(0, model.config.vocab_size, (b, s), generator=gen)
    if args.device == "cuda":
        ids = ids.to("cuda")
    opt_kw = {"lr": 1e-5, "weight_decay": 0.01}
    if args.device == "cuda" and args.adamw == "default":
        args.adamw = "fused"
    if args.adamw == "foreach":
        opt_kw["foreach"] = True
    elif args.adamw == "fused":
        opt_kw["fused"] = True
    opt = torch.optim.AdamW(model.parameters(), **opt_kw)
    log(f"train: batch {b} x seq {s}, AdamW({args.adamw}), "
        f"{args.warmup} warmup + {args.runs} timed steps")
    times, cpu, losses = [], [], []
    checkpointing = False

    def step():
        opt.zero_grad(set_to_none=True)
        # labels == input_ids: transformers shifts internally, mean CE over all b*(s-1) targets
        with torch.autocast("cuda", dtype=torch.bfloat16, enabled=args.device == "cuda"):
            loss = model(input_ids=ids, labels=ids).loss
        loss.backward()
        opt.step()
        return loss

    for i in range(args.warmup + args.runs):
        sync(torch, args)
        c0, t0 = time.process_time(), time.perf_counter()
        try:
            loss = step()
        except torch.OutOfMemoryError:
            # A 1.5B model's activations at 16 x 1024 do not fit an 80 GB GPU without
            # recomputation: the baseline is then the same step with gradient checkpointing.
            if checkpointing or args.device != "cuda":
                raise
            loss = None
        if loss is None:
            # Outside the handler, whose traceback still holds the failed step's tensors.
            opt.zero_grad(set_to_none=True)
            gc.collect()
            torch.cuda.empty_cache()
            torch.cuda.reset_peak_memory_stats()
            model.gradient_checkpointing_enable()
            checkpointing = True
            log("  out of GPU memory: again with gradient checkpointing")
            sync(torch, args)
            c0, t0 = time.process_time(), time.perf_counter()
            loss = step()
        sync(torch, args)
        dt, dc = time.perf_counter() - t0, time.process_time() - c0
        lv = float(loss.detach())
        kind = "warmup" if i < args.warmup else "step"
        log(f"  {kind} {i}: {dt:.2f}s  loss {lv:.4f}  ({b * s / dt:.1f} tok/s)")
        if i >= args.warmup:
            times.append(dt)
            cpu.append(dc)
            losses.append(lv)
    secs = statistics.median(times)
    res = {"bench": "train"}
    res.update(common_fields(args, torch, transformers, source))
    res.update({
        "batch": b,
        "seq_len": s,
        "seconds": secs,
        "tokens_per_s": b * s / secs,
        "runs": times,
        "cpu_seconds": statistics.median(cpu),
        "loss": losses[-1],
        "adamw": args.adamw,
        "gradient_checkpointing": checkpointing,
        "peak_rss_mb": round(peak_rss_mb(), 1),
        "dtype": "bf16 autocast" if args.device == "cuda" else "f32",
    })
    if args.device == "cuda":
        res["peak_device_memory_gb"] = torch.cuda.max_memory_allocated() / 1e9
    return res


def export_hf(args, torch) -> None:
    """Write an HF-style directory (config.json, model.safetensors, tokenizer files with the
    chat template in tokenizer_config.json) from --gguf, for tools that want --model DIR."""
    from safetensors.torch import save_file

    tok, model, _ = load_model(args, torch)
    out = args.export_hf
    os.makedirs(out, exist_ok=True)
    sd = model.state_dict()
    if getattr(model.config, "tie_word_embeddings", False):
        sd.pop("lm_head.weight", None)
    save_file({k: v.detach().contiguous() for k, v in sd.items()},
              os.path.join(out, "model.safetensors"), metadata={"format": "pt"})
    cfg = model.config.to_dict()
    cfg.pop("quantization_config", None)
    cfg["torch_dtype"] = "float32"
    cfg.pop("dtype", None)
    cfg["architectures"] = [type(model).__name__]
    rope = cfg.get("rope_parameters") or {}
    if "rope_theta" not in cfg and "rope_theta" in rope:  # transformers 5 nests it; 4.x readers want it flat
        cfg["rope_theta"] = rope["rope_theta"]
    with open(os.path.join(out, "config.json"), "w") as f:
        json.dump(cfg, f, indent=2, sort_keys=True)
    tok.save_pretrained(out)
    tc_path = os.path.join(out, "tokenizer_config.json")
    with open(tc_path) as f:
        tc = json.load(f)
    if tok.chat_template and "chat_template" not in tc:
        tc["chat_template"] = tok.chat_template
        with open(tc_path, "w") as f:
            json.dump(tc, f, indent=2)
    log(f"exported {args.gguf} to {out}")


def last_json_line(text: str):
    for line in reversed(text.strip().splitlines()):
        line = line.strip()
        if not line.startswith("{"):
            continue
        try:
            return json.loads(line)
        except json.JSONDecodeError:
            continue
    return None


def child_argv(args, bench: str) -> list:
    argv = [sys.executable, os.path.abspath(__file__), "--child", bench,
            "--threads", str(args.threads), "--runs", str(args.runs),
            "--warmup", str(args.warmup), "--seed", str(args.seed), "--attn", args.attn,
            "--rollout-batch", str(args.rollout_batch), "--new-tokens", str(args.new_tokens),
            "--train-batch", str(args.train_batch), "--seq-len", str(args.seq_len),
            "--adamw", args.adamw, "--device", args.device]
    argv += ["--gguf", args.gguf] if args.gguf else ["--model", args.model]
    if args.show_sample:
        argv.append("--show-sample")
    return argv


def run_reinforge(args, bench: str, extra=()):
    if bench == "rollout":
        cmd = [args.reinforge, "bench", "rollout", "--model", args.model,
               "--batch", str(args.rollout_batch), "--max-new-tokens", str(args.new_tokens),
               "--prompts", PROMPTS_JSON]
    else:
        cmd = [args.reinforge, "bench", "train", "--model", args.model,
               "--batch", str(args.train_batch), "--seq-len", str(args.seq_len)]
    if args.device == "cuda":
        cmd += ["--device", "cuda", "--dtype", "bf16"]
    if args.reinforge_profile and not extra:
        cmd += ["--profile", f"{args.reinforge_profile}-{bench}.json"]
    cmd += list(extra)
    log("running " + " ".join(cmd))
    t0 = time.perf_counter()
    try:
        p = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=sys.stderr, text=True,
                           timeout=args.side_timeout)
    except OSError as e:
        return None, f"could not run {args.reinforge}: {e}"
    except subprocess.TimeoutExpired:
        return None, f"no result within --side-timeout {args.side_timeout}s"
    wall = time.perf_counter() - t0
    res = last_json_line(p.stdout)
    if res is None:
        return None, f"exit {p.returncode} after {wall:.1f}s, no JSON on stdout"
    if p.returncode != 0:
        # The results came out before what failed after them (e.g. --profile): keep them.
        res["reinforge_error"] = f"exit {p.returncode} after printing its results (see its stderr above)"
    return res, None


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    src = ap.add_argument_group("model (one of)")
    src.add_argument("--model", metavar="DIR",
                     help="local HF directory (config.json, model.safetensors, tokenizer files), "
                          "e.g. ~/.cache/reinforge/models/smollm2-135m-instruct")
    src.add_argument("--gguf", metavar="FILE",
                     help="GGUF file instead (transformers dequantizes it to f32; needs the "
                          "gguf and accelerate packages)")
    ap.add_argument("--bench", default="all", choices=["all", "rollout", "train"])
    ap.add_argument("--runs", type=int, default=3, help="timed runs; the median is reported")
    ap.add_argument("--warmup", type=int, default=1, help="untimed runs first")
    ap.add_argument("--threads", type=int, default=os.cpu_count(), help="torch.set_num_threads")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--attn", default="sdpa", choices=["sdpa", "eager"],
                    help="transformers attention implementation (sdpa is its default)")
    ap.add_argument("--rollout-batch", type=int, default=16)
    ap.add_argument("--new-tokens", type=int, default=128)
    ap.add_argument("--train-batch", type=int, default=8)
    ap.add_argument("--seq-len", type=int, default=256)
    ap.add_argument("--adamw", default="default", choices=["default", "foreach", "fused"],
                    help="torch.optim.AdamW implementation (default: torch's own choice)")
    ap.add_argument("--device", default="cpu", choices=["cpu", "cuda"],
                    help="cuda: both sides on the GPU in bf16 (see the module docstring)")
    ap.add_argument("--reinforge", metavar="BIN",
                    help="also run BIN bench rollout/train and print the ratio reinforge/pytorch")
    ap.add_argument("--reinforge-profile", metavar="PREFIX",
                    help="with --reinforge --device cuda: after its timed runs, Reinforge times "
                         "every kernel of one more run and writes PREFIX-rollout.json / "
                         "PREFIX-train.json (its costliest ops also go to stderr)")
    ap.add_argument("--side-timeout", type=float, metavar="S",
                    help="seconds each benchmark process (either side's) may take; one that "
                         "takes longer is that side's error, and the other side still runs")
    ap.add_argument("--no-isolate", action="store_true",
                    help="run the benchmarks in this process (peak RSS then accumulates)")
    ap.add_argument("--show-sample", action="store_true",
                    help="print one decoded rollout completion to stderr")
    ap.add_argument("--write-prompts", action="store_true",
                    help=f"write PROMPTS to {PROMPTS_JSON} and exit")
    ap.add_argument("--export-hf", metavar="DIR",
                    help="with --gguf: write an HF directory (safetensors, config, tokenizer) and exit")
    ap.add_argument("--child", choices=["rollout", "train"], help=argparse.SUPPRESS)
    args = ap.parse_args()

    if args.write_prompts:
        write_prompts()
        return 0
    if bool(args.model) == bool(args.gguf):
        ap.error("give exactly one of --model DIR or --gguf FILE")
    if args.model:
        args.model = os.path.abspath(os.path.expanduser(args.model))
        if not os.path.isfile(os.path.join(args.model, "config.json")):
            ap.error(f"{args.model} has no config.json")
    if args.gguf and not os.path.isfile(args.gguf):
        ap.error(f"{args.gguf} not found")
    if args.reinforge and not args.model:
        ap.error("--reinforge needs --model DIR (the Rust engine reads an HF directory; "
                 "make one from a GGUF with --gguf FILE --export-hf DIR)")
    if args.reinforge_profile and not (args.reinforge and args.device == "cuda"):
        ap.error("--reinforge-profile needs --reinforge BIN and --device cuda")
    if args.export_hf and not args.gguf:
        ap.error("--export-hf needs --gguf FILE")

    try:
        import torch
        import transformers
    except ImportError as e:
        print(f"{INSTALL_HINT} [{e}]", file=sys.stderr)
        return 2

    torch.set_num_threads(max(1, args.threads))
    if args.export_hf:
        export_hf(args, torch)
        return 0

    if args.child:
        if args.child == "rollout":
            check_prompts_file()
        fn = bench_rollout if args.child == "rollout" else bench_train
        print(json.dumps(fn(args, torch, transformers)), flush=True)
        return 0

    benches = ["rollout", "train"] if args.bench == "all" else [args.bench]
    check_prompts_file()
    log(f"torch {torch.__version__}, transformers {transformers.__version__}, "
        f"threads {torch.get_num_threads()}/{os.cpu_count()}, "
        f"loadavg {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
    # Reinforge first, then PyTorch, bench by bench: each side's results are printed as soon
    # as they exist, and a failure of one side leaves the other's numbers (a run cut short by
    # a time limit still has them).
    summary = {"bench": "compare", "model": args.model, "threads": args.threads}
    rc = 0
    for bench in benches:
        entry = {}
        if args.reinforge:
            rres, err = run_reinforge(args, bench)
            if err:
                log(f"reinforge {bench}: {err}")
                entry["reinforge_error"] = err
                rc = 1
            else:
                print(json.dumps(rres), flush=True)
                entry["reinforge_tokens_per_s"] = rres.get("tokens_per_s")
                entry["reinforge_peak_rss_mb"] = rres.get("peak_rss_mb")
                for k in ("hbm_roofline_fraction", "hbm_roofline_fraction_3tbs", "mfu", "peak_device_memory_gb", "decode_step_ms",
                          "gradient_checkpointing"):
                    if rres.get(k) is not None:
                        entry["reinforge_" + k] = rres[k]
                if rres.get("reinforge_error"):
                    entry["reinforge_error"] = rres["reinforge_error"]
                    rc = 1
        load_before = os.getloadavg()[0]
        if args.no_isolate:
            args.child = bench
            fn = bench_rollout if bench == "rollout" else bench_train
            res = fn(args, torch, transformers)
            args.child = None
        else:
            # Memory a failed (out-of-memory) step leaves in pieces stays usable for the retry.
            env = dict(os.environ, PYTORCH_CUDA_ALLOC_CONF="expandable_segments:True")
            try:
                p = subprocess.run(child_argv(args, bench), stdout=subprocess.PIPE,
                                   stderr=sys.stderr, text=True, env=env, timeout=args.side_timeout)
                res, failure = last_json_line(p.stdout), f"exit {p.returncode} (see its stderr above)"
                if p.returncode != 0:
                    res = None
            except subprocess.TimeoutExpired:
                res, failure = None, f"no result within --side-timeout {args.side_timeout}s"
            if res is None:
                log(f"pytorch {bench} benchmark failed: {failure}")
                entry["pytorch_error"] = failure
                rc = 1
        if res is not None:
            res["loadavg_1m"] = [round(load_before, 2), round(os.getloadavg()[0], 2)]
            print(json.dumps(res), flush=True)
            entry["pytorch_tokens_per_s"] = res["tokens_per_s"]
            entry["pytorch_peak_rss_mb"] = res["peak_rss_mb"]
            entry["pytorch_peak_device_memory_gb"] = res.get("peak_device_memory_gb")
            if res.get("gradient_checkpointing"):
                entry["pytorch_gradient_checkpointing"] = True
                # PyTorch needed recomputation to fit: Reinforge again with it too, so the
                # ratio compares the same work (the first figure stays, as the one without).
                if args.reinforge and entry.get("reinforge_tokens_per_s") and not entry.get("reinforge_gradient_checkpointing"):
                    rres, err = run_reinforge(args, bench, ["--gradient-checkpointing"])
                    if err or not rres.get("tokens_per_s"):
                        entry["reinforge_recompute_error"] = err or "no tokens_per_s"
                    else:
                        print(json.dumps(rres), flush=True)
                        base = entry["pytorch_tokens_per_s"]
                        entry["ratio_without_recompute"] = entry["reinforge_tokens_per_s"] / base
                        entry["reinforge_tokens_per_s"] = rres["tokens_per_s"]
                        entry["reinforge_gradient_checkpointing"] = True
                        if rres.get("mfu") is not None:
                            entry["reinforge_mfu_with_recompute"] = rres["mfu"]
        tps, base = entry.get("reinforge_tokens_per_s"), entry.get("pytorch_tokens_per_s")
        if args.reinforge:
            entry["ratio"] = (tps / base) if (tps and base) else None
        summary[bench] = entry
    if args.reinforge:
        print(json.dumps(summary), flush=True)
    return rc

if __name__ == "__main__":
    sys.exit(main())
