//! The run's page in a real browser (Debian's chromium, headless): the trainer serves it while
//! it trains, `reinforge dashboard` serves the finished run, and after the page's scripts ran
//! the DOM has one chart per metric group with a point per logged step, the placement and
//! ranks tables, the checkpoints, validation and samples, and the console said nothing. A
//! screenshot goes to `target/dashboard.png` (the README's). Without a browser it says so and
//! passes outside CI; in CI (CI=true) that is a failure.

mod support;

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

const BIN: &str = env!("CARGO_BIN_EXE_reinforge");

fn repo() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../..")
}

fn browser() -> Option<PathBuf> {
    let b = support::chromium();
    if b.is_none() {
        assert!(std::env::var("CI").is_err(), "CI must run the page in a browser: install Debian's chromium (apt-get install chromium)");
        eprintln!("skipping the page-in-a-browser test: no chromium on PATH (apt-get install chromium; CI has it)");
    }
    b
}

fn get_json(url: &str) -> serde_json::Value {
    let mut r = ureq::get(url).call().unwrap_or_else(|e| panic!("GET {url}: {e}"));
    serde_json::from_str(&r.body_mut().read_to_string().unwrap()).unwrap()
}

/// The checks every page must pass: no console output, no error box, one chart per metric
/// group with the right number of points.
fn assert_page(page: &support::PageDump, metrics: &Path, complete: bool) {
    assert!(page.console.is_empty(), "the page's console: {:#?}", page.console);
    assert!(page.dom.contains("<div id=\"error\" hidden=\"\""), "the page shows an error: {}", support::text_of(&page.dom, "error"));
    let charts = support::charts_in(&page.dom);
    let want = support::expected_charts(metrics);
    if complete {
        assert_eq!(charts, want, "one chart per metric group, a point per step");
    } else {
        // A live page lags the file by up to one poll: its groups so far, none with more
        // points than the file has now.
        assert!(charts.len() >= 5, "{charts:?}");
        for (g, n) in &charts {
            assert!(*n >= 1 && *n <= want[g], "{g}: {n} points, the file has {}", want[g]);
        }
    }
    for g in ["actor", "critic/score", "response_length", "timing_s", "perf", "val"] {
        assert!(charts.contains_key(g), "no {g} chart: {charts:?}");
    }
}

#[test]
fn the_page_in_a_browser_while_training_and_after() {
    let Some(browser) = browser() else { return };
    let tmp = tempfile::tempdir().unwrap();
    let run = tmp.path().join("quickstart");

    // The trainer's own page, while it trains (port 0: any free one, as parallel tests need).
    let mut train = Command::new(BIN)
        .current_dir(repo())
        .args(["train", "examples/quickstart.toml", "trainer.total_steps=80", "trainer.test_freq=20", "trainer.save_freq=40", "trainer.logger=[\"jsonl\"]", "trainer.dashboard_port=0"])
        .arg(format!("trainer.default_local_dir=\"{}\"", run.display()))
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let (url_rx, train_log) = support::first_line(train.stderr.take().unwrap(), "dashboard: ");
    let mut train = support::Killed(train);
    let url = url_rx.recv_timeout(Duration::from_secs(120)).expect("the trainer printed no `dashboard: URL`");
    assert!(url.starts_with("http://127.0.0.1:"), "{url}");
    let api = format!("{url}api/runs/0");
    // Live: rows arrive while it trains.
    let t0 = Instant::now();
    while get_json(&format!("{api}/metrics"))["next"].as_u64().unwrap() < 3 {
        assert!(t0.elapsed() < Duration::from_secs(120), "no metrics rows after 2 minutes");
        std::thread::sleep(Duration::from_millis(200));
    }
    let live = support::load_page(&browser, &url);
    let running = train.0.try_wait().unwrap().is_none();
    assert_page(&live, &run.join("metrics.jsonl"), false);
    if running {
        // The watchdog's ranks.json exists only while the run runs.
        assert!(support::text_of(&live.dom, "ranks").contains("controller"), "ranks: {}", support::text_of(&live.dom, "ranks"));
    }
    let status = train.0.wait().unwrap();
    let log = train_log.join().unwrap();
    assert!(status.success(), "training failed:\n{}", log.join("\n"));
    let port: u16 = url.trim_end_matches('/').rsplit(':').next().unwrap().parse().unwrap();
    assert!(std::net::TcpStream::connect(("127.0.0.1", port)).is_err(), "the trainer's page outlived its run");

    // The finished run, served by `reinforge dashboard`.
    let (dash, url) = support::serve_dashboard(BIN, &[&run]);
    let page = support::load_page(&browser, &url);
    assert_page(&page, &run.join("metrics.jsonl"), true);
    let placement = support::text_of(&page.dom, "placement");
    assert!(placement.starts_with("group roles rank node pid local actor, rollout 0"), "placement: {placement}");
    let checkpoints = support::text_of(&page.dom, "checkpoints");
    assert!(checkpoints.contains("global_step_40 complete") && checkpoints.contains("global_step_80 complete latest"), "checkpoints: {checkpoints}");
    let validation = support::text_of(&page.dom, "validation");
    assert!(validation.contains("val/reward/mean") && validation.contains("step 80"), "validation: {validation}");
    let log_text = support::text_of(&page.dom, "log");
    assert!(log_text.contains("finished: 80 steps"), "log: {log_text}");
    assert!(support::text_of(&page.dom, "config").contains("total_steps = 80"));
    assert_eq!(support::text_of(&page.dom, "ranks"), "no ranks.json (the run is not running)");
    // Samples: 4 training completions a step and 8 validation ones a validation; the page shows
    // the newest 200.
    let samples = std::fs::read_to_string(run.join("samples.jsonl")).unwrap().lines().count();
    assert_eq!(samples, 80 * 4 + 5 * 8, "train samples every step, validation ones at steps 0, 20, 40, 60, 80");
    assert_eq!(page.dom.matches("<div class=\"sample\"").count(), 200);
    assert!(page.dom.contains("data-split=\"val\"") && page.dom.contains("data-split=\"train\""));
    assert!(support::text_of(&page.dom, "sample-count").starts_with(&format!("{samples} of {samples}")));

    let shot = repo().join("target/dashboard.png");
    support::screenshot(&browser, &url, &shot, (1400, 1500));
    eprintln!("screenshot: {}", shot.display());
    drop(dash);
}
