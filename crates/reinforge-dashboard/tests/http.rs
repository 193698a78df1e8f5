//! The page's server over a real socket: the API reads a run directory from an offset, unknown
//! paths are 404 and nothing outside the compiled-in assets is ever read, the token is
//! required when set, and beyond loopback it must be set.

use std::path::Path;
use std::time::Duration;

use reinforge_dashboard::{Background, DashboardOptions};
use serde_json::{json, Value};

fn agent() -> ureq::Agent {
    ureq::Agent::config_builder().http_status_as_error(false).timeout_global(Some(Duration::from_secs(20))).build().into()
}

fn get(url: &str, token: Option<&str>) -> (u16, String) {
    let mut req = agent().get(url);
    if let Some(t) = token {
        req = req.header("authorization", &format!("Bearer {t}"));
    }
    let mut r = req.call().unwrap();
    (r.status().as_u16(), r.body_mut().read_to_string().unwrap_or_default())
}

fn run_dir(dir: &Path) {
    std::fs::create_dir_all(dir.join("checkpoints/global_step_2")).unwrap();
    std::fs::write(dir.join("checkpoints/global_step_2/manifest.json"), "{}").unwrap();
    std::fs::write(dir.join("checkpoints/latest"), "global_step_2\n").unwrap();
    std::fs::write(dir.join("metrics.jsonl"), "{\"step\":1,\"timestamp\":1.0,\"critic/score/mean\":0.1}\n{\"step\":2,\"timestamp\":2.0,\"critic/score/mean\":0.2}\n").unwrap();
    std::fs::write(dir.join("config.toml"), "[trainer]\nexperiment_name = \"x\"\n").unwrap();
    std::fs::write(dir.join("log.txt"), "2026-11-25T00:00:00Z started\n").unwrap();
    std::fs::write(dir.join("placement.json"), r#"{"groups": [{"group": "policy", "roles": ["actor"], "ranks": [{"rank": 0, "node_ip": "10.0.0.2", "pid": 7}]}]}"#).unwrap();
}

fn opts(token: Option<&str>) -> DashboardOptions {
    DashboardOptions { host: "127.0.0.1".into(), port: 0, any_port_if_taken: false, token: token.map(str::to_string) }
}

#[test]
fn the_api_reads_the_run_directory() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("run");
    run_dir(&dir);
    let page = Background::start(vec![dir.clone()], opts(None)).unwrap();
    let base = format!("http://{}", page.addr);
    let (st, html) = get(&format!("{base}/"), None);
    assert!(st == 200 && html.contains("/assets/uPlot.iife.min.js") && html.contains("/assets/app.js"));
    for asset in ["app.js", "app.css", "uPlot.iife.min.js", "uPlot.min.css", "uPlot-LICENSE.txt"] {
        assert_eq!(get(&format!("{base}/assets/{asset}"), None).0, 200, "{asset}");
    }
    let (_, runs) = get(&format!("{base}/api/runs"), None);
    let runs: Value = serde_json::from_str(&runs).unwrap();
    assert_eq!(runs[0]["name"], "run");
    let (_, m) = get(&format!("{base}/api/runs/0/metrics?since=1"), None);
    let mut m: Value = serde_json::from_str(&m).unwrap();
    assert!(m.as_object_mut().unwrap().remove("file").unwrap().as_str().is_some_and(|f| !f.is_empty()), "the file's identity");
    assert_eq!(m, json!({"rows": [{"step": 2, "timestamp": 2.0, "critic/score/mean": 0.2}], "next": 2, "reset": false}));
    let (_, s) = get(&format!("{base}/api/runs/0/status"), None);
    let s: Value = serde_json::from_str(&s).unwrap();
    assert_eq!(s["checkpoints"], json!([{"step": 2, "name": "global_step_2", "complete": true, "latest": true, "time": s["checkpoints"][0]["time"]}]));
    assert_eq!(s["placement"]["groups"][0]["ranks"][0]["node_ip"], "10.0.0.2");
    assert_eq!(s["log"], json!(["2026-11-25T00:00:00Z started"]));
    assert!(s["config"].as_str().unwrap().contains("experiment_name"));
    // A row appended while the page is open arrives at the next poll.
    std::fs::write(dir.join("metrics.jsonl"), std::fs::read_to_string(dir.join("metrics.jsonl")).unwrap() + "{\"step\":3,\"critic/score/mean\":0.3}\n").unwrap();
    let (_, m) = get(&format!("{base}/api/runs/0/metrics?since=2"), None);
    assert_eq!(serde_json::from_str::<Value>(&m).unwrap()["rows"], json!([{"step": 3, "critic/score/mean": 0.3}]));
}

#[test]
fn unknown_paths_are_404_and_nothing_else_is_read() {
    let tmp = tempfile::tempdir().unwrap();
    run_dir(&tmp.path().join("run"));
    std::fs::write(tmp.path().join("secret.txt"), "do not serve").unwrap();
    let page = Background::start(vec![tmp.path().join("run")], opts(None)).unwrap();
    let base = format!("http://{}", page.addr);
    for path in [
        "/nope",
        "/assets/",
        "/assets/../Cargo.toml",
        "/assets/..%2f..%2fCargo.toml",
        "/assets/%2e%2e/src/lib.rs",
        "/api/runs/0/../../secret.txt",
        "/api/runs/0/metrics.jsonl",
        "/api/runs/7/metrics",
        "/api/runs/0/config.toml",
        "/run/secret.txt",
        "/secret.txt",
    ] {
        let (st, body) = get(&format!("{base}{path}"), None);
        assert!(st == 404 || st == 400, "{path}: {st} {body}");
        assert!(!body.contains("do not serve") && !body.contains("[package]"), "{path}: {body}");
    }
}

#[test]
fn a_token_when_set_and_beyond_loopback_one_must_be_set() {
    let tmp = tempfile::tempdir().unwrap();
    run_dir(&tmp.path().join("run"));
    let page = Background::start(vec![tmp.path().join("run")], opts(Some("s3cret"))).unwrap();
    assert!(page.url.ends_with("/?token=s3cret"), "{}", page.url);
    let base = format!("http://{}", page.addr);
    assert_eq!(get(&format!("{base}/api/runs"), None).0, 401);
    assert_eq!(get(&format!("{base}/api/runs"), Some("wrong")).0, 401);
    assert_eq!(get(&format!("{base}/api/runs"), Some("s3cret")).0, 200);
    assert_eq!(get(&format!("{base}/api/runs/0/metrics?token=s3cret"), None).0, 200);
    assert_eq!(get(&format!("{base}/api/runs/0/status?token=s3cre"), None).0, 401);
    // The page and its assets hold no run data: they load, then ask with the token.
    assert_eq!(get(&format!("{base}/"), None).0, 200);

    let e = Background::start(vec![tmp.path().join("run")], DashboardOptions { host: "0.0.0.0".into(), ..opts(None) }).err().unwrap().to_string();
    assert!(e.contains("0.0.0.0") && e.contains("token") && e.contains("127.0.0.1"), "{e}");
    // A taken port is one line (the trainer's page takes another instead).
    let taken = page.addr.port();
    let e = Background::start(vec![tmp.path().join("run")], DashboardOptions { port: taken, ..opts(None) }).err().unwrap().to_string();
    assert!(e.contains(&format!("port {taken} is already in use")) && e.contains("--port"), "{e}");
    let other = Background::start(vec![tmp.path().join("run")], DashboardOptions { port: taken, any_port_if_taken: true, ..opts(None) }).unwrap();
    assert_ne!(other.addr.port(), taken);
}
