"""Reinforge's retrieval server against a Python BM25 server (rank_bm25 + FastAPI, as
bench/retrieval_py_server.py) on the same synthetic 100k-passage corpus, loaded by the same
client (`reinforge bench retrieval --url`) at 1, 16 and 256 concurrent clients. Prints both
JSON lines and the throughput ratio per level.

    pip install rank_bm25 bm25s scipy fastapi uvicorn
    python bench/compare_retrieval.py --reinforge target/release/reinforge [--passages 100000] [--seconds 10] [--engine bm25s]
"""
import argparse
import json
import os
import socket
import subprocess
import sys
import tempfile
import time


def wait_port(port, proc, timeout=1800):
    t0 = time.time()
    while time.time() - t0 < timeout:
        if proc.poll() is not None:
            sys.exit("the Python server exited with code %s" % proc.returncode)
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            return time.time() - t0
        except OSError:
            time.sleep(0.5)
    sys.exit("the Python server did not listen within %ss" % timeout)


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--reinforge", required=True)
    p.add_argument("--passages", type=int, default=100000)
    p.add_argument("--seconds", type=float, default=10)
    p.add_argument("--clients", default="1,16,256")
    p.add_argument("--port", type=int, default=8100)
    p.add_argument("--engine", choices=["rank_bm25", "bm25s"], default="rank_bm25", help="the Python server's BM25")
    a = p.parse_args()
    work = tempfile.mkdtemp(prefix="rf-retrieval-bench-")
    corpus = os.path.join(work, "corpus.jsonl")
    common = ["--clients", a.clients, "--seconds", str(a.seconds)]
    subprocess.run([a.reinforge, "bench", "retrieval", "--passages", str(a.passages), "--write-corpus", corpus], check=True)

    # The same corpus (regenerated from the same seed) and the same queries for both.
    ours = json.loads(subprocess.run([a.reinforge, "bench", "retrieval", "--passages", str(a.passages), "--work-dir", work] + common,
                                     check=True, capture_output=True, text=True).stdout)
    py = subprocess.Popen([sys.executable, os.path.join(os.path.dirname(__file__), "retrieval_py_server.py"),
                           "--corpus", corpus, "--port", str(a.port), "--engine", a.engine])
    try:
        index_s = wait_port(a.port, py)
        theirs = json.loads(subprocess.run([a.reinforge, "bench", "retrieval", "--url", "http://127.0.0.1:%d/retrieve" % a.port] + common,
                                           check=True, capture_output=True, text=True).stdout)
        theirs["index_seconds"] = index_s
    finally:
        py.terminate()
        py.wait()
    print(json.dumps(ours))
    print(json.dumps(theirs))
    for o, t in zip(ours["levels"], theirs["levels"]):
        print("%4d clients: reinforge %.0f q/s (p50 %.1f ms, p99 %.1f ms) | python %s %.1f q/s (p50 %.0f ms, p99 %.0f ms) | %.0fx"
              % (o["clients"], o["queries_per_s"], o["p50_ms"], o["p99_ms"], a.engine, t["queries_per_s"], t["p50_ms"], t["p99_ms"],
                 o["queries_per_s"] / max(t["queries_per_s"], 1e-9)))


if __name__ == "__main__":
    main()
