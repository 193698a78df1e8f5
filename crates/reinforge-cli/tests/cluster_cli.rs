//! `reinforge cluster …` and `reinforge job …` against a real Ray head (Ray 2.60.0 on PATH, as
//! CI installs it from python/requirements.txt).
//!
//! Each test that starts Ray uses its own ports (free ones, none of Ray's defaults), its own
//! `--temp-dir` and a private HOME (so `~/.ray/auth_token` is the test's own), and holds one
//! global lock so no two Ray clusters of this binary overlap. Every Ray process started here
//! carries a marker variable in its environment; the guard kills exactly those processes (and
//! their children) at the end, so a Ray someone else runs on the machine is left alone.
//! Set REINFORGE_SKIP_RAY_TESTS=1 to skip the tests that need Ray.

use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::sync::{Mutex, MutexGuard};
use std::time::{Duration, Instant};

static RAY_LOCK: Mutex<()> = Mutex::new(());

fn lock() -> MutexGuard<'static, ()> {
    RAY_LOCK.lock().unwrap_or_else(|p| p.into_inner())
}

const BIN: &str = env!("CARGO_BIN_EXE_reinforge");

mod support;
use support::pinned_version;

/// Whether to run the Ray tests (installing the pinned Ray when it is missing).
fn need_ray() -> bool {
    if std::env::var("REINFORGE_SKIP_RAY_TESTS").is_ok_and(|v| v == "1") {
        eprintln!("REINFORGE_SKIP_RAY_TESTS=1: skipping a test that needs Ray");
        return false;
    }
    support::ensure_ray();
    true
}

/// A free TCP port outside Ray's worker range (10002–19999).
fn free_port() -> u16 {
    loop {
        let p = std::net::TcpListener::bind(("0.0.0.0", 0))
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        if !(10002..=19999).contains(&p) {
            return p;
        }
    }
}

/// Ray nodes started by one test: private HOME, temp dirs and a process marker.
struct Env {
    root: tempfile::TempDir,
    mark: String,
}

impl Env {
    fn new() -> Env {
        // Short paths: Ray puts unix sockets under --temp-dir (108-byte limit).
        let root = tempfile::Builder::new()
            .prefix("rft")
            .tempdir_in("/tmp")
            .unwrap();
        std::fs::create_dir_all(root.path().join("home")).unwrap();
        let mark = format!(
            "{}-{}",
            std::process::id(),
            root.path().file_name().unwrap().to_string_lossy()
        );
        Env { root, mark }
    }

    fn home(&self) -> PathBuf {
        self.root.path().join("home")
    }

    fn dir(&self, name: &str) -> PathBuf {
        let d = self.root.path().join(name);
        std::fs::create_dir_all(&d).unwrap();
        d
    }

    /// `reinforge` with a clean Ray/launcher environment, HOME private, the marker set.
    fn cmd(&self, args: &[&str]) -> Command {
        let mut c = Command::new(BIN);
        c.args(args)
            .env("HOME", self.home())
            .env("REINFORGE_TEST_MARK", &self.mark)
            .stdin(Stdio::null());
        for k in [
            "RAY_AUTH_TOKEN",
            "RAY_AUTH_TOKEN_PATH",
            "RAY_AUTH_MODE",
            "RAY_ADDRESS",
            "RAY_API_SERVER_ADDRESS",
            "REINFORGE_RAY",
            "MASTER_ADDR",
            "NODE_RANK",
            "USE_GLOBAL_NETWORKING",
            "SLURM_JOB_NODELIST",
            "SLURM_NODELIST",
            "DSTACK_NODE_RANK",
            "DSTACK_MASTER_NODE_IP",
        ] {
            c.env_remove(k);
        }
        c
    }

    fn run(&self, args: &[&str]) -> Run {
        run(self.cmd(args))
    }
}

impl Drop for Env {
    fn drop(&mut self) {
        kill_marked(&format!("REINFORGE_TEST_MARK={}", self.mark));
    }
}

