//! Shared helpers: a fake tokenizer and temp files.

use serde_json::Value;

/// A stand-in for a chat template + tokenizer: 2 template tokens per message plus one
/// token per whitespace-separated word of content, and 1 for the generation prompt.
pub fn fake_encode(messages: &[Value]) -> Result<Vec<u32>, String> {
    let mut ids = Vec::new();
    for m in messages {
        ids.extend([1, 2]);
        let content = m["content"].as_str().ok_or("content is not a string")?;
        ids.extend(content.split_whitespace().map(|w| w.len() as u32 + 10));
    }
    ids.push(3);
    Ok(ids)
}

/// Writes `text` to a file named `name` in a fresh temp dir (kept alive by the returned guard).
pub fn temp_file(name: &str, text: &str) -> (tempfile::TempDir, std::path::PathBuf) {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join(name);
    std::fs::write(&path, text).unwrap();
    (dir, path)
}
