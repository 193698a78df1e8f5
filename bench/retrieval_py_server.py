"""A Python BM25 retrieval server with Search-R1's API, for `bench/compare_retrieval.py`:
rank_bm25's BM25Okapi behind FastAPI + uvicorn, the stack a Search-R1 user would put up for
BM25 without Java (pyserini needs a JVM). Same request/response shapes as
search_r1/search/retrieval_server.py.

    pip install rank_bm25 fastapi uvicorn
    python bench/retrieval_py_server.py --corpus corpus.jsonl --port 8100 [--workers 1]
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


def build(corpus_path):
    docs = [json.loads(l) for l in open(corpus_path) if l.strip()]
    return docs, BM25Okapi([tokenize(d["contents"]) for d in docs])


def make_app(docs, bm25, default_topk):
    app = FastAPI()

    @app.post("/retrieve")
    def retrieve(req: QueryRequest):
        k = req.topk or default_topk
        out = []
        for q in req.queries:
            scores = bm25.get_scores(tokenize(q))
            top = scores.argsort()[::-1][:k]
            hits = [{"document": {"id": docs[i]["id"], "contents": docs[i]["contents"]}, "score": float(scores[i])} for i in top]
            out.append(hits if req.return_scores else [h["document"] for h in hits])
        return {"result": out}

    return app


if __name__ == "__main__":
    p = argparse.ArgumentParser()
    p.add_argument("--corpus", required=True)
    p.add_argument("--port", type=int, default=8100)
    p.add_argument("--topk", type=int, default=3)
    a = p.parse_args()
    docs, bm25 = build(a.corpus)
    print("indexed %d passages" % len(docs), flush=True)
    uvicorn.run(make_app(docs, bm25, a.topk), host="127.0.0.1", port=a.port, log_level="warning")
