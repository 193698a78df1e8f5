//! Dense retrieval with all-MiniLM-L6-v2 (from PyPI): the index ranks by meaning, and its
//! scores are exactly the inner products of the encoder's query and passage embeddings
//! (an exact flat search, as FAISS `Flat` with inner product).

use std::sync::Arc;

use reinforge_engine::TextEncoder;
use reinforge_retrieval::index::{self, IndexOptions};
use reinforge_retrieval::{Passage, Retriever, RetrieverKind};

#[test]
fn dense_index_ranks_by_meaning_with_exact_inner_products() {
    let root = reinforge_assets::default_cache_root().unwrap();
    let model = reinforge_assets::fetch("all-minilm-l6-v2", &root).expect("fetch all-MiniLM-L6-v2 (needs PyPI)");
    let rows = [
        ("z", "\"Zürich\"\nZürich is the largest city in Switzerland and a centre of banking."),
        ("l", "\"Lima\"\nLima is the capital and largest city of Peru, on the Pacific coast."),
        ("c", "\"Croissant\"\nA croissant is a buttery, flaky pastry of Austrian origin."),
        ("v", "\"Volcano\"\nA volcano is a rupture in the crust of a planet through which lava escapes."),
    ];
    let dir = tempfile::tempdir().unwrap();
    let corpus = dir.path().join("c.jsonl");
    let text: String = rows.iter().map(|(id, c)| serde_json::to_string(&Passage { id: id.to_string(), contents: c.to_string() }).unwrap() + "\n").collect();
    std::fs::write(&corpus, text).unwrap();
    let opts = IndexOptions { dense_model: Some(model.clone()), threads: 1, ..Default::default() };
    let meta = index::build(&corpus, &dir.path().join("idx"), &opts, &|_| {}).unwrap();
    assert_eq!((meta.passages, meta.dense.as_ref().unwrap().dim), (4, 384));
    let r = Arc::new(Retriever::open(&dir.path().join("idx"), RetrieverKind::Dense).unwrap());

    let queries = ["Which South American capital lies on the ocean?", "a French breakfast pastry", "molten rock erupting from a mountain"];
    let hits = r.retrieve(&queries.iter().map(|q| q.to_string()).collect::<Vec<_>>(), 4).unwrap();
    let top: Vec<&str> = hits.iter().map(|h| h[0].0.id.as_str()).collect();
    assert_eq!(top, ["l", "c", "v"]);

    let enc = TextEncoder::load(&model).unwrap();
    let passages = enc.encode(&rows.iter().map(|(_, c)| *c).collect::<Vec<_>>()).unwrap();
    for (q, hs) in queries.iter().zip(&hits) {
        let qe = enc.encode(&[q]).unwrap().remove(0);
        for (p, score) in hs {
            let i = rows.iter().position(|(id, _)| *id == p.id).unwrap();
            let ip: f32 = qe.iter().zip(&passages[i]).map(|(a, b)| a * b).sum();
            assert!((ip - score).abs() < 1e-5, "{q} / {}: index {score}, encoder {ip}", p.id);
        }
        assert!(hs.windows(2).all(|w| w[0].1 >= w[1].1));
    }
}
