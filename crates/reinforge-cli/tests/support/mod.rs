//! Shared by the tests that need Ray: find the pinned Ray, or install it from PyPI into
//! `target/ray-venv` (the same place `.ci/run` uses), so `cargo test --workspace` works on a
//! fresh machine that has Python.

use std::path::PathBuf;
use std::process::Command;
use std::sync::Once;

/// The pinned version, read from the same file the binary reads.
pub fn pinned_version() -> String {
    let req = include_str!("../../../../python/requirements.txt");
    req.lines().find_map(|l| l.trim().strip_prefix("ray[default]==").map(str::to_string)).expect("ray pin in python/requirements.txt")
}

fn has_pinned_ray() -> bool {
    Command::new("ray").arg("--version").output().is_ok_and(|o| String::from_utf8_lossy(&o.stdout).contains(&pinned_version()))
}

static INSTALL: Once = Once::new();

/// Makes the pinned `ray` the first on PATH for this process and its children, installing it
/// into `target/ray-venv` when it is nowhere to be found. Panics with the fix when that fails.
pub fn ensure_ray() {
    INSTALL.call_once(|| {
        let venv = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../target/ray-venv");
        let bin = venv.join("bin");
        let path = std::env::var("PATH").unwrap_or_default();
        if !bin.join("ray").exists() && !has_pinned_ray() {
            eprintln!("installing Ray {} into {} (once)", pinned_version(), venv.display());
            let req = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../python/requirements.txt");
            let ok = Command::new("python3").args(["-m", "venv"]).arg(&venv).status().is_ok_and(|s| s.success())
                && Command::new(bin.join("pip")).args(["install", "-q", "-r"]).arg(&req).status().is_ok_and(|s| s.success());
            assert!(ok, "could not install Ray: run `pip install -r python/requirements.txt` (needs python3 with venv and PyPI access)");
        }
        if bin.join("ray").exists() {
            // SAFETY of intent: set once, before any test thread spawns a Ray process.
            std::env::set_var("PATH", format!("{}:{path}", bin.display()));
        }
        assert!(has_pinned_ray(), "Ray {} is not on PATH: `pip install -r python/requirements.txt`", pinned_version());
    });
}
