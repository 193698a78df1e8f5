//! Shared by the tests that need Ray: find the Ray under test, or install it from PyPI into
//! `target/ray-venv` (the pin; the same place `.ci/run` uses) or `target/ray-venv-VERSION`
//! (another supported version, chosen with REINFORGE_TEST_RAY=VERSION, as CI does for the
//! oldest), so `cargo test --workspace` works on a fresh machine that has Python.

#![allow(dead_code)]

use std::path::PathBuf;
use std::process::Command;
use std::sync::Once;

/// The pinned version, read from the same file the binary reads.
pub fn pinned_version() -> String {
    let req = include_str!("../../../../python/requirements.txt");
    req.lines().find_map(|l| l.trim().strip_prefix("ray[default]==").map(str::to_string)).expect("ray pin in python/requirements.txt")
}

/// The Ray version these tests run against: REINFORGE_TEST_RAY, else the pin.
pub fn tested_version() -> String {
    std::env::var("REINFORGE_TEST_RAY").ok().filter(|v| !v.is_empty()).unwrap_or_else(pinned_version)
}

/// Whether the Ray under test has token auth (Ray ≥ 2.52).
pub fn tested_has_token_auth() -> bool {
    reinforge_cluster::ray::has_token_auth(&tested_version())
}

fn has_ray(version: &str) -> bool {
    Command::new("ray").arg("--version").output().is_ok_and(|o| String::from_utf8_lossy(&o.stdout).contains(version))
}

static INSTALL: Once = Once::new();

/// Makes the Ray under test the first on PATH for this process and its children, installing
/// it into a venv under `target/` when it is nowhere to be found; with a Ray older than token
/// auth it also sets REINFORGE_NO_AUTH=1 (the explicit opt-out every command then honours).
/// Panics with the fix when that fails.
pub fn ensure_ray() {
    INSTALL.call_once(|| {
        let version = tested_version();
        let name = if version == pinned_version() { "ray-venv".to_string() } else { format!("ray-venv-{version}") };
        let venv = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../target").join(name);
        let bin = venv.join("bin");
        let path = std::env::var("PATH").unwrap_or_default();
        if !bin.join("ray").exists() && !has_ray(&version) {
            eprintln!("installing Ray {version} into {} (once)", venv.display());
            let ok = Command::new("python3").args(["-m", "venv"]).arg(&venv).status().is_ok_and(|s| s.success())
                && Command::new(bin.join("pip")).args(["install", "-q"]).arg(format!("ray[default]=={version}")).status().is_ok_and(|s| s.success());
            assert!(ok, "could not install Ray {version}: `pip install 'ray[default]=={version}'` (needs python3 with venv and PyPI access)");
        }
        if bin.join("ray").exists() {
            // Set once, before any test thread spawns a Ray process.
            std::env::set_var("PATH", format!("{}:{path}", bin.display()));
        }
        if !tested_has_token_auth() {
            std::env::set_var("REINFORGE_NO_AUTH", "1");
        }
        assert!(has_ray(&version), "Ray {version} is not on PATH: `pip install 'ray[default]=={version}'`");
    });
}
