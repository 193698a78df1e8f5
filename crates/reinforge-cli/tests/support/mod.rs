//! Shared by the tests that need Ray: find the Ray under test, or install it from PyPI into
//! `target/ray-venv` (the pin; the same place `.ci/run` uses) or `target/ray-venv-VERSION`
//! (another supported version, chosen with REINFORGE_TEST_RAY=VERSION, as CI does for the
//! oldest), so `cargo test --workspace` works on a fresh machine that has Python.

#![allow(dead_code)]

use std::path::{Path, PathBuf};
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

/// A headless browser for the page tests: REINFORGE_CHROMIUM, else Debian's `chromium` (or
/// `chromium-browser`, `google-chrome`) on PATH.
pub fn chromium() -> Option<PathBuf> {
    if let Some(p) = std::env::var_os("REINFORGE_CHROMIUM").filter(|p| !p.is_empty()) {
        return Some(PathBuf::from(p));
    }
    let path = std::env::var_os("PATH").unwrap_or_default();
    ["chromium", "chromium-browser", "google-chrome"].iter().find_map(|name| std::env::split_paths(&path).map(|d| d.join(name)).find(|p| p.is_file()))
}

/// The page after its scripts ran, and what its console said.
pub struct PageDump {
    /// The serialised DOM.
    pub dom: String,
    /// Console messages (`console.*` and uncaught errors), one per line.
    pub console: Vec<String>,
}

fn headless(browser: &Path, extra: &[String], url: &str) -> std::process::Output {
    let profile = tempfile::tempdir().unwrap();
    // --no-sandbox: CI runs as root. Virtual time runs the page's timers (its 2 s polls)
    // without waiting for them in real time; it waits for the page's requests.
    let mut c = Command::new(browser);
    c.args(["--headless", "--no-sandbox", "--disable-gpu", "--no-first-run", "--hide-scrollbars", "--enable-logging=stderr", "--v=0", "--virtual-time-budget=6000"])
        .arg(format!("--user-data-dir={}", profile.path().display()))
        .args(extra)
        .arg(url);
    let o = c.output().unwrap_or_else(|e| panic!("cannot run {}: {e}", browser.display()));
    assert!(o.status.success(), "{} failed: {}", browser.display(), String::from_utf8_lossy(&o.stderr));
    o
}

/// Loads `url` in the browser and returns the DOM once its scripts ran for a few polls.
pub fn load_page(browser: &Path, url: &str) -> PageDump {
    let o = headless(browser, &["--window-size=1400,1000".into(), "--dump-dom".into()], url);
    let console = String::from_utf8_lossy(&o.stderr).lines().filter(|l| l.contains(":CONSOLE")).map(str::to_string).collect();
    PageDump { dom: String::from_utf8_lossy(&o.stdout).into_owned(), console }
}

/// A screenshot of `url` as a PNG at `out`.
pub fn screenshot(browser: &Path, url: &str, out: &Path, size: (u32, u32)) {
    let _ = std::fs::remove_file(out);
    headless(browser, &[format!("--window-size={},{}", size.0, size.1), format!("--screenshot={}", out.display())], url);
    let png = std::fs::read(out).unwrap_or_default();
    assert!(png.starts_with(b"\x89PNG") && png.len() > 20_000, "no screenshot at {} ({} bytes)", out.display(), png.len());
}

/// The page's chart groups (one chart each) with their number of points, from the DOM.
pub fn charts_in(dom: &str) -> std::collections::BTreeMap<String, usize> {
    let attr = |tag: &str, name: &str| -> Option<String> {
        let i = tag.find(&format!(" {name}=\""))? + name.len() + 3;
        Some(tag[i..i + tag[i..].find('"')?].to_string())
    };
    dom.split("<div ")
        .skip(1)
        .filter_map(|rest| {
            let tag = format!(" {}", &rest[..rest.find('>')?]);
            let tag = tag.as_str();
            if attr(tag, "class")?.split(' ').next()? != "chart" {
                return None;
            }
            Some((attr(tag, "data-group")?.replace("&amp;", "&"), attr(tag, "data-points")?.parse().ok()?))
        })
        .collect()
}

/// The groups the page must draw for a run's `metrics.jsonl` — verl's sections: a name's first
/// part, except `critic/<x>/...` — each with the number of steps that have a value in it.
pub fn expected_charts(metrics: &Path) -> std::collections::BTreeMap<String, usize> {
    let text = std::fs::read_to_string(metrics).unwrap();
    let mut steps: std::collections::BTreeMap<String, std::collections::BTreeSet<i64>> = Default::default();
    for line in text.lines().filter(|l| !l.trim().is_empty()) {
        let row: serde_json::Value = serde_json::from_str(line).unwrap();
        let step = row["step"].as_i64().unwrap();
        for (k, v) in row.as_object().unwrap() {
            if k == "step" || k == "timestamp" || !v.is_number() {
                continue;
            }
            let parts: Vec<&str> = k.split('/').collect();
            let group = if parts[0] == "critic" && parts.len() > 2 { format!("critic/{}", parts[1]) } else { parts[0].to_string() };
            steps.entry(group).or_default().insert(step);
        }
    }
    steps.into_iter().map(|(g, s)| (g, s.len())).collect()
}

