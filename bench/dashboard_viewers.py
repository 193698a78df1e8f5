#!/usr/bin/env python3
"""What watching a run costs the run: the quickstart trained with its page served and N viewers
polling it as the page does (every 2 s: new metrics rows, new samples, the status), against the
same run with the page served and nobody watching, and with the page off (trainer.dashboard =
false). Runs alternate (A B C, B C A, ...) so drift hits all three alike.

Prints, per configuration: the median and mean step time (timing_s/step of metrics.jsonl, the
first step left out), the run's wall time, the CPU seconds of the page's own threads (read from
/proc while it runs), the requests answered and their latency. The viewers run on this machine
and take CPU from the run too, so the step-time ratio is an upper bound on what remote browsers
cost; the page threads' CPU seconds are the server's own share.

    python3 bench/dashboard_viewers.py --bin target/debug/reinforge --viewers 32 --rounds 3

Standard library only.
"""

import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request


def page_thread_cpu(pid, seen):
    """Adds the CPU seconds of each thread named dashboard* of pid to `seen` (tid -> s)."""
    tick = os.sysconf("SC_CLK_TCK")
    try:
        tids = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return
    for tid in tids:
        try:
            with open(f"/proc/{pid}/task/{tid}/comm") as f:
                if not f.read().startswith("dashboard"):
                    continue
            with open(f"/proc/{pid}/task/{tid}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
            seen[tid] = (int(fields[11]) + int(fields[12])) / tick
        except (OSError, IndexError, ValueError):
            pass


def viewer(base, interval, stop, stats, proc):
    """Polls like the page: metrics and samples from where it left off, and the status."""
    state = {"metrics": [0, ""], "samples": [0, ""]}
    while not stop.is_set():
        t_poll = time.monotonic()
        for what in ("metrics", "samples", "status"):
            url = f"{base}api/runs/0/{what}"
            if what != "status":
                url += f"?since={state[what][0]}&file={state[what][1]}"
            t = time.monotonic()
            try:
                with urllib.request.urlopen(url, timeout=10) as r:
                    body = json.load(r)
                if what != "status":
                    state[what] = [0 if body["reset"] else body["next"], body["file"]]
                stats["latency"].append(time.monotonic() - t)
            except Exception:
                # The run ending closes its page: only failures while it runs count.
                if proc.poll() is not None or stop.is_set():
                    return
                stats["errors"] += 1
        stop.wait(max(0.0, interval - (time.monotonic() - t_poll)))


def one_run(args, config, steps):
    """One training run; returns its figures."""
    out = tempfile.mkdtemp(prefix="rf-dash-bench-")
    cmd = [args.bin, "train", args.config, f"trainer.total_steps={steps}", 'trainer.logger=["jsonl"]',
           f'trainer.default_local_dir="{out}"', "trainer.dashboard_port=0",
           f"trainer.dashboard={'false' if config == 'page off' else 'true'}"]
    t0 = time.monotonic()
    p = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    stats = {"latency": [], "errors": 0}
    stop = threading.Event()
    threads, cpu = [], {}
    log = []
    for line in p.stderr:
        log.append(line)
        m = re.match(r"dashboard: (http://\S+)", line)
        if m and config.startswith("viewers"):
            for _ in range(args.viewers):
                t = threading.Thread(target=viewer, args=(m.group(1), args.interval, stop, stats, p), daemon=True)
                t.start()
                threads.append(t)
        if m:
            # Sample the page threads' CPU time while the run lives.
            def sample():
                while p.poll() is None:
                    page_thread_cpu(p.pid, cpu)
                    time.sleep(0.2)
            threading.Thread(target=sample, daemon=True).start()
    p.wait()
    wall = time.monotonic() - t0
    stop.set()
    for t in threads:
        t.join()
    if p.returncode != 0:
        sys.exit(f"training failed ({config}):\n{''.join(log[-20:])}")
    steps_s = []
    with open(os.path.join(out, "metrics.jsonl")) as f:
        for line in f:
            row = json.loads(line)
            if "timing_s/step" in row and row["step"] > 1:
                steps_s.append(row["timing_s/step"])
    subprocess.run(["rm", "-rf", out], check=False)
    return {"steps": steps_s, "wall": wall, "page_cpu": sum(cpu.values()), "latency": stats["latency"], "errors": stats["errors"]}


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--bin", default="target/release/reinforge")
    ap.add_argument("--config", default="examples/quickstart.toml")
    ap.add_argument("--steps", type=int, default=100)
    ap.add_argument("--viewers", type=int, default=32)
    ap.add_argument("--interval", type=float, default=2.0, help="seconds between a viewer's polls (the page's: 2)")
    ap.add_argument("--rounds", type=int, default=3)
    args = ap.parse_args()
    if not os.access(args.bin, os.X_OK):
        sys.exit(f"{args.bin}: no reinforge binary there (cargo build --release -p reinforge-cli, or --bin PATH)")
    configs = [f"viewers ({args.viewers})", "page, no viewers", "page off"]
    results = {c: {"steps": [], "wall": [], "page_cpu": [], "latency": [], "errors": 0} for c in configs}
    for r in range(args.rounds):
        order = configs[r % 3:] + configs[:r % 3]
        for c in order:
            res = one_run(args, c, args.steps)
            agg = results[c]
            agg["steps"] += res["steps"]
            agg["wall"].append(res["wall"])
            agg["page_cpu"].append(res["page_cpu"])
            agg["latency"] += res["latency"]
            agg["errors"] += res["errors"]
            print(f"round {r + 1} {c}: median step {statistics.median(res['steps']) * 1000:.1f} ms, wall {res['wall']:.1f} s, "
                  f"page threads {res['page_cpu']:.2f} CPU s, {len(res['latency'])} requests", flush=True)
    base = statistics.median(results["page off"]["steps"])
    print(f"\n{args.steps} steps of {args.config}, {args.rounds} rounds, {os.cpu_count()} CPUs; viewers poll every {args.interval} s")
    print("| configuration | median step | mean step | vs page off | median wall | page threads CPU s/run | requests/run | request p50 / p99 | errors |")
    print("| --- | --- | --- | --- | --- | --- | --- | --- | --- |")
    for c in configs:
        a = results[c]
        med = statistics.median(a["steps"])
        lat = sorted(a["latency"])
        lat_s = f"{lat[len(lat) // 2] * 1000:.1f} / {lat[int(len(lat) * 0.99)] * 1000:.1f} ms" if lat else "-"
        print(f"| {c} | {med * 1000:.1f} ms | {statistics.mean(a['steps']) * 1000:.1f} ms | {med / base:.3f} | "
              f"{statistics.median(a['wall']):.1f} s | {statistics.median(a['page_cpu']):.2f} | {len(lat) // args.rounds} | {lat_s} | {a['errors']} |")


if __name__ == "__main__":
    main()
