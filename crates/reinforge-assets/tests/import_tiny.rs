//! `import_gguf` on a hand-built tiny llama GGUF.

mod common;

use std::path::Path;

use common::*;
use reinforge_assets::{import_gguf, is_complete_import, sha256_file, AssetError};
use serde_json::{json, Value};

fn read_json(p: &Path) -> Value {
    serde_json::from_str(&std::fs::read_to_string(p).unwrap()).unwrap()
}

fn entries(dir: &Path) -> Vec<String> {
    let mut v: Vec<String> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    v.sort();
    v
}

#[test]
fn tiny_llama_imports_to_a_complete_hf_directory() {
    let tiny = TinyLlama::new();
    let dir = temp_dir("tiny");
    let gguf = dir.join("tiny.gguf");
    std::fs::write(&gguf, tiny.builder.build()).unwrap();
    let dest = dir.join("out").join("tiny-hf");

    let summary = import_gguf(&gguf, &dest).unwrap();
    assert_eq!(summary.dest, dest);
    assert_eq!(summary.tensors, tiny.expected.len());
    assert!(summary.tie_word_embeddings);
    assert_eq!(summary.source_sha256, sha256_file(&gguf).unwrap());
    assert!(is_complete_import(&dest, &summary.source_sha256));
    assert_eq!(
        entries(&dest),
        [
            "chat_template.jinja",
            "config.json",
            "generation_config.json",
            "model.safetensors",
            "reinforge-import.json",
            "tokenizer.json",
            "tokenizer_config.json",
        ]
    );
    // No temporary directory is left beside the result.
    assert_eq!(entries(dest.parent().unwrap()), ["tiny-hf"]);

    // Weights: names, shapes and values (q/k un-permuted), f32, no lm_head (tied).
    let bytes = std::fs::read(dest.join("model.safetensors")).unwrap();
    let st = safetensors::SafeTensors::deserialize(&bytes).unwrap();
    let mut names: Vec<String> = st.names().into_iter().map(String::from).collect();
    names.sort();
    let want_names: Vec<String> = tiny.expected.keys().cloned().collect();
    assert_eq!(names, want_names);
    for (name, (shape, values)) in &tiny.expected {
        let t = st.tensor(name).unwrap();
        assert_eq!(t.dtype(), safetensors::Dtype::F32, "{name}");
        assert_eq!(t.shape(), shape.as_slice(), "{name}");
        let got: Vec<f32> = t
            .data()
            .chunks(4)
            .map(|b| f32::from_le_bytes(b.try_into().unwrap()))
            .collect();
        assert_eq!(&got, values, "{name}");
    }
    let (_, meta) = safetensors::SafeTensors::read_metadata(&bytes).unwrap();
    assert_eq!(
        meta.metadata()
            .as_ref()
            .and_then(|m| m.get("format"))
            .map(String::as_str),
        Some("pt")
    );

    let config = read_json(&dest.join("config.json"));
    assert_eq!(
        config,
        json!({
            "architectures": ["LlamaForCausalLM"],
            "model_type": "llama",
            "hidden_act": "silu",
            "vocab_size": tiny.tokens.len(),
            "hidden_size": HIDDEN,
            "intermediate_size": INTER,
            "num_hidden_layers": LAYERS,
            "num_attention_heads": HEADS,
            "num_key_value_heads": KV_HEADS,
            "rms_norm_eps": 1e-6,
            "rope_theta": 10000.0,
            "rope_scaling": null,
            "max_position_embeddings": 128,
            "attention_bias": false,
            "tie_word_embeddings": true,
            "bos_token_id": 1,
            "eos_token_id": 2,
            "pad_token_id": 2,
        })
    );

    let tok = read_json(&dest.join("tokenizer.json"));
    let vocab = tok["model"]["vocab"].as_object().unwrap();
    assert_eq!(vocab.len(), tiny.tokens.len());
    for (id, t) in tiny.tokens.iter().enumerate() {
        assert_eq!(vocab[t], json!(id), "{t}");
    }
    assert_eq!(tok["model"]["merges"], json!(tiny.merges));
    let added = tok["added_tokens"].as_array().unwrap();
    assert_eq!(added.len(), 3);
    assert_eq!(added[2]["content"], "<|im_end|>");
    assert_eq!(added[2]["special"], true);
    assert_eq!(tok["pre_tokenizer"]["pretokenizers"][0]["type"], "Digits");

    let tc = read_json(&dest.join("tokenizer_config.json"));
    assert_eq!(tc["bos_token"], "<|im_start|>");
    assert_eq!(tc["eos_token"], "<|im_end|>");
    assert_eq!(tc["pad_token"], "<|im_end|>");
    assert_eq!(tc["add_bos_token"], false);
    assert_eq!(tc["chat_template"], CHAT_TEMPLATE);
    assert_eq!(
        std::fs::read_to_string(dest.join("chat_template.jinja")).unwrap(),
        CHAT_TEMPLATE
    );
    assert_eq!(
        read_json(&dest.join("generation_config.json")),
        json!({"bos_token_id": 1, "eos_token_id": 2, "pad_token_id": 2})
    );

    // An existing destination is never overwritten.
    let e = import_gguf(&gguf, &dest).unwrap_err();
    assert!(matches!(e, AssetError::DestinationExists { .. }), "{e}");
}