/// Kills every process whose environment holds `marker`, and all their descendants (Ray's
/// dashboard modules rename themselves and lose their environ, but stay children).
fn kill_marked(marker: &str) {
    let Ok(rd) = std::fs::read_dir("/proc") else {
        // Not Linux: fall back to Ray's machine-wide stop.
        let _ = Command::new("ray").args(["stop", "--force"]).output();
        return;
    };
    let mut parent = std::collections::HashMap::new();
    let mut marked = Vec::new();
    for e in rd.flatten() {
        let Ok(pid) = e.file_name().to_string_lossy().parse::<u32>() else {
            continue;
        };
        if let Ok(stat) = std::fs::read_to_string(format!("/proc/{pid}/stat")) {
            if let Some(pp) = stat
                .rsplit_once(')')
                .and_then(|(_, r)| r.split_whitespace().nth(1))
                .and_then(|p| p.parse::<u32>().ok())
            {
                parent.insert(pid, pp);
            }
        }
        if let Ok(env) = std::fs::read(format!("/proc/{pid}/environ")) {
            if env.split(|b| *b == 0).any(|kv| kv == marker.as_bytes()) {
                marked.push(pid);
            }
        }
    }
    let mut all: std::collections::BTreeSet<u32> = marked.iter().copied().collect();
    let mut todo = marked;
    while let Some(p) = todo.pop() {
        for (c, pp) in &parent {
            if *pp == p && all.insert(*c) {
                todo.push(*c);
            }
        }
    }
    all.remove(&std::process::id());
    for pid in &all {
        let _ = Command::new("kill")
            .args(["-9", &pid.to_string()])
            .stderr(Stdio::null())
            .status();
    }
}

struct Run {
    ok: bool,
    code: Option<i32>,
    stdout: String,
    stderr: String,
    secs: f64,
}

impl std::fmt::Debug for Run {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "exit {:?} after {:.1} s\n--- stdout\n{}--- stderr\n{}",
            self.code, self.secs, self.stdout, self.stderr
        )
    }
}

fn run(mut c: Command) -> Run {
    let t = Instant::now();
    let o: Output = c.output().expect("run reinforge");
    Run {
        ok: o.status.success(),
        code: o.status.code(),
        stdout: String::from_utf8_lossy(&o.stdout).into_owned(),
        stderr: String::from_utf8_lossy(&o.stderr).into_owned(),
        secs: t.elapsed().as_secs_f64(),
    }
}

/// The `error: …` line of a failed run; asserts there is exactly one and the exit is non-zero.
fn one_line_error(r: &Run) -> String {
    assert!(!r.ok, "expected a failure: {r:?}");
    let errs: Vec<&str> = r
        .stderr
        .lines()
        .filter(|l| l.starts_with("error: "))
        .collect();
    assert_eq!(errs.len(), 1, "expected one error line: {r:?}");
    errs[0].to_string()
}

/// Ports of one head.
struct HeadPorts {
    gcs: u16,
    dash: u16,
    agent: u16,
    client: u16,
}

impl HeadPorts {
    fn new() -> HeadPorts {
        loop {
            let p = HeadPorts {
                gcs: free_port(),
                dash: free_port(),
                agent: free_port(),
                client: free_port(),
            };
            let mut all = [p.gcs, p.dash, p.agent, p.client];
            all.sort_unstable();
            if all.windows(2).all(|w| w[0] != w[1]) {
                return p;
            }
        }
    }
}

fn start_head(env: &Env, p: &HeadPorts, extra: &[&str]) -> Run {
    let temp = env.dir("head");
    let (gcs, dash, agent, client) = (
        p.gcs.to_string(),
        p.dash.to_string(),
        p.agent.to_string(),
        p.client.to_string(),
    );
    let mut args = vec![
        "cluster",
        "start",
        "--head",
        "--port",
        &gcs,
        "--dashboard-port",
        &dash,
        "--dashboard-agent-listen-port",
        &agent,
        "--ray-client-server-port",
        &client,
        "--num-cpus",
        "2",
        "--temp-dir",
        temp.to_str().unwrap(),
    ];
    args.extend_from_slice(extra);
    env.run(&args)
}

fn write_fake_ray(dir: &Path, version: &str) -> PathBuf {
    let p = dir.join("ray");
    std::fs::write(
        &p,
        format!(
            "#!/bin/sh\ncase \"$1\" in\n  --version) echo 'ray, version {version}';;\n  stop) echo '2026-01-01 00:00:00,000\tSUCC scripts.py:1 -- Stopped all 12 Ray processes.' >&2;;\n  *) exit 2;;\nesac\n"
        ),
    )
    .unwrap();
    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o755)).unwrap();
    }
    // A process another test thread forked while the script was open for writing holds that
    // descriptor until it execs, and until then running the script fails with ETXTBSY ("Text
    // file busy", CI 2026-11-27). Wait until it runs once, so the commands under test never
    // meet that window.
    for _ in 0..200 {
        match std::process::Command::new(&p).arg("--version").output() {
            Err(e) if e.raw_os_error() == Some(26) => std::thread::sleep(std::time::Duration::from_millis(10)),
            _ => break,
        }
    }
    p
}

