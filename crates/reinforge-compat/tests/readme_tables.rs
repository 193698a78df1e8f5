//! README's mapping tables ("Coming from verl / OpenRLHF") are generated from the rules: this
//! test fails when the two differ. `REINFORGE_BLESS=1 cargo test -p reinforge-compat --test
//! readme_tables` rewrites README's tables from the rules.

use std::path::PathBuf;

use reinforge_compat::{reference_table, Source};

fn readme() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../README.md")
}

/// The markers around a tool's generated table.
fn markers(source: Source) -> (String, String) {
    let tag = source.name().to_lowercase();
    (format!("<!-- mapping:{tag} (generated from crates/reinforge-compat; do not edit) -->\n"), format!("<!-- /mapping:{tag} -->"))
}

/// README with each tool's table put between its markers.
fn regenerated(text: &str) -> Result<String, String> {
    let mut out = text.to_string();
    for source in [Source::Verl, Source::OpenRlhf] {
        let (open, close) = markers(source);
        let start = out.find(&open).ok_or_else(|| format!("README has no `{}` marker", open.trim()))? + open.len();
        let end = start + out[start..].find(&close).ok_or_else(|| format!("README has no `{close}` marker"))?;
        out.replace_range(start..end, &format!("\n{}\n", reference_table(source)));
    }
    Ok(out)
}

#[test]
fn readme_mapping_tables_equal_the_rules() {
    let path = readme();
    let text = std::fs::read_to_string(&path).unwrap();
    let fresh = regenerated(&text).unwrap();
    if std::env::var("REINFORGE_BLESS").is_ok_and(|v| v == "1") {
        std::fs::write(&path, &fresh).unwrap();
        return;
    }
    if fresh != text {
        let first = text.lines().zip(fresh.lines()).position(|(a, b)| a != b).unwrap_or(0);
        panic!(
            "README's mapping tables differ from the rules (first at README line {}: {:?} vs {:?}); \
             run `REINFORGE_BLESS=1 cargo test -p reinforge-compat --test readme_tables`",
            first + 1,
            text.lines().nth(first),
            fresh.lines().nth(first)
        );
    }
}