#[test]
fn untied_head_and_unsupported_inputs() {
    let dir = temp_dir("variants");

    // With output.weight the head is untied and exported as lm_head.weight.
    let mut tiny = TinyLlama::new();
    let vocab = tiny.tokens.len();
    let head = values(vocab * HIDDEN, 99);
    tiny.builder.tensor(
        "output.weight",
        &[HIDDEN as u64, vocab as u64],
        0,
        f32_bytes(&head),
    );
    let gguf = dir.join("untied.gguf");
    std::fs::write(&gguf, tiny.builder.build()).unwrap();
    let dest = dir.join("untied");
    let summary = import_gguf(&gguf, &dest).unwrap();
    assert!(!summary.tie_word_embeddings);
    assert_eq!(
        read_json(&dest.join("config.json"))["tie_word_embeddings"],
        false
    );
    let bytes = std::fs::read(dest.join("model.safetensors")).unwrap();
    let st = safetensors::SafeTensors::deserialize(&bytes).unwrap();
    assert_eq!(
        st.tensor("lm_head.weight").unwrap().shape(),
        [vocab, HIDDEN]
    );

    // Each failure names the file and the reason, and leaves no destination behind.
    let fail = |name: &str, edit: &dyn Fn(&mut GgufBuilder), needle: &str| {
        let mut tiny = TinyLlama::new();
        edit(&mut tiny.builder);
        let gguf = dir.join(format!("{name}.gguf"));
        std::fs::write(&gguf, tiny.builder.build()).unwrap();
        let dest = dir.join(name);
        let e = import_gguf(&gguf, &dest).unwrap_err().to_string();
        assert!(
            e.contains(needle) && e.contains(&format!("{name}.gguf")),
            "{name}: {e}"
        );
        assert!(!dest.exists(), "{name}: destination created");
    };
    let set = |key: &'static str, v: Val| {
        move |b: &mut GgufBuilder| {
            for kv in b.kv.iter_mut() {
                if kv.0 == key {
                    kv.1 = v.clone();
                }
            }
        }
    };
    fail(
        "arch",
        &set("general.architecture", s("gemma")),
        "architecture `gemma`",
    );
    fail(
        "spm",
        &set("tokenizer.ggml.model", s("llama")),
        "tokenizer model `llama`",
    );
    fail(
        "pre",
        &set("tokenizer.ggml.pre", s("mystery")),
        "pre-tokenizer `mystery`",
    );
    fail(
        "heads",
        &set("llama.attention.head_count_kv", Val::U32(4)),
        "shape",
    );
    fail(
        "missing",
        &|b: &mut GgufBuilder| b.tensors.retain(|t| t.name != "blk.1.ffn_up.weight"),
        "missing tensor for `model.layers.1.mlp.up_proj.weight`",
    );
    fail(
        "extra",
        &|b: &mut GgufBuilder| {
            b.tensor("rope_freqs.weight", &[8], 0, vec![0; 32]);
        },
        "rope_freqs",
    );
    fail(
        "q3k",
        &|b: &mut GgufBuilder| {
            let t = b
                .tensors
                .iter_mut()
                .find(|t| t.name == "blk.0.ffn_up.weight")
                .unwrap();
            t.ty = 11; // Q3_K: 110 bytes per 256 values
            t.data = vec![0; INTER * HIDDEN / 256 * 110];
        },
        "Q3_K",
    );
    fail(
        "nolayers",
        &|b: &mut GgufBuilder| b.kv.retain(|kv| kv.0 != "llama.block_count"),
        "missing metadata key `llama.block_count`",
    );
}
