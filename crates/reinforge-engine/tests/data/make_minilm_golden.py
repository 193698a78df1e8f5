"""Writes minilm_golden.json: sentence-transformers' embeddings of a few texts with
all-MiniLM-L6-v2, the reference the engine's BERT encoder is checked against
(tests/encoder.rs: cosine >= 0.999 for every text).

Run once, where torch is installed (CI does not install it):
    pip install torch sentence-transformers==6.2.0
    reinforge model fetch all-minilm-l6-v2
    python make_minilm_golden.py ~/.cache/reinforge/models/all-minilm-l6-v2 > minilm_golden.json
"""
import json
import sys

import sentence_transformers
import torch
from sentence_transformers import SentenceTransformer

TEXTS = [
    "What is the capital of France?",
    "\"Evan Morris\"\nEvan L. Morris (January 26, 1977 – July 9, 2015) was a lobbyist for Genentech and its parent corporation Roche in Washington.",
    "query: who wrote the declaration of independence",
    "Zürich, Genève and Bern: Switzerland's cities; 京都市 is Kyoto.",
    "",
    "a",
    # Over max_seq_length (256 word pieces): truncated, keeping [SEP].
    " ".join(f"token{i} of a very long passage about retrieval-augmented reinforcement learning" for i in range(60)),
]

model = SentenceTransformer(sys.argv[1], device="cpu")
with torch.no_grad():
    emb = model.encode(TEXTS, batch_size=len(TEXTS), convert_to_numpy=True, normalize_embeddings=False)
json.dump(
    {
        "about": "all-MiniLM-L6-v2 embeddings by sentence-transformers %s, torch %s (make_minilm_golden.py)"
        % (sentence_transformers.__version__, torch.__version__),
        "max_seq_length": model.max_seq_length,
        "texts": TEXTS,
        "embeddings": [[float(x) for x in row] for row in emb],
    },
    sys.stdout,
)