/// The text content of the element with `id` (tags stripped), from the DOM.
pub fn text_of(dom: &str, id: &str) -> String {
    let Some(start) = dom.find(&format!("id=\"{id}\"")) else { return String::new() };
    let body = &dom[start..];
    let body = &body[body.find('>').map_or(0, |i| i + 1)..];
    // Up to the enclosing <details>'s end: every panel sits in one.
    let body = &body[..body.find("</details>").or_else(|| body.find("</section>")).unwrap_or(body.len())];
    let mut out = String::new();
    let mut in_tag = false;
    for ch in body.chars() {
        match ch {
            '<' => {
                in_tag = true;
                out.push(' ');
            }
            '>' => in_tag = false,
            c if !in_tag => out.push(c),
            _ => {}
        }
    }
    out.split_whitespace().collect::<Vec<_>>().join(" ")
}

/// A child process killed when the test ends, however it ends.
pub struct Killed(pub std::process::Child);

impl Drop for Killed {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// Reads `reader` in a thread: sends the rest of every line that starts with `prefix`, and
/// returns all lines at the end (for failure messages).
pub fn first_line(reader: impl std::io::Read + Send + 'static, prefix: &'static str) -> (std::sync::mpsc::Receiver<String>, std::thread::JoinHandle<Vec<String>>) {
    use std::io::BufRead;
    let (tx, rx) = std::sync::mpsc::channel();
    let t = std::thread::spawn(move || {
        let mut all = Vec::new();
        for line in std::io::BufReader::new(reader).lines().map_while(Result::ok) {
            if let Some(rest) = line.strip_prefix(prefix) {
                let _ = tx.send(rest.trim().to_string());
            }
            all.push(line);
        }
        all
    });
    (rx, t)
}

/// `reinforge dashboard RUN...` on a free port: the server (killed on drop) and its URL.
pub fn serve_dashboard(bin: &str, runs: &[&Path]) -> (Killed, String) {
    let mut c = Command::new(bin);
    c.args(["dashboard", "--port", "0"]).args(runs).stdout(std::process::Stdio::piped()).stderr(std::process::Stdio::null());
    let mut child = c.spawn().unwrap();
    let (rx, _) = first_line(child.stdout.take().unwrap(), "http://");
    let child = Killed(child);
    let url = rx.recv_timeout(std::time::Duration::from_secs(30)).expect("reinforge dashboard printed no URL");
    (child, format!("http://{url}"))
}

/// Whether the tests run as root (network namespaces need it).
pub fn is_root() -> bool {
    Command::new("id").arg("-u").output().is_ok_and(|o| String::from_utf8_lossy(&o.stdout).trim() == "0")
}

/// Runs `args`, panicking when it cannot start.
pub fn sh(args: &[&str]) -> std::process::Output {
    Command::new(args[0]).args(&args[1..]).output().unwrap_or_else(|e| panic!("{args:?}: {e}"))
}

/// Two test hosts: network namespaces joined by a veth pair; everything in them dies with the
/// guard.
pub struct Hosts {
    /// Host A's namespace (10.77.0.1).
    pub a: String,
    /// Host B's namespace (10.77.0.2).
    pub b: String,
}

/// Host A's address.
pub const IP_A: &str = "10.77.0.1";
/// Host B's address.
pub const IP_B: &str = "10.77.0.2";

impl Hosts {
    /// Both namespaces, linked, with their addresses up.
    pub fn up() -> Hosts {
        let id = std::process::id() % 100_000;
        let h = Hosts { a: format!("rfa{id}"), b: format!("rfb{id}") };
        let (va, vb) = h.links();
        for cmd in [
            vec!["ip", "netns", "add", &h.a],
            vec!["ip", "netns", "add", &h.b],
            vec!["ip", "link", "add", &va, "type", "veth", "peer", "name", &vb],
            vec!["ip", "link", "set", &va, "netns", &h.a],
            vec!["ip", "link", "set", &vb, "netns", &h.b],
            vec!["ip", "-n", &h.a, "addr", "add", "10.77.0.1/24", "dev", &va],
            vec!["ip", "-n", &h.b, "addr", "add", "10.77.0.2/24", "dev", &vb],
            vec!["ip", "-n", &h.a, "link", "set", "lo", "up"],
            vec!["ip", "-n", &h.b, "link", "set", "lo", "up"],
            vec!["ip", "-n", &h.a, "link", "set", &va, "up"],
            vec!["ip", "-n", &h.b, "link", "set", &vb, "up"],
        ] {
            let o = sh(&cmd);
            assert!(o.status.success(), "{cmd:?}: {}", String::from_utf8_lossy(&o.stderr));
        }
        h
    }

    /// The veth ends in A and in B.
    pub fn links(&self) -> (String, String) {
        let id = std::process::id() % 100_000;
        (format!("rfva{id}"), format!("rfvb{id}"))
    }

    /// A default route on each host through the link, as real hosts have: tools that find
    /// "this node's address" from the default route (Ray's) then find the host's.
    pub fn default_routes(&self) {
        let (va, vb) = self.links();
        for (ns, dev) in [(&self.a, &va), (&self.b, &vb)] {
            let o = sh(&["ip", "-n", ns, "route", "add", "default", "dev", dev]);
            assert!(o.status.success(), "default route in {ns}: {}", String::from_utf8_lossy(&o.stderr));
        }
    }

    /// kill -9 of every process in namespace `ns`.
    pub fn kill_all(ns: &str) {
        let pids = sh(&["ip", "netns", "pids", ns]);
        for pid in String::from_utf8_lossy(&pids.stdout).split_whitespace() {
            let _ = sh(&["kill", "-9", pid]);
        }
    }
}

impl Drop for Hosts {
    fn drop(&mut self) {
        for ns in [&self.a, &self.b] {
            Hosts::kill_all(ns);
        }
        std::thread::sleep(std::time::Duration::from_millis(500));
        for ns in [&self.a, &self.b] {
            let _ = sh(&["ip", "netns", "del", ns]);
        }
    }
}