#[test]
fn ray_missing_is_one_line() {
    let env = Env::new();
    let mut c = env.cmd(&["cluster", "start", "--head"]);
    c.env("REINFORGE_RAY", "/nonexistent/ray");
    let r = run(c);
    let e = one_line_error(&r);
    assert!(
        e.contains("Ray is not installed") && e.contains("pip install -r python/requirements.txt"),
        "{e}"
    );
    assert!(
        e.contains(&format!("ray[default]=={}", pinned_version())),
        "{e}"
    );
    assert!(r.secs < 5.0, "{r:?}");
}

#[test]
fn ray_versions_outside_the_range_warn_and_old_ones_need_the_auth_opt_out() {
    let env = Env::new();
    let bin = env.dir("bin");
    // Outside the supported range: a warning naming the range; the command still runs.
    let fake = write_fake_ray(&bin, "1.0.0");
    let mut c = env.cmd(&["cluster", "stop", "--force"]);
    c.env("REINFORGE_RAY", &fake);
    let r = run(c);
    assert!(r.ok, "{r:?}");
    assert!(
        r.stderr.contains(&format!("is Ray 1.0.0; Reinforge is tested with Ray 2.41.0 to {}", pinned_version())),
        "{r:?}"
    );
    assert_eq!(r.stdout.trim(), "stopped 12 Ray processes on this machine", "{r:?}");

    // Inside the range but older than token auth (2.52): a cluster without auth only when said.
    let fake = write_fake_ray(&bin, "2.41.0");
    let mut c = env.cmd(&["cluster", "start", "--head"]);
    c.env("REINFORGE_RAY", &fake).env_remove("REINFORGE_NO_AUTH");
    let r = run(c);
    let e = one_line_error(&r);
    assert!(e.contains("Ray 2.41.0 has no token auth") && e.contains("--no-auth (or REINFORGE_NO_AUTH=1"), "{e}");
    assert!(!r.stderr.contains("tested with"), "2.41.0 is supported: {r:?}");

    let fake = write_fake_ray(&bin, &pinned_version());
    let mut c = env.cmd(&["cluster", "stop", "--force"]);
    c.env("REINFORGE_RAY", &fake);
    let r = run(c);
    assert!(r.ok && !r.stderr.contains("tested with"), "{r:?}");
}

#[test]
fn env_conventions_errors_are_one_line() {
    let env = Env::new();
    let bin = env.dir("bin");
    let fake = write_fake_ray(&bin, &pinned_version());
    let mut c = env.cmd(&["cluster", "start"]);
    c.env("REINFORGE_RAY", &fake).env("MASTER_ADDR", "10.0.0.1");
    let e = one_line_error(&run(c));
    assert!(e.contains("MASTER_ADDR is set but NODE_RANK is not"), "{e}");
    let mut c = env.cmd(&["cluster", "start"]);
    c.env("REINFORGE_RAY", &fake);
    let e = one_line_error(&run(c));
    assert!(e.contains("pass --head"), "{e}");
}

#[test]
fn join_unreachable_address_gives_up_with_message() {
    if !need_ray() {
        return;
    }
    let _g = lock();
    let env = Env::new();
    let closed = free_port().to_string();
    let agent = free_port().to_string();
    let addr = format!("127.0.0.1:{closed}");
    let r = env.run(&[
        "cluster",
        "start",
        "--address",
        &addr,
        "--wait",
        "3",
        "--dashboard-agent-listen-port",
        &agent,
    ]);
    let e = one_line_error(&r);
    assert!(
        e.contains(&format!("no Ray head answered at {addr} within 3 s")) && e.contains("--wait"),
        "{e}"
    );
    // 3 s of waiting plus `ray --version` (about 1 s idle, a few under load on 2 cores).
    eprintln!("unreachable head: gave up after {:.1} s", r.secs);
    assert!(r.secs < 15.0, "took {:.1} s: {r:?}", r.secs);
}

