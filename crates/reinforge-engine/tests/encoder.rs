//! The BERT encoder (dense retrieval) against sentence-transformers: all-MiniLM-L6-v2 from its
//! PyPI wheel, every text's embedding within cosine 0.999 of the reference
//! (tests/data/minilm_golden.json, written by make_minilm_golden.py), in one padded batch and
//! one text at a time.

use reinforge_engine::TextEncoder;

fn golden() -> serde_json::Value {
    serde_json::from_str(include_str!("data/minilm_golden.json")).unwrap()
}

fn minilm() -> TextEncoder {
    let root = reinforge_assets::default_cache_root().expect("cache root");
    let dir = reinforge_assets::fetch("all-minilm-l6-v2", &root).expect("fetch all-MiniLM-L6-v2 (needs PyPI)");
    TextEncoder::load(&dir).expect("load all-MiniLM-L6-v2")
}

fn cosine(a: &[f32], b: &[f64]) -> f64 {
    let dot: f64 = a.iter().zip(b).map(|(x, y)| *x as f64 * y).sum();
    let na = a.iter().map(|x| (*x as f64).powi(2)).sum::<f64>().sqrt();
    let nb = b.iter().map(|y| y * y).sum::<f64>().sqrt();
    dot / (na * nb)
}

#[test]
fn minilm_embeddings_match_sentence_transformers() {
    let g = golden();
    let enc = minilm();
    assert_eq!(enc.dim(), 384);
    assert_eq!(enc.max_len() as u64, g["max_seq_length"].as_u64().unwrap());
    let texts: Vec<&str> = g["texts"].as_array().unwrap().iter().map(|t| t.as_str().unwrap()).collect();
    let want: Vec<Vec<f64>> = g["embeddings"].as_array().unwrap().iter().map(|r| r.as_array().unwrap().iter().map(|x| x.as_f64().unwrap()).collect()).collect();
    // The long text is truncated to max_seq_length tokens, keeping its final [SEP].
    let long = enc.token_ids(texts[6]).unwrap();
    assert_eq!(long.len(), 256);
    assert_eq!(*long.last().unwrap(), enc.token_ids("").unwrap()[1], "ends with [SEP]");

    let batch = enc.encode(&texts).unwrap();
    let mut worst = 1.0f64;
    for (i, (got, w)) in batch.iter().zip(&want).enumerate() {
        let c = cosine(got, w);
        worst = worst.min(c);
        assert!(c >= 0.999, "text {i} ({:?}): cosine {c} in a batch", texts[i]);
        let norm = got.iter().map(|x| (*x as f64).powi(2)).sum::<f64>().sqrt();
        assert!((norm - 1.0).abs() < 1e-5, "normalised: {norm}");
    }
    eprintln!("all-MiniLM-L6-v2 vs sentence-transformers: lowest cosine {worst:.7} over {} texts", texts.len());
    // Padding changes nothing: each text alone gives the same vector.
    for (i, t) in texts.iter().enumerate() {
        let alone = enc.encode(&[t]).unwrap().remove(0);
        let c = cosine(&alone, &batch[i].iter().map(|x| *x as f64).collect::<Vec<_>>());
        assert!(c > 0.99999, "text {i}: alone vs in a batch: cosine {c}");
    }
}

#[test]
fn not_a_bert_directory_is_one_line() {
    let dir = tempfile::tempdir().unwrap();
    let e = TextEncoder::load(dir.path()).err().unwrap().to_string();
    assert!(e.contains("config.json") && e.contains("BERT-family"), "{e}");
    std::fs::write(dir.path().join("config.json"), r#"{"model_type": "llama", "hidden_size": 8, "num_hidden_layers": 1, "num_attention_heads": 2, "intermediate_size": 8, "vocab_size": 10, "max_position_embeddings": 8, "hidden_act": "silu"}"#).unwrap();
    let e = TextEncoder::load(dir.path()).err().unwrap().to_string();
    assert!(e.contains("model_type `llama`"), "{e}");
}
