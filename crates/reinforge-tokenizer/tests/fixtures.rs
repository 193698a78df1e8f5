//! Exactness against the shared fixtures: chat-template goldens, SmolLM2 prompts, Qwen ids.

use std::path::{Path, PathBuf};

use reinforge_tokenizer::{ChatTemplate, ChatTokenizer, RenderOptions, Tokenizer, TokenizerError};
use serde_json::{json, Value};

/// `shared/fixtures` sits beside the repository checkout (override with REINFORGE_FIXTURES).
fn fixtures() -> PathBuf {
    let dir = std::env::var_os("REINFORGE_FIXTURES")
        .map(PathBuf::from)
        .unwrap_or_else(|| Path::new(env!("CARGO_MANIFEST_DIR")).join("../../../shared/fixtures"));
    assert!(
        dir.is_dir(),
        "fixtures not found at {} (set REINFORGE_FIXTURES)",
        dir.display()
    );
    dir
}

fn load_json(path: &Path) -> Value {
    serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap()
}

fn ids(v: &Value) -> Vec<u32> {
    v.as_array()
        .unwrap()
        .iter()
        .map(|x| x.as_u64().unwrap() as u32)
        .collect()
}

/// A fresh empty directory under cargo's per-test-target scratch space.
fn scratch(name: &str) -> PathBuf {
    let dir = Path::new(env!("CARGO_TARGET_TMPDIR")).join(format!("reinforge-tokenizer-{name}"));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

fn qwen_tokenizer() -> Tokenizer {
    Tokenizer::from_file(fixtures().join("chat_templates/qwen2_5_tokenizer.json")).unwrap()
}

#[test]
fn chat_template_goldens_render_and_encode_exactly() {
    let base = fixtures().join("chat_templates");
    let golden = load_json(&base.join("golden.json"));
    let mut cases = 0;
    for t in golden["templates"].as_array().unwrap() {
        let source =
            std::fs::read_to_string(base.join(t["template_file"].as_str().unwrap())).unwrap();
        assert_eq!(
            source,
            t["template"].as_str().unwrap(),
            "template file differs from golden text"
        );
        let mut template = ChatTemplate::new(source).unwrap();
        for (k, v) in t["render_context"]["special_tokens"].as_object().unwrap() {
            template = template.with_variable(k, v.clone());
        }
        let tok = Tokenizer::from_file(base.join(t["tokenizer_file"].as_str().unwrap())).unwrap();
        for case in t["cases"].as_array().unwrap() {
            let label = format!("{}/{}", t["name"], case["id"]);
            let opts = RenderOptions {
                add_generation_prompt: case["add_generation_prompt"].as_bool().unwrap(),
                tools: case.get("tools").and_then(Value::as_array).cloned(),
                ..Default::default()
            };
            let messages = case["messages"].as_array().unwrap();
            let rendered = template.render(messages, &opts).unwrap();
            assert_eq!(
                rendered,
                case["expected"].as_str().unwrap(),
                "{label}: rendered text"
            );
            let encoded = tok.encode(&rendered, false).unwrap();
            assert_eq!(encoded, ids(&case["expected_ids"]), "{label}: ids");
            assert_eq!(
                tok.decode(&encoded, false).unwrap(),
                rendered,
                "{label}: round trip"
            );
            cases += 1;
        }
    }
    assert_eq!(cases, 13);
}

#[test]
fn smollm2_prompts_from_model_dir() {
    let dir = fixtures().join("smollm2");
    let chat = ChatTokenizer::load_from_dir(&dir).unwrap();
    let tok = chat.tokenizer();
    assert_eq!(tok.vocab_size(), 49152);
    // No tokenizer_config.json here: ids come from config.json, names from the vocabulary.
    assert_eq!(
        (tok.bos_id(), tok.eos_id(), tok.pad_id()),
        (Some(1), Some(2), Some(2))
    );
    assert_eq!(tok.stop_ids().iter().copied().collect::<Vec<_>>(), vec![2]);
    assert_eq!(chat.template().variables()["eos_token"], "<|im_end|>");
    assert_eq!(chat.template().variables()["bos_token"], "<|im_start|>");

    let golden = load_json(&dir.join("golden.json"));
    let prompts = golden["prompts"].as_array().unwrap();
    assert_eq!(prompts.len(), 3);
    for p in prompts {
        let label = p["id"].as_str().unwrap();
        let opts = RenderOptions::generation(p["add_generation_prompt"].as_bool().unwrap());
        let messages = p["messages"].as_array().unwrap();
        let rendered = chat.apply_chat_template(messages, &opts).unwrap();
        assert_eq!(
            rendered,
            p["rendered"].as_str().unwrap(),
            "{label}: rendered"
        );
        let want = ids(&p["input_ids"]);
        assert_eq!(
            tok.encode(&rendered, false).unwrap(),
            want,
            "{label}: encode"
        );
        assert_eq!(
            chat.encode_chat(messages, &opts).unwrap(),
            want,
            "{label}: encode_chat"
        );
        assert_eq!(
            tok.decode(&want, false).unwrap(),
            rendered,
            "{label}: round trip"
        );

        let g = &p["greedy"];
        let new_ids = ids(&g["new_ids"]);
        assert_eq!(
            tok.decode(&new_ids, false).unwrap(),
            g["text"].as_str().unwrap(),
            "{label}: greedy text"
        );
        let until = g["eos_index"]
            .as_u64()
            .map_or(new_ids.len(), |i| i as usize);
        assert_eq!(
            tok.decode(&new_ids[..until], false).unwrap(),
            g["text_until_eos"].as_str().unwrap(),
            "{label}: text until eos"
        );
        // The first stop id, if any, is where eos_index says.
        let first_stop = new_ids.iter().position(|&id| tok.is_stop(id));
        assert_eq!(
            first_stop,
            g["eos_index"].as_u64().map(|i| i as usize),
            "{label}: eos index"
        );
    }
}

#[test]
fn qwen_known_ids_and_special_decoding() {
    let tok = qwen_tokenizer();
    assert_eq!(
        tok.encode("Hello, world!", false).unwrap(),
        vec![9707, 11, 1879, 0]
    );
    for (text, id) in [("system", 8948), ("user", 872), ("assistant", 77091)] {
        assert_eq!(tok.encode(text, false).unwrap(), vec![id], "{text}");
    }
    assert_eq!(tok.vocab_size(), 151_665);
    assert_eq!(tok.token_to_id("<|im_end|>"), Some(151645));
    assert_eq!(tok.id_to_token(151643).as_deref(), Some("<|endoftext|>"));
    // No post-processor adds a BOS for Qwen, so both modes agree.
    assert_eq!(
        tok.encode("Hello, world!", true).unwrap(),
        vec![9707, 11, 1879, 0]
    );

    let ids = tok
        .encode("<|im_start|>user\nhi<tool_call><|im_end|>", false)
        .unwrap();
    assert_eq!(ids.first(), Some(&151644));
    assert_eq!(
        tok.decode(&ids, false).unwrap(),
        "<|im_start|>user\nhi<tool_call><|im_end|>"
    );
    // <tool_call> is an added but non-special token: skipping specials keeps it.
    assert_eq!(tok.decode(&ids, true).unwrap(), "user\nhi<tool_call>");
}

/// A Qwen2.5-style model directory: config objects, a named template list, generation stops.
fn qwen_model_dir(name: &str, tokenizer_config: Value) -> PathBuf {
    let dir = scratch(name);
    std::fs::copy(
        fixtures().join("chat_templates/qwen2_5_tokenizer.json"),
        dir.join("tokenizer.json"),
    )
    .unwrap();
    std::fs::write(
        dir.join("tokenizer_config.json"),
        tokenizer_config.to_string(),
    )
    .unwrap();
    std::fs::write(
        dir.join("generation_config.json"),
        r#"{"eos_token_id": [151645, 151643], "bos_token_id": 151643}"#,
    )
    .unwrap();
    dir
}

#[test]
fn qwen_model_dir_special_tokens_and_named_templates() {
    let base = fixtures().join("chat_templates");
    let qwen = std::fs::read_to_string(base.join("qwen2_5.jinja")).unwrap();
    let dir = qwen_model_dir(
        "qwen-named",
        json!({
            "bos_token": null,
            "eos_token": {"__type": "AddedToken", "content": "<|im_end|>", "special": true},
            "pad_token": "<|endoftext|>",
            "additional_special_tokens": ["<|im_start|>", {"content": "<|im_end|>"}],
            "chat_template": [
                {"name": "default", "template": qwen},
                {"name": "tool_use", "template": "TOOLS:{{ tools|length }}"}
            ]
        }),
    );
    let chat = ChatTokenizer::load_from_dir(&dir).unwrap();
    let tok = chat.tokenizer();
    assert_eq!(tok.eos_id(), Some(151645));
    assert_eq!(tok.pad_id(), Some(151643));
    // tokenizer_config says bos is null: HF leaves it unset even though generation_config has one.
    assert_eq!(tok.bos_id(), None);
    assert!(!chat.template().variables().contains_key("bos_token"));
    assert_eq!(
        tok.stop_ids().iter().copied().collect::<Vec<_>>(),
        vec![151643, 151645]
    );
    assert_eq!(
        chat.template().variables()["additional_special_tokens"],
        json!(["<|im_start|>", "<|im_end|>"])
    );

    let golden = load_json(&base.join("golden.json"));
    let case = &golden["templates"][1]["cases"][0];
    let opts = RenderOptions::generation(true);
    let rendered = chat
        .apply_chat_template(case["messages"].as_array().unwrap(), &opts)
        .unwrap();
    assert_eq!(rendered, case["expected"].as_str().unwrap());
    // With tools, HF switches to the "tool_use" template.
    let with_tools = RenderOptions {
        tools: Some(vec![json!({}), json!({})]),
        ..opts
    };
    assert_eq!(
        chat.apply_chat_template(&[], &with_tools).unwrap(),
        "TOOLS:2"
    );
}

#[test]
fn separate_template_file_overrides_config() {
    let dir = qwen_model_dir(
        "qwen-jinja",
        json!({"eos_token": "<|im_end|>", "chat_template": "CONFIG"}),
    );
    std::fs::write(dir.join("chat_template.jinja"), "FILE {{ eos_token }}\n").unwrap();
    let chat = ChatTokenizer::load_from_dir(&dir).unwrap();
    // One trailing newline of the template is dropped, as jinja2 does.
    assert_eq!(
        chat.apply_chat_template(&[], &RenderOptions::default())
            .unwrap(),
        "FILE <|im_end|>"
    );
}

#[test]
fn missing_files_give_actionable_errors() {
    let nowhere = scratch("missing").join("nope");
    let err = ChatTokenizer::load_from_dir(&nowhere).unwrap_err();
    assert!(matches!(err, TokenizerError::Missing { .. }), "{err}");
    assert!(
        err.to_string().contains(&nowhere.display().to_string()),
        "{err}"
    );

    let empty = scratch("empty");
    let err = ChatTokenizer::load_from_dir(&empty)
        .unwrap_err()
        .to_string();
    assert!(
        err.contains(&empty.join("tokenizer.json").display().to_string()),
        "{err}"
    );
    assert!(err.starts_with("tokenizer not found"), "{err}");

    let err = Tokenizer::from_file(empty.join("tokenizer.json"))
        .unwrap_err()
        .to_string();
    assert!(err.contains("tokenizer.json"), "{err}");

    let dir = qwen_model_dir("no-template", json!({"eos_token": "<|im_end|>"}));
    let err = ChatTokenizer::load_from_dir(&dir).unwrap_err();
    assert!(matches!(err, TokenizerError::NoChatTemplate { .. }));
    let msg = err.to_string();
    assert!(
        msg.contains(&dir.display().to_string()) && msg.contains("pass a template file"),
        "{msg}"
    );
    assert!(!msg.contains('\n'));

    // The fix the message suggests works.
    let chat = ChatTokenizer::load_from_dir_with_template(
        &dir,
        fixtures().join("chat_templates/qwen2_5.jinja"),
    )
    .unwrap();
    let out = chat
        .apply_chat_template(
            &[json!({"role": "user", "content": "hi"})],
            &RenderOptions::default(),
        )
        .unwrap();
    assert!(out.ends_with("<|im_start|>user\nhi<|im_end|>\n"), "{out}");
    let err = ChatTokenizer::load_from_dir_with_template(&dir, dir.join("missing.jinja"))
        .unwrap_err()
        .to_string();
    assert!(
        err.starts_with("chat template not found") && err.contains("missing.jinja"),
        "{err}"
    );
}

#[test]
fn corrupt_json_names_file_and_position() {
    let dir = scratch("corrupt-tokenizer");
    std::fs::write(dir.join("tokenizer.json"), "{\"version\": ").unwrap();
    let err = Tokenizer::from_dir(&dir).unwrap_err();
    let msg = err.to_string();
    assert!(matches!(err, TokenizerError::Json { .. }), "{msg}");
    assert!(
        msg.contains("tokenizer.json") && msg.contains("line 1"),
        "{msg}"
    );
    assert!(!msg.contains('\n'), "{msg}");

    let dir = qwen_model_dir("corrupt-config", json!({}));
    std::fs::write(dir.join("tokenizer_config.json"), "{\"eos_token\": \"x\",}").unwrap();
    let msg = ChatTokenizer::load_from_dir(&dir).unwrap_err().to_string();
    assert!(
        msg.contains("tokenizer_config.json") && msg.contains("line 1 column"),
        "{msg}"
    );

    let dir = qwen_model_dir("bad-eos", json!({}));
    std::fs::write(
        dir.join("generation_config.json"),
        r#"{"eos_token_id": "2"}"#,
    )
    .unwrap();
    let msg = Tokenizer::from_dir(&dir).unwrap_err().to_string();
    assert!(
        msg.contains("generation_config.json") && msg.contains("eos_token_id"),
        "{msg}"
    );
}

#[test]
fn template_raising_is_an_error() {
    // The check many templates (Llama 2, Mistral) use to enforce role alternation.
    let template = ChatTemplate::new(
        "{% for m in messages %}{% if (m['role'] == 'user') != (loop.index0 % 2 == 0) %}\
         {{ raise_exception('Conversation roles must alternate user/assistant/user/assistant/...') }}\
         {% endif %}{{ m['content'] }}{% endfor %}",
    )
    .unwrap();
    let ok = [
        json!({"role": "user", "content": "a"}),
        json!({"role": "assistant", "content": "b"}),
    ];
    assert_eq!(
        template.render(&ok, &RenderOptions::default()).unwrap(),
        "ab"
    );
    let bad = [json!({"role": "assistant", "content": "b"})];
    let err = template
        .render(&bad, &RenderOptions::default())
        .unwrap_err();
    assert!(
        matches!(&err, TokenizerError::Raised(m) if m.starts_with("Conversation roles must alternate")),
        "{err}"
    );
    // Runtime errors that are not raise_exception stay template errors.
    let err = ChatTemplate::new("{{ 1 + messages }}")
        .unwrap()
        .render(&[], &RenderOptions::default())
        .unwrap_err();
    assert!(matches!(err, TokenizerError::Template(_)), "{err}");
}