#[test]
fn head_jobs_auth_and_a_second_node() {
    if !need_ray() {
        return;
    }
    let _g = lock();
    let env = Env::new();
    let p = HeadPorts::new();

    // Head: prints the join command with the token it generated and saved (0600). A Ray
    // older than token auth runs without one (the tests opt out with REINFORGE_NO_AUTH=1).
    let auth = support::tested_has_token_auth();
    let r = start_head(&env, &p, &[]);
    assert!(r.ok, "{r:?}");
    eprintln!(
        "head start: {:.1} s wall; {}",
        r.secs,
        r.stdout.lines().next().unwrap_or("")
    );
    if !auth {
        assert!(r.stderr.contains(&format!("token auth is OFF (Ray {} has none)", support::tested_version())), "{r:?}");
        assert!(r.stdout.contains("--no-auth") && !env.home().join(".ray/auth_token").exists(), "{r:?}");
    }
    let url = format!("http://127.0.0.1:{}", p.dash);
    let gcs = format!("127.0.0.1:{}", p.gcs);
    if auth {
    let token = std::fs::read_to_string(env.home().join(".ray/auth_token")).unwrap();
    assert_eq!(token.len(), 64);
    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt;
        let mode = std::fs::metadata(env.home().join(".ray/auth_token"))
            .unwrap()
            .permissions()
            .mode();
        assert_eq!(mode & 0o777, 0o600);
    }
    let join_line = format!("RAY_AUTH_TOKEN={token} reinforge cluster start --address ");
    assert!(r.stdout.contains(&join_line), "{r:?}");
    assert!(
        r.stdout
            .contains(&format!(":{} --dashboard-port {}", p.gcs, p.dash)),
        "{r:?}"
    );
    assert!(
        r.stdout.contains("reinforge job submit --address http://"),
        "{r:?}"
    );

    // Ray's own CLI works with the environment the head prints for it (without RAY_AUTH_MODE
    // it says "Authentication token is missing").
    let export = r.stdout.lines().find_map(|l| l.trim().strip_prefix("export ")).unwrap_or_else(|| panic!("no export line: {r:?}"));
    let ray_status = || {
        let mut c = std::process::Command::new("ray");
        c.arg("status").env("HOME", env.home()).env_remove("RAY_AUTH_TOKEN_PATH");
        for kv in export.split_whitespace() {
            let (k, v) = kv.split_once('=').unwrap();
            c.env(k, v);
        }
        let o = c.output().unwrap();
        (o.status.success(), String::from_utf8_lossy(&o.stdout).to_string() + &String::from_utf8_lossy(&o.stderr))
    };
    // Right after start-up Ray may answer "No cluster status" for a few seconds.
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    loop {
        let (ok, out) = ray_status();
        assert!(!out.contains("Authentication token is missing"), "{out}");
        if ok && out.contains("Active:") {
            break;
        }
        assert!(std::time::Instant::now() < deadline, "ray status with the printed environment: {out}");
        std::thread::sleep(Duration::from_millis(500));
    }
    }

    // Ports already taken: refused before Ray starts, naming the port and the flag.
    let again = start_head(&env, &p, &[]);
    let e = one_line_error(&again);
    assert!(
        e.contains(&format!(
            "port {} (Ray head (GCS)) is already in use",
            p.gcs
        )) && e.contains("--port"),
        "{e}"
    );
    assert!(again.secs < 15.0, "{again:?}");
    let other = HeadPorts {
        gcs: free_port(),
        ..HeadPorts::new()
    };
    let dash_taken = start_head(
        &env,
        &HeadPorts {
            dash: p.dash,
            ..other
        },
        &[],
    );
    let e = one_line_error(&dash_taken);
    assert!(
        e.contains(&format!("port {} (Ray dashboard)", p.dash)) && e.contains("--dashboard-port"),
        "{e}"
    );

    // The dashboard port is not the Ray port: a fast, clear error.
    let agent2 = free_port().to_string();
    let dash = p.dash.to_string();
    let wrong = format!("127.0.0.1:{}", p.dash);
    let r = env.run(&[
        "cluster",
        "start",
        "--address",
        &wrong,
        "--dashboard-port",
        &dash,
        "--dashboard-agent-listen-port",
        &agent2,
        "--wait",
        "10",
    ]);
    let e = one_line_error(&r);
    assert!(
        e.contains("is not a Ray head") && e.contains("HTTP/1"),
        "{e}"
    );
    assert!(r.secs < 15.0, "{r:?}");

    // A worker with --no-auth is refused by a token head.
    let empty_home = env.dir("emptyhome");
    if auth {
    let r = env.run(&[
        "cluster",
        "start",
        "--address",
        &gcs,
        "--dashboard-port",
        &dash,
        "--dashboard-agent-listen-port",
        &agent2,
        "--no-auth",
    ]);
    let e = one_line_error(&r);
    assert!(
        e.contains("requires token auth but --no-auth was given"),
        "{e}"
    );

    // A worker without any token is told where to get it.
    let mut c = env.cmd(&[
        "cluster",
        "start",
        "--address",
        &gcs,
        "--dashboard-port",
        &dash,
        "--dashboard-agent-listen-port",
        &agent2,
    ]);
    c.env("HOME", &empty_home);
    let e = one_line_error(&run(c));
    assert!(
        e.contains("requires a token and none was found") && e.contains("RAY_AUTH_TOKEN"),
        "{e}"
    );
    }

    // A second node on this machine (own temp dir and agent port) joins and is confirmed.
    let t2 = env.dir("worker");
    let r = env.run(&[
        "cluster",
        "start",
        "--address",
        &gcs,
        "--dashboard-port",
        &dash,
        "--dashboard-agent-listen-port",
        &agent2,
        "--num-cpus",
        "1",
        "--temp-dir",
        t2.to_str().unwrap(),
    ]);
    assert!(r.ok, "{r:?}");
    assert!(r.stdout.contains(&format!("joined {gcs} in ")), "{r:?}");
    eprintln!("join: {:.1} s wall; {}", r.secs, r.stdout.trim());

    // Status: two nodes, the head marked.
    let r = env.run(&["cluster", "status", "--address", &url]);
    assert!(r.ok, "{r:?}");
    assert!(
        r.stdout.contains("2 node(s) alive, 3 CPU") && r.stdout.contains("head"),
        "{r:?}"
    );
    let r = env.run(&["cluster", "status", "--address", &url, "--json"]);
    let v: serde_json::Value =
        serde_json::from_str(&r.stdout).unwrap_or_else(|e| panic!("{e}: {r:?}"));
    assert_eq!(v["nodes"].as_array().map(|n| n.len()), Some(2), "{r:?}");
    assert_eq!(v["auth"], if auth { "token" } else { "none (Ray < 2.52 has no token auth)" });

    // A job: logs followed, exit 0 on SUCCEEDED.
    let r = env.run(&[
        "job",
        "submit",
        "--address",
        &url,
        "--submission-id",
        "hello-1",
        "--",
        "echo",
        "hello",
    ]);
    assert!(r.ok, "{r:?}");
    assert!(r.stdout.lines().any(|l| l == "hello"), "{r:?}");
    assert!(r.stderr.contains("job hello-1 SUCCEEDED"), "{r:?}");

    // --working-dir is uploaded (without .git and target/), --env reaches the job.
    let wd = env.dir("wd");
    std::fs::write(wd.join("data.txt"), "payload-42\n").unwrap();
    std::fs::create_dir_all(wd.join(".git")).unwrap();
    std::fs::write(wd.join(".git/HEAD"), "x").unwrap();
    std::fs::create_dir_all(wd.join("target")).unwrap();
    std::fs::write(wd.join("target/big"), "x").unwrap();
    let r = env.run(&[
        "job",
        "submit",
        "--address",
        &url,
        "--working-dir",
        wd.to_str().unwrap(),
        "--env",
        "FOO=bar-7",
        "--",
        "cat data.txt; echo foo=$FOO; ls -a",
    ]);
    assert!(r.ok, "{r:?}");
    assert!(
        r.stdout.contains("payload-42") && r.stdout.contains("foo=bar-7"),
        "{r:?}"
    );
    assert!(
        !r.stdout.lines().any(|l| l == ".git" || l == "target"),
        "{r:?}"
    );

    // A failing job: non-zero exit and the final status line.
    let r = env.run(&[
        "job",
        "submit",
        "--address",
        &url,
        "--",
        "sh",
        "-c",
        "exit 3",
    ]);
    assert!(!r.ok, "{r:?}");
    assert!(r.stderr.contains("FAILED"), "{r:?}");

    // List, status, logs.
    let r = env.run(&["job", "list", "--address", &url]);
    assert!(
        r.ok && r.stdout.contains("hello-1") && r.stdout.contains("SUCCEEDED"),
        "{r:?}"
    );
    let r = env.run(&["job", "status", "hello-1", "--address", &url]);
    assert!(
        r.ok && r.stdout.starts_with("job hello-1 SUCCEEDED"),
        "{r:?}"
    );
    let r = env.run(&["job", "logs", "hello-1", "--address", &url]);
    assert!(r.ok && r.stdout.contains("hello"), "{r:?}");
    let e = one_line_error(&env.run(&["job", "status", "no-such-job", "--address", &url]));
    assert!(
        e.contains("no job no-such-job on") && e.contains("reinforge job list"),
        "{e}"
    );

    // Stop a long job.
    let r = env.run(&[
        "job",
        "submit",
        "--address",
        &url,
        "--submission-id",
        "sleeper",
        "--no-wait",
        "--",
        "sleep",
        "600",
    ]);
    assert!(r.ok && r.stdout.trim() == "sleeper", "{r:?}");
    let r = env.run(&["job", "stop", "sleeper", "--address", &url]);
    assert!(r.ok && r.stdout.contains("job sleeper STOPPED"), "{r:?}");
    assert!(r.secs < 60.0, "{r:?}");

    // No token: HTTP 401 as one line; a wrong token: 403.
    if auth {
    let mut c = env.cmd(&["job", "submit", "--address", &url, "--", "echo", "nope"]);
    c.env("HOME", &empty_home);
    let e = one_line_error(&run(c));
    assert!(
        e.contains("needs a token (HTTP 401)") && e.contains("RAY_AUTH_TOKEN"),
        "{e}"
    );
    let mut c = env.cmd(&["job", "list", "--address", &url]);
    c.env("HOME", &empty_home).env("RAY_AUTH_TOKEN", "wrong");
    let e = one_line_error(&run(c));
    assert!(
        e.contains("rejected the token from RAY_AUTH_TOKEN (HTTP 403)"),
        "{e}"
    );
    }

    // Nothing at the address.
    let nothing = format!("http://127.0.0.1:{}", free_port());
    let e = one_line_error(&env.run(&["job", "list", "--address", &nothing]));
    assert!(
        e.contains(&format!("no Ray dashboard at {nothing}"))
            && e.contains("--address http://HEAD:8265"),
        "{e}"
    );
}

