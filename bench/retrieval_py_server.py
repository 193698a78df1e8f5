"""A Python BM25 retrieval server with Search-R1's API, for `bench/compare_retrieval.py`:
BM25 behind FastAPI + uvicorn, the stack a Search-R1 user would put up for BM25 without Java
(pyserini needs a JVM). `--engine rank_bm25` (BM25Okapi, the common choice; scores every
document per query) or `--engine bm25s` (sparse-matrix BM25, much faster). Same request and
response shapes as search_r1/search/retrieval_server.py.

    pip install rank_bm25 bm25s scipy fastapi uvicorn
    python bench/retrieval_py_server.py --corpus corpus.jsonl --port 8100 [--engine bm25s]
"""
import argparse
import json
import re
from typing import List, Optional

import uvicorn
from fastapi import FastAPI
from pydantic import BaseModel
from rank_bm25 import BM25Okapi

TOKEN = re.compile(r"\w+")


def tokenize(text):
    return TOKEN.findall(text.lower())


class QueryRequest(BaseModel):
    queries: List[str]
    topk: Optional[int] = None
    return_scores: bool = False


def build(corpus_path, engine):
    """The documents and a function from (query, k) to [(row, score)]."""
    docs = [json.loads(l) for l in open(corpus_path) if l.strip()]
    if engine == "bm25s":
        import bm25s

        retriever = bm25s.BM25()
        retriever.index([tokenize(d["contents"]) for d in docs], show_progress=False)

        def search(q, k):
            rows, scores = retriever.retrieve([tokenize(q) or ["\0"]], k=k, show_progress=False, n_threads=1)
            return [(int(r), float(s)) for r, s in zip(rows[0], scores[0])]
    else:
        bm25 = BM25Okapi([tokenize(d["contents"]) for d in docs])

        def search(q, k):
            scores = bm25.get_scores(tokenize(q))
            return [(int(i), float(scores[i])) for i in scores.argsort()[::-1][:k]]

    return docs, search


def make_app(docs, search, default_topk):
    app = FastAPI()

    @app.post("/retrieve")
    def retrieve(req: QueryRequest):
        k = req.topk or default_topk
        out = []
        for q in req.queries:
            hits = [{"document": {"id": docs[i]["id"], "contents": docs[i]["contents"]}, "score": s} for i, s in search(q, k)]
            out.append(hits if req.return_scores else [h["document"] for h in hits])
        return {"result": out}

    return app


if __name__ == "__main__":
    p = argparse.ArgumentParser()
    p.add_argument("--corpus", required=True)
    p.add_argument("--port", type=int, default=8100)
    p.add_argument("--topk", type=int, default=3)
    p.add_argument("--engine", choices=["rank_bm25", "bm25s"], default="rank_bm25")
    a = p.parse_args()
    docs, search = build(a.corpus, a.engine)
    print("indexed %d passages with %s" % (len(docs), a.engine), flush=True)
    uvicorn.run(make_app(docs, search, a.topk), host="127.0.0.1", port=a.port, log_level="warning")
