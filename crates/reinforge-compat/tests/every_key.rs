//! Every key of verl's own config (its composed `ppo_trainer.yaml` at commit b178a3cd, and the
//! keys verl 0.9.1 added; lists in tests/data, taken from verl's sources) and every OpenRLHF
//! flag gets an answer from the tables: mapped, not applicable, or refused — never "unknown".

use reinforge_compat::{rules, Source};

fn uncovered(source: Source, keys: &str) -> Vec<String> {
    keys.lines()
        .map(str::trim)
        .filter(|k| !k.is_empty() && !k.starts_with('#'))
        .filter(|k| rules::lookup(source.rules(), k).is_none())
        .map(str::to_string)
        .collect()
}

#[test]
fn every_key_of_verl_head_has_an_answer() {
    let missing = uncovered(Source::Verl, include_str!("../src/data/verl_keys_head.txt"));
    assert!(missing.is_empty(), "{} verl keys without a rule:\n{}", missing.len(), missing.join("\n"));
}

#[test]
fn every_key_verl_0_9_1_added_has_an_answer() {
    let missing = uncovered(Source::Verl, include_str!("../src/data/verl_keys_0.9.1.txt"));
    assert!(missing.is_empty(), "{} verl 0.9.1 keys without a rule:\n{}", missing.len(), missing.join("\n"));
}

#[test]
fn every_openrlhf_flag_has_an_answer() {
    let missing = uncovered(Source::OpenRlhf, include_str!("data/openrlhf_flags.txt"));
    assert!(missing.is_empty(), "{} OpenRLHF flags without a rule:\n{}", missing.len(), missing.join("\n"));
}

#[test]
fn every_openrlhf_0_11_flag_has_an_answer() {
    let flags = include_str!("data/openrlhf_flags_0.11.txt");
    let missing: Vec<&str> = flags
        .lines()
        .map(str::trim)
        .filter(|k| !k.is_empty() && !k.starts_with('#'))
        .filter(|k| rules::lookup(Source::OpenRlhf.rules(), &reinforge_compat::openrlhf::canonical(k)).is_none())
        .collect();
    assert!(missing.is_empty(), "{} OpenRLHF v0.11 flags without a rule:\n{}", missing.len(), missing.join("\n"));
}