#[test]
fn no_auth_cluster_needs_explicit_opt_in() {
    if !need_ray() {
        return;
    }
    let _g = lock();
    let env = Env::new();
    let p = HeadPorts::new();
    let auth = support::tested_has_token_auth();
    // Every command here without the test-wide REINFORGE_NO_AUTH: the opt-out is what is tested.
    let strict = |args: &[&str]| {
        let mut c = env.cmd(args);
        c.env_remove("REINFORGE_NO_AUTH");
        run(c)
    };
    let head_args = |extra: &[&str]| -> Vec<String> {
        let temp = env.dir("head");
        let mut a: Vec<String> = ["cluster", "start", "--head", "--num-cpus", "2"].iter().map(|s| s.to_string()).collect();
        for (flag, port) in [("--port", p.gcs), ("--dashboard-port", p.dash), ("--dashboard-agent-listen-port", p.agent), ("--ray-client-server-port", p.client)] {
            a.extend([flag.to_string(), port.to_string()]);
        }
        a.extend(["--temp-dir".to_string(), temp.display().to_string()]);
        a.extend(extra.iter().map(|s| s.to_string()));
        a
    };
    if !auth {
        // A Ray without token auth is never started open by accident.
        let args = head_args(&[]);
        let e = one_line_error(&strict(&args.iter().map(String::as_str).collect::<Vec<_>>()));
        assert!(
            e.contains(&format!("Ray {} has no token auth", support::tested_version())) && e.contains("--no-auth (or REINFORGE_NO_AUTH=1"),
            "{e}"
        );
    }
    let args = head_args(&["--no-auth"]);
    let r = strict(&args.iter().map(String::as_str).collect::<Vec<_>>());
    assert!(r.ok, "{r:?}");
    assert!(r.stderr.contains("token auth is OFF"), "{r:?}");
    assert!(
        r.stdout.contains("--no-auth") && !r.stdout.contains("RAY_AUTH_TOKEN="),
        "{r:?}"
    );
    assert!(!env.home().join(".ray/auth_token").exists());
    let url = format!("http://127.0.0.1:{}", p.dash);

    let e = one_line_error(&strict(&["job", "submit", "--address", &url, "--", "echo", "hi"]));
    assert!(
        e.contains("runs without token auth") && e.contains("--allow-no-auth (or REINFORGE_NO_AUTH=1)"),
        "{e}"
    );
    assert_eq!(e.contains("a Ray older than 2.52"), !auth, "{e}");
    let r = strict(&[
        "job",
        "submit",
        "--address",
        &url,
        "--allow-no-auth",
        "--",
        "echo",
        "hi",
    ]);
    assert!(r.ok && r.stdout.contains("hi"), "{r:?}");
    // The environment variable says the same for every command.
    let mut c = env.cmd(&["job", "list", "--address", &url]);
    c.env("REINFORGE_NO_AUTH", "1");
    let r = run(c);
    assert!(r.ok, "{r:?}");

    // A worker must opt in too.
    let gcs = format!("127.0.0.1:{}", p.gcs);
    let (dash, agent) = (p.dash.to_string(), free_port().to_string());
    let e = one_line_error(&strict(&[
        "cluster",
        "start",
        "--address",
        &gcs,
        "--dashboard-port",
        &dash,
        "--dashboard-agent-listen-port",
        &agent,
    ]));
    // (A Ray without token auth is refused on the worker's own version before it looks at the head.)
    let why = if auth { "runs without token auth" } else { "has no token auth" };
    assert!(e.contains(why) && e.contains("--no-auth"), "{e}");
}

#[test]
fn worker_started_before_the_head_waits_and_joins() {
    if !need_ray() {
        return;
    }
    let _g = lock();
    let env = Env::new();
    let p = HeadPorts::new();
    let token = "0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef";
    let gcs = format!("127.0.0.1:{}", p.gcs);
    let (dash, agent) = (p.dash.to_string(), free_port().to_string());
    let t2 = env.dir("worker");
    let mut c = env.cmd(&[
        "cluster",
        "start",
        "--address",
        &gcs,
        "--dashboard-port",
        &dash,
        "--dashboard-agent-listen-port",
        &agent,
        "--num-cpus",
        "1",
        "--temp-dir",
        t2.to_str().unwrap(),
        "--wait",
        "120",
    ]);
    c.env("RAY_AUTH_TOKEN", token)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    let worker = c.spawn().unwrap();
    std::thread::sleep(Duration::from_secs(5));

    let temp = env.dir("head");
    let (g, d, a, cl) = (
        p.gcs.to_string(),
        p.dash.to_string(),
        p.agent.to_string(),
        p.client.to_string(),
    );
    let mut c = env.cmd(&[
        "cluster",
        "start",
        "--head",
        "--port",
        &g,
        "--dashboard-port",
        &d,
        "--dashboard-agent-listen-port",
        &a,
        "--ray-client-server-port",
        &cl,
        "--num-cpus",
        "2",
        "--temp-dir",
        temp.to_str().unwrap(),
    ]);
    c.env("RAY_AUTH_TOKEN", token);
    let head = run(c);
    assert!(head.ok, "{head:?}");
    assert!(
        head.stdout.contains(&format!("RAY_AUTH_TOKEN={token} ")) || !support::tested_has_token_auth(),
        "the head uses the given token: {head:?}"
    );

    let t = Instant::now();
    let out = worker.wait_with_output().unwrap();
    let w = Run {
        ok: out.status.success(),
        code: out.status.code(),
        stdout: String::from_utf8_lossy(&out.stdout).into_owned(),
        stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
        secs: t.elapsed().as_secs_f64(),
    };
    assert!(w.ok, "{w:?}");
    assert!(w.stdout.contains(&format!("joined {gcs} in ")), "{w:?}");
    assert!(
        w.stderr.contains("waiting for the Ray head"),
        "the countdown is shown: {w:?}"
    );
    eprintln!("late head: {}", w.stdout.trim());

    let mut c = env.cmd(&[
        "cluster",
        "status",
        "--address",
        &format!("http://127.0.0.1:{}", p.dash),
    ]);
    c.env("RAY_AUTH_TOKEN", token);
    let r = run(c);
    assert!(r.ok && r.stdout.contains("2 node(s) alive"), "{r:?}");
}
