//! Two hosts in network namespaces (a veth pair, as root): a Ray head in one, a worker in the
//! other, started with `reinforge cluster start` in the wrong order on purpose; a GRPO run
//! submitted with `reinforge job submit` that places the actor's two data-parallel ranks on one
//! node and two rollout engines on the other; its metrics equal a single-process run's; a
//! submission without the token is refused; killing the worker node fails the next job within a
//! bounded time with a message naming the node, and with restarts on the job recovers by
//! itself, or with an elastic floor (`cluster.min_nodes`) goes on without the node; `reinforge doctor` passes on the healthy cluster and names each injected fault: a
//! port dropped by a firewall, a checkpoint directory that is not shared, a different binary on
//! one node, a 16 MiB `/dev/shm`, a config needing more memory or ranks than a node has; a step
//! over `trainer.stall_timeout_s` is reported rank by rank, with stacks, and an all-reduce
//! hung by a firewall restarts the run (`trainer.on_stall = restart`);
//! `cluster status` shows a live run's ranks and phases.
//!
//! Needs root, iproute2 (network namespaces), nftables and util-linux `unshare` (the faults),
//! and Ray (installed by the test when missing).
//! Outside CI, without root, it says so and passes; in CI (CI=true) that is a failure.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

const BIN: &str = env!("CARGO_BIN_EXE_reinforge");
const TOKEN: &str = "5eb1c0de7e5751a0c1f0a2b3c4d5e6f7a8b9c0d1e2f3a4b5c6d7e8f9a0b1c2d3";

mod support;

fn prerequisites() -> bool {
    let has = |cmd: &str, arg: &str| Command::new(cmd).arg(arg).output().is_ok();
    let ok = is_root() && has("ip", "-V") && has("nft", "--version") && has("unshare", "--version");
    if !ok {
        assert!(std::env::var("CI").is_err(), "CI must run the two-host test: it needs root, `ip` (iproute2), `nft` (nftables) and `unshare`");
        eprintln!("skipping the two-host test: it needs root, iproute2, nftables and unshare (CI has them)");
        return false;
    }
    support::ensure_ray();
    true
}

use support::{is_root, sh, Hosts, IP_A, IP_B};

/// PATH for everything on the test hosts: first a `gdb` that is the real one but stays
/// attached 5 s longer, as on a GPU node where reading the CUDA libraries' symbols keeps a rank
/// stopped for seconds (a stack dump must not get a rank called lost meanwhile).
fn hosts_path() -> String {
    static DIR: std::sync::OnceLock<PathBuf> = std::sync::OnceLock::new();
    let dir = DIR.get_or_init(|| {
        let found = sh(&["sh", "-c", "command -v gdb"]);
        let gdb = String::from_utf8_lossy(&found.stdout).trim().to_string();
        assert!(!gdb.is_empty(), "the two-host test needs gdb (`apt-get install gdb`; .ci/run installs it)");
        let dir = std::env::temp_dir().join(format!("reinforge-slow-gdb-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let script = dir.join("gdb");
        std::fs::write(&script, format!("#!/bin/sh\nexec {gdb} \"$@\" -ex \"shell sleep 5\"\n")).unwrap();
        std::fs::set_permissions(&script, std::os::unix::fs::PermissionsExt::from_mode(0o755)).unwrap();
        dir
    });
    format!("{}:{}", dir.display(), std::env::var("PATH").unwrap_or_default())
}

/// `reinforge ARGS` inside namespace `ns`, with the test's HOME and token.
fn in_ns(ns: &str, home: &Path, token: Option<&str>, args: &[&str]) -> Command {
    let mut c = Command::new("ip");
    c.args(["netns", "exec", ns, BIN]).args(args).env("HOME", home).env("PATH", hosts_path()).env_remove("RAY_ADDRESS").env_remove("RAY_AUTH_TOKEN_PATH");
    match token {
        Some(t) => c.env("RAY_AUTH_TOKEN", t),
        None => c.env_remove("RAY_AUTH_TOKEN"),
    };
    c
}

/// `reinforge cluster start` joining node B to the head, in a mount namespace of its own where
/// the head's temp dir (`root/a`) is B's `temp`: separate hosts never share Ray's session files,
/// and older Ray (2.41) puts a worker's sessions under the head's temp dir whatever `--temp-dir`
/// says. `mounts` are more shell commands to run there first (`&&`-terminated); `extra` more
/// arguments.
fn join_b(ns: &str, home: &Path, root: &Path, temp: &Path, mounts: &str, extra: &[&str]) -> Command {
    std::fs::create_dir_all(temp).unwrap();
    std::fs::create_dir_all(root.join("a")).unwrap();
    let script = format!(
        "mount --bind {temp} {head} && {mounts} exec {BIN} cluster start --address {IP_A}:6379 --node-ip-address {IP_B} --num-cpus 2 --temp-dir {temp} {extra}",
        temp = temp.display(),
        head = root.join("a").display(),
        extra = extra.join(" ")
    );
    let mut c = Command::new("ip");
    c.args(["netns", "exec", ns, "unshare", "-m", "--propagation", "private", "sh", "-c", &script])
        .env("HOME", home)
        .env("PATH", hosts_path())
        .env("RAY_AUTH_TOKEN", TOKEN)
        .env_remove("RAY_ADDRESS")
        .env_remove("RAY_AUTH_TOKEN_PATH");
    c
}

fn run(mut c: Command) -> Output {
    let o = c.output().expect("spawn");
    eprintln!("$ {c:?}\n  -> {}\n  stdout: {}\n  stderr: {}", o.status, tail(&o.stdout), tail(&o.stderr));
    o
}

fn tail(b: &[u8]) -> String {
    let s = String::from_utf8_lossy(b);
    let lines: Vec<&str> = s.lines().collect();
    lines[lines.len().saturating_sub(15)..].join("\n    ")
}

fn metrics(path: &Path) -> Vec<serde_json::Value> {
    std::fs::read_to_string(path)
        .unwrap_or_else(|e| panic!("{}: {e}", path.display()))
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect()
}

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..").canonicalize().unwrap()
}

/// One row per sample, for the runs a fault strikes mid-way: with shared prompts (the default)
/// the quickstart step takes under 0.1 s, and a 6-step run could end before its fault lands.
const SLOW: &str = "actor.share_prompts=false";

/// The training both runs do: the quickstart, 3 steps, no validation, absolute paths (a Ray job
/// runs in a directory of Ray's choosing).
fn train_args(out: &Path, steps: usize) -> Vec<String> {
    let r = repo();
    vec![
        "train".into(),
        r.join("examples/quickstart.toml").display().to_string(),
        format!("actor.model=\"{}\"", r.join("examples/tiny-arith").display()),
        format!("trainer.total_steps={steps}"),
        "trainer.test_freq=0".into(),
        "trainer.val_before_train=false".into(),
        "trainer.save_freq=0".into(),
        "trainer.logger=[\"jsonl\"]".into(),
        format!("trainer.default_local_dir=\"{}\"", out.display()),
        "--resume".into(),
        "none".into(),
    ]
}

/// Same global batch, same seed ⇒ same metrics. Here every rank holds whole micro-batches and
/// the all-reduce adds ranks in rank order — the order one process accumulates its micro-batches
/// in — so gradients match bit for bit; the tolerance covers f64 metric sums across ranks (and
/// would cover f32 re-association if a rank held several micro-batches).
fn same_metrics(local: &Path, ray: &Path, steps: usize) {
    close_metrics(local, ray, steps, 1e-6);
}

/// [`same_metrics`] to a relative tolerance `tol`.
fn close_metrics(local: &Path, ray: &Path, steps: usize, tol: f64) {
    let (a, b) = (metrics(&local.join("metrics.jsonl")), metrics(&ray.join("metrics.jsonl")));
    assert_eq!(a.len(), steps);
    assert_eq!(b.len(), steps);
    for (step, (x, y)) in a.iter().zip(&b).enumerate() {
        for (k, v) in x.as_object().unwrap() {
            if k.starts_with("timing_s/") || k.starts_with("perf/") || k == "timestamp" {
                continue;
            }
            let (v, w) = (v.as_f64().unwrap(), y[k].as_f64().unwrap_or_else(|| panic!("step {step}: {k} missing in the Ray run")));
            assert!((v - w).abs() <= tol * v.abs().max(1.0), "step {}: {k} = {v} in one process, {w} on Ray", step + 1);
        }
    }
}

/// A reward model: the tiny model's architecture, random weights and a `score.weight` head.
fn reward_model(dir: &Path) -> PathBuf {
    use reinforge_engine::{CausalLm, HostTensor, ModelConfig};
    let src = repo().join("examples/tiny-arith");
    let model = CausalLm::random(ModelConfig::from_dir(&src).unwrap(), 7, &burn::tensor::Device::flex()).unwrap();
    let mut tensors = model.to_hf_tensors().unwrap();
    let h = model.config.hidden_size;
    tensors.insert("score.weight".into(), HostTensor { shape: vec![1, h], data: (0..h).map(|i| ((i as f32) * 0.37).sin()).collect() });
    let rm = dir.join("rm");
    std::fs::create_dir_all(&rm).unwrap();
    reinforge_engine::weights::write_safetensors(&rm.join("model.safetensors"), &tensors, None).unwrap();
    for f in ["config.json", "tokenizer.json", "tokenizer_config.json"] {
        std::fs::copy(src.join(f), rm.join(f)).unwrap();
    }
    rm
}

/// `reinforge job submit` of [`train_args`] plus `extra` on Ray: the actor's 2 ranks on one
/// node, 2 rollout engines on the other. Without `wait`, returns once the job is submitted.
fn submit_training(ns: &str, home: &Path, id: &str, out: &Path, steps: usize, wait: bool, extra: &[&str]) -> Output {
    let mut args: Vec<String> = ["job", "submit", "--address", "http://127.0.0.1:8265", "--submission-id", id].iter().map(|s| s.to_string()).collect();
    if !wait {
        args.push("--no-wait".into());
    }
    args.extend(["--".into(), BIN.into()]);
    args.extend(train_args(out, steps));
    args.extend(["--ray".into(), "cluster.actor.gpus_per_node=2".into(), "cluster.rollout.gpus_per_node=2".into()]);
    args.extend(extra.iter().map(|s| s.to_string()));
    let argv: Vec<&str> = args.iter().map(String::as_str).collect();
    run(in_ns(ns, home, Some(TOKEN), &argv))
}

/// Waits (2 min at most) until `out/metrics.jsonl` of job `id` has `rows` rows; fails at once,
/// with the job's logs, if the job ends first.
fn wait_rows(ns: &str, home: &Path, id: &str, out: &Path, rows: usize) {
    let deadline = Instant::now() + Duration::from_secs(120);
    let mut polls = 0u32;
    while std::fs::read_to_string(out.join("metrics.jsonl")).map_or(0, |t| t.lines().count()) < rows {
        polls += 1;
        let status = if polls.is_multiple_of(10) || Instant::now() >= deadline { job_status(ns, home, id) } else { String::new() };
        if Instant::now() >= deadline || status.contains("FAILED") || status.contains("SUCCEEDED") || status.contains("STOPPED") {
            let text = job_logs(ns, home, id);
            let last: Vec<&str> = text.lines().rev().take(60).collect();
            panic!("{} never reached {rows} rows: {}\n{}", out.display(), job_status(ns, home, id), last.into_iter().rev().collect::<Vec<_>>().join("\n    "));
        }
        std::thread::sleep(Duration::from_millis(200));
    }
}

/// `reinforge cluster start` joining node B to the head again, with a fresh temp dir.
fn rejoin(hosts: &Hosts, home: &Path, temp: &Path) {
    let root = temp.parent().unwrap();
    let o = run(join_b(&hosts.b, home, root, temp, "", &[]));
    assert!(o.status.success(), "the worker node could not rejoin");
}

/// `reinforge train` of [`train_args`] plus `extra`, with `--ray`, from a shell in `ns`.
fn train_on_ray(ns: &str, home: &Path, out: &Path, steps: usize, extra: &[&str]) -> Output {
    let mut args = train_args(out, steps);
    args.extend(extra.iter().map(|s| s.to_string()));
    args.push("--ray".into());
    let argv: Vec<&str> = args.iter().map(String::as_str).collect();
    run(in_ns(ns, home, Some(TOKEN), &argv))
}

/// Waits (2 min at most) until job `id` has logged its first step.
fn wait_first_step(ns: &str, home: &Path, id: &str, out: &Path) {
    let deadline = Instant::now() + Duration::from_secs(120);
    // A first metrics row: the step loop runs, and its watchdog has written ranks.json (the
    // metrics file itself is opened before the workers' first call).
    while std::fs::read_to_string(out.join("metrics.jsonl")).map_or(true, |t| t.lines().next().is_none()) || !out.join("ranks.json").exists() {
        assert!(Instant::now() < deadline, "job {id} never started training: {}", job_status(ns, home, id));
        std::thread::sleep(Duration::from_millis(500));
    }
}

/// Polls job `id` until FAILED, at most `bound` after now (`what` says what happened).
fn wait_failed(ns: &str, home: &Path, id: &str, bound: Duration, every: Duration, what: &str) -> (String, f64) {
    let t = Instant::now();
    loop {
        let s = job_status(ns, home, id);
        if s.contains("FAILED") {
            return (s, t.elapsed().as_secs_f64());
        }
        assert!(t.elapsed() < bound, "the job did not fail within {} s {what}: {s}", bound.as_secs());
        std::thread::sleep(every);
    }
}

/// `reinforge doctor --json` from the head for the Ray runs' config plus `extra`: whether it
/// passed, its checks, and its wall time.
fn doctor(hosts: &Hosts, home: &Path, out: &Path, extra: &[&str]) -> (bool, Vec<serde_json::Value>, f64) {
    let mut args = train_args(out, 3);
    args.truncate(args.len() - 2);
    args[0] = "doctor".into();
    args.extend(["cluster.backend=\"ray\"", "cluster.actor.gpus_per_node=2", "cluster.rollout.gpus_per_node=2"].map(String::from));
    args.extend(extra.iter().map(|s| s.to_string()));
    args.extend(["--address".into(), format!("{IP_A}:6379"), "--json".into()]);
    let argv: Vec<&str> = args.iter().map(String::as_str).collect();
    let t = Instant::now();
    let o = run(in_ns(&hosts.a, home, Some(TOKEN), &argv));
    let secs = t.elapsed().as_secs_f64();
    let report: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap_or_else(|e| panic!("doctor printed no JSON ({e}): {}", tail(&o.stderr)));
    for c in report["checks"].as_array().unwrap() {
        eprintln!("  doctor: {} {} {} {} {}", c["status"], c["name"], c["node"], c["saw"], c["fix"]);
    }
    (o.status.success(), report["checks"].as_array().unwrap().clone(), secs)
}

/// The check `name` about `node` (None: the cluster as a whole).
fn finding<'a>(checks: &'a [serde_json::Value], name: &str, node: Option<&str>) -> Vec<&'a serde_json::Value> {
    checks.iter().filter(|c| c["name"] == name && c["node"].as_str() == node).collect()
}

/// Polls `reinforge cluster status` until it says `n node(s) alive` (2 min at most).
fn wait_alive(hosts: &Hosts, home: &Path, n: usize) {
    let deadline = Instant::now() + Duration::from_secs(120);
    loop {
        let o = in_ns(&hosts.a, home, Some(TOKEN), &["cluster", "status", "--address", "http://127.0.0.1:8265"]).output().unwrap();
        let text = String::from_utf8_lossy(&o.stdout).to_string();
        if text.contains(&format!(": {n} node(s) alive")) {
            return;
        }
        assert!(Instant::now() < deadline, "the cluster never had {n} node(s) alive: {text}");
        std::thread::sleep(Duration::from_secs(1));
    }
}

/// The one TCP connection between a `reinforge` process in namespace `ns` and host A that is
/// not to the controller's port (29650): the actor ranks' all-reduce. (local port, peer port).
fn all_reduce_connection(ns: &str) -> (String, String) {
    let o = sh(&["ip", "netns", "exec", ns, "ss", "-tnpH", "state", "established"]);
    let text = String::from_utf8_lossy(&o.stdout).to_string();
    let found: Vec<(String, String)> = text
        .lines()
        .filter(|l| l.contains("\"reinforge\""))
        .filter_map(|l| {
            let w: Vec<&str> = l.split_whitespace().collect();
            let (local, peer) = (w.get(2)?, w.get(3)?);
            let (lp, (pip, pp)) = (local.rsplit_once(':')?.1, peer.rsplit_once(':')?);
            (pip == IP_A && pp != "29650" && lp != "29650").then(|| (lp.to_string(), pp.to_string()))
        })
        .collect();
    assert_eq!(found.len(), 1, "expected one all-reduce connection in {ns}: {text}");
    found[0].clone()
}

/// nftables commands in namespace `ns`.
fn nft(ns: &str, rules: &[Vec<&str>]) {
    for rule in rules {
        let mut args = vec!["ip", "netns", "exec", ns, "nft"];
        args.extend(rule.iter().copied());
        let o = sh(&args);
        assert!(o.status.success(), "{args:?}: {}", String::from_utf8_lossy(&o.stderr));
    }
}

/// The logs of job `id` so far.
fn job_logs(ns: &str, home: &Path, id: &str) -> String {
    let o = in_ns(ns, home, Some(TOKEN), &["job", "logs", id, "--address", "http://127.0.0.1:8265"]).output().unwrap();
    String::from_utf8_lossy(&o.stdout).to_string()
}

/// Waits (at most `bound`) for job `id` to succeed, calling `each` between polls; its logs.
/// Fails with them when it fails or takes longer (the job did not `what`).
fn wait_succeeded(ns: &str, home: &Path, id: &str, bound: Duration, what: &str, mut each: impl FnMut()) -> String {
    let deadline = Instant::now() + bound;
    loop {
        let s = job_status(ns, home, id);
        if s.contains("SUCCEEDED") {
            return job_logs(ns, home, id);
        }
        if s.contains("FAILED") || Instant::now() > deadline {
            panic!("job {id} did not {what}: {s}\n{}", tail(job_logs(ns, home, id).as_bytes()));
        }
        each();
        std::thread::sleep(Duration::from_millis(500));
    }
}

fn job_status(ns: &str, home: &Path, id: &str) -> String {
    let o = in_ns(ns, home, Some(TOKEN), &["job", "status", id, "--address", "http://127.0.0.1:8265"]).output().unwrap();
    String::from_utf8_lossy(&o.stdout).to_string() + &String::from_utf8_lossy(&o.stderr)
}

#[test]
fn two_hosts_bring_up_train_and_lose_a_node() {
    if !prerequisites() {
        return;
    }
    let t_test = Instant::now();
    let tmp = tempfile::Builder::new().prefix("rfmn").tempdir_in("/tmp").unwrap();
    let home = tmp.path().join("home");
    std::fs::create_dir_all(&home).unwrap();
    let hosts = Hosts::up();

    // The worker first: it must wait for the head, then join.
    let t_join = Instant::now();
    let worker: Child = join_b(&hosts.b, &home, tmp.path(), &tmp.path().join("b"), "", &["--wait", "180"])
    .stdout(Stdio::piped())
    .stderr(Stdio::piped())
    .spawn()
    .unwrap();
    std::thread::sleep(Duration::from_secs(4));
    let head = run(in_ns(
        &hosts.a,
        &home,
        Some(TOKEN),
        &["cluster", "start", "--head", "--node-ip-address", IP_A, "--num-cpus", "2", "--temp-dir", &tmp.path().join("a").display().to_string()],
    ));
    assert!(head.status.success(), "head start failed");
    let head_out = String::from_utf8_lossy(&head.stdout).to_string();
    assert!(head_out.contains(&format!("--address {IP_A}:6379")), "no join command printed: {head_out}");
    let t_head_up = t_join.elapsed();
    let w = worker.wait_with_output().unwrap();
    eprintln!("worker join: {}\n{}", tail(&w.stdout), tail(&w.stderr));
    assert!(w.status.success(), "the worker started before the head did not join");
    eprintln!(
        "TIMING worker join finished {:.1}s after it started, {:.1}s after the head was up",
        t_join.elapsed().as_secs_f64(),
        (t_join.elapsed() - t_head_up).as_secs_f64()
    );

    let st = run(in_ns(&hosts.a, &home, Some(TOKEN), &["cluster", "status", "--address", "http://127.0.0.1:8265"]));
    let st_out = String::from_utf8_lossy(&st.stdout).to_string();
    assert!(st.status.success() && st_out.contains(IP_A) && st_out.contains(IP_B), "status must list both nodes: {st_out}");

    // Preflight on the healthy cluster: every node probed, nothing fails.
    let (ok, checks, secs) = doctor(&hosts, &home, &tmp.path().join("doc"), &[]);
    assert!(ok, "doctor fails on a healthy cluster");
    for ip in [IP_A, IP_B] {
        for name in ["binary", "versions", "memory", "shm", "ports", "interface", "clock", "shared dir"] {
            let found = finding(&checks, name, Some(ip));
            assert!(!found.is_empty() && found.iter().all(|c| c["status"] == "PASS"), "{name} on {ip}: {found:?}");
        }
    }
    assert!(finding(&checks, "interface", Some(IP_B))[0]["saw"].as_str().unwrap().contains("NCCL_SOCKET_IFNAME=rfvb"), "{checks:?}");
    eprintln!("TIMING doctor on 2 nodes, healthy: {secs:.1}s");

    // The reference: the same run in one process.
    let local_out = tmp.path().join("local");
    let o = run({
        let mut c = Command::new(BIN);
        c.args(train_args(&local_out, 3));
        c
    });
    assert!(o.status.success());

    // The same run as a Ray job: 2 actor ranks on one node, 2 rollout engines on the other.
    let ray_out = tmp.path().join("ray");
    let t_job = Instant::now();
    let o = submit_training(&hosts.a, &home, "rf-train-1", &ray_out, 3, true, &[]);
    assert!(o.status.success(), "the training job failed");
    eprintln!("TIMING training job (3 steps, 4 workers on 2 nodes) {:.1}s", t_job.elapsed().as_secs_f64());

    let placement: serde_json::Value = serde_json::from_slice(&std::fs::read(ray_out.join("placement.json")).unwrap()).unwrap();
    let nodes_of = |group: &str| -> Vec<String> {
        let g = placement["groups"].as_array().unwrap().iter().find(|g| g["group"] == group).unwrap();
        g["ranks"].as_array().unwrap().iter().map(|r| r["node_ip"].as_str().unwrap().to_string()).collect()
    };
    let (actor_nodes, rollout_nodes) = (nodes_of("policy"), nodes_of("rollout"));
    assert_eq!(actor_nodes.len(), 2);
    assert_eq!(rollout_nodes.len(), 2);
    assert!(actor_nodes.iter().all(|n| n == &actor_nodes[0]) && rollout_nodes.iter().all(|n| n == &rollout_nodes[0]));
    assert_ne!(actor_nodes[0], rollout_nodes[0], "actor and rollout must be on different nodes: {placement}");
    for n in actor_nodes.iter().chain(&rollout_nodes) {
        assert!(n == IP_A || n == IP_B, "unexpected node {n}");
    }

    // The Ray run's page: `reinforge dashboard` on its directory draws every metric group and
    // shows each rank on its node.
    match support::chromium() {
        Some(browser) => {
            let (_page_server, url) = support::serve_dashboard(BIN, &[&ray_out]);
            let page = support::load_page(&browser, &url);
            assert!(page.console.is_empty(), "the page's console: {:#?}", page.console);
            assert_eq!(support::charts_in(&page.dom), support::expected_charts(&ray_out.join("metrics.jsonl")), "one chart per metric group");
            let placement = support::text_of(&page.dom, "placement");
            assert!(placement.contains("policy") && placement.contains("rollout") && placement.contains(IP_A) && placement.contains(IP_B), "placement: {placement}");
        }
        None => assert!(std::env::var("CI").is_err(), "CI must check the Ray run's page: install Debian's chromium"),
    }

    // The CUDA engine on Ray ranks (its CPU emulator here; one GPU per rank on a GPU cluster):
    // 2 data-parallel actor ranks on one node, 2 rollout engines with weights of their own on
    // the other. With top-k 1 both engines pick the same tokens, so the run gives the CPU
    // engine's metrics in one process, to f32 rounding. One epoch over one mini-batch: both
    // runs skip the old-log-prob pass, so the ranks' updates use their own log-probs.
    let small = ["data.train_batch_size=4", "rollout.n=2", "rollout.top_k=1", "actor.ppo_mini_batch_size=4", "actor.ppo_micro_batch_size=4", "actor.ppo_epochs=1"];
    let cpu_small = tmp.path().join("cpu-small");
    let mut c = Command::new(BIN);
    c.args(train_args(&cpu_small, 2)).args(small);
    assert!(run(c).status.success());
    let emu_out = tmp.path().join("ray-cuda-emu");
    let mut extra: Vec<&str> = small.to_vec();
    extra.extend(["trainer.device=\"cuda-emu\"", "trainer.dtype=\"f32\""]);
    let t_emu = Instant::now();
    assert!(submit_training(&hosts.a, &home, "rf-train-5", &emu_out, 2, true, &extra).status.success(), "the CUDA-engine job failed");
    eprintln!("TIMING CUDA-engine (emulated) job on Ray, 2 steps: {:.1}s", t_emu.elapsed().as_secs_f64());
    close_metrics(&cpu_small, &emu_out, 2, 1e-3);

    same_metrics(&local_out, &ray_out, 3);

    // A checkpoint does not depend on how many nodes wrote it: the 2-node run's checkpoint
    // resumed in one process continues exactly as the single-process run's checkpoint does.
    for out in [&local_out, &ray_out] {
        let mut args = train_args(out, 4);
        let n = args.len();
        args[n - 1] = "auto".into();
        let mut c = Command::new(BIN);
        c.args(args);
        assert!(run(c).status.success(), "resuming {} failed", out.display());
    }
    same_metrics(&local_out, &ray_out, 4);

    // Every role colocated (hybrid engine on both ranks), with a critic (GAE) and a KL loss to
    // the reference: data-parallel critic and reference log-probs across ranks.
    let extra = ["algorithm.adv_estimator=\"gae\"", "actor.use_kl_loss=true", "actor.ppo_micro_batch_size=64", "critic.ppo_micro_batch_size=64"];
    let local2 = tmp.path().join("local2");
    let mut c = Command::new(BIN);
    c.args(train_args(&local2, 2)).args(extra);
    assert!(run(c).status.success());
    let ray2 = tmp.path().join("ray2");
    let placement = ["cluster.colocate_all=true", "cluster.actor.gpus_per_node=2"];
    assert!(train_on_ray(&hosts.a, &home, &ray2, 2, &[&extra[..], &placement[..]].concat()).status.success(), "colocated GAE run on Ray failed");
    same_metrics(&local2, &ray2, 2);

    // LoRA: 2 data-parallel actor ranks on one node draw the same fresh adapter and exchange
    // only its factors' gradients; 2 rollout engines on the other node get the adapter merged
    // into their weights at each sync. The same as one process.
    let lora = ["actor.lora_rank=4", "actor.lora_alpha=8", "actor.lr=2e-2"];
    let local_lora = tmp.path().join("local-lora");
    let mut c = Command::new(BIN);
    c.args(train_args(&local_lora, 2)).args(lora);
    assert!(run(c).status.success());
    let ray_lora = tmp.path().join("ray-lora");
    let placement = ["cluster.actor.gpus_per_node=2", "cluster.rollout.gpus_per_node=2"];
    let o = train_on_ray(&hosts.a, &home, &ray_lora, 2, &[&lora[..], &placement[..]].concat());
    assert!(o.status.success(), "the LoRA run on Ray failed: {}", tail(&o.stderr));
    same_metrics(&local_lora, &ray_lora, 2);

    // A reward model on the critic's two ranks (critic + reward colocated), actor and rollout
    // on the other node: scores and updates equal the single-process run's.
    let rm = reward_model(tmp.path());
    let extra = [
        "algorithm.adv_estimator=\"gae\"".to_string(),
        "reward.kind=\"reward_model\"".to_string(),
        format!("reward.params={{ path = \"{}\", batch_size = 64 }}", rm.display()),
        "critic.ppo_micro_batch_size=128".to_string(),
    ];
    let local3 = tmp.path().join("local3");
    let mut c = Command::new(BIN);
    c.args(train_args(&local3, 2)).args(&extra);
    assert!(run(c).status.success());
    let ray3 = tmp.path().join("ray3");
    let mut args: Vec<&str> = extra.iter().map(String::as_str).collect();
    args.extend(["cluster.colocate_critic_reward=true", "cluster.critic.gpus_per_node=2"]);
    assert!(train_on_ray(&hosts.a, &home, &ray3, 2, &args).status.success(), "critic+reward run on Ray failed");
    let placement: serde_json::Value = serde_json::from_slice(&std::fs::read(ray3.join("placement.json")).unwrap()).unwrap();
    let critic = placement["groups"].as_array().unwrap().iter().find(|g| g["group"] == "critic").unwrap();
    assert_eq!(critic["roles"], serde_json::json!(["critic", "reward"]));
    same_metrics(&local3, &ray3, 2);

    // A step slower than trainer.stall_timeout_s (50 ms: every first step of one row per sample
    // takes longer, whatever the machine): the watchdog names every rank's phase and
    // node and dumps the controller's and every rank's stacks; the run goes on (on_stall = warn).
    // gdb keeps each rank stopped for over 5 s (hosts_path), longer than the 3 s of silence
    // after which a rank is lost: the rank says so before, and the controller waits.
    let stall_out = tmp.path().join("stall");
    let o = train_on_ray(&hosts.a, &home, &stall_out, 6, &["trainer.stall_timeout_s=0.05", "cluster.heartbeat_timeout_s=3", SLOW]);
    let err = String::from_utf8_lossy(&o.stderr).to_string();
    assert!(o.status.success(), "{err}");
    assert!(err.contains("stall: step 1 has run") && err.contains("the controller is in"), "{err}");
    assert!(err.lines().any(|l| l.starts_with("stall:   policy:0 on node ")), "{err}");
    assert!(!err.contains("lost worker") && !err.contains("restart 1/"), "a stack dump got a rank called lost: {err}");
    let dumps = stall_out.join("stalls/step-1");
    let controller = std::fs::read_to_string(dumps.join("controller.txt")).unwrap();
    assert!(controller.contains("threads of pid") && controller.contains("# from gdb"), "{controller}");
    for rank in ["policy-0.txt", "rollout-0.txt"] {
        let text = std::fs::read_to_string(dumps.join(rank)).unwrap_or_else(|e| panic!("{rank}: {e}"));
        assert!(text.starts_with("# step 1 has run") && text.contains("threads of pid") && text.contains("# from gdb"), "{text}");
    }

    // Search-R1 on the cluster: a retrieval server on every node (started through Ray), one
    // rollout rank per node, each calling the server on its own node; the same run in one
    // process gives the same metrics.
    let search = tmp.path().join("search");
    assert!(run({
        let mut c = Command::new(BIN);
        c.args(["data", "gen", "search", "--n", "64", "--seed", "1", "--entities", "8", "--out"]).arg(&search);
        c
    })
    .status
    .success());
    let index = search.join("index");
    let o = run({
        let mut c = Command::new(BIN);
        c.args(["retrieval", "index", "--corpus"]).arg(search.join("corpus.jsonl")).arg("--out").arg(&index);
        c
    });
    assert!(o.status.success());
    let t = Instant::now();
    let idx = index.display().to_string();
    let served = run(in_ns(&hosts.a, &home, Some(TOKEN), &["retrieval", "serve", "--index", &idx, "--port", "8000", "--cluster", &format!("{IP_A}:6379")]));
    let served_out = String::from_utf8_lossy(&served.stdout).to_string();
    assert!(served.status.success() && served_out.contains(IP_A) && served_out.contains(IP_B), "a server on each node: {served_out}");
    eprintln!("TIMING retrieval servers up on 2 nodes in {:.1}s", t.elapsed().as_secs_f64());
    let search_args = |out: &Path| -> Vec<String> {
        let r = repo();
        [
            "train".to_string(),
            r.join("examples/search.toml").display().to_string(),
            format!("actor.model=\"{}\"", r.join("examples/tiny-search").display()),
            format!("data.train_files=[\"{}\"]", search.join("train.parquet").display()),
            format!("data.val_files=[\"{}\"]", search.join("test.parquet").display()),
            "trainer.total_steps=2".into(),
            "trainer.test_freq=0".into(),
            "trainer.val_before_train=false".into(),
            "trainer.save_freq=0".into(),
            "trainer.logger=[\"jsonl\"]".into(),
            "data.train_batch_size=8".into(),
            "actor.ppo_mini_batch_size=8".into(),
            "actor.ppo_micro_batch_size=64".into(),
            format!("trainer.default_local_dir=\"{}\"", out.display()),
            "--resume".into(),
            "none".into(),
        ]
        .to_vec()
    };
    let local_search = tmp.path().join("local-search");
    let o = run(in_ns(&hosts.a, &home, Some(TOKEN), &search_args(&local_search).iter().map(String::as_str).collect::<Vec<_>>()));
    assert!(o.status.success(), "the search run in one process failed");
    let ray_search = tmp.path().join("ray-search");
    let mut args = search_args(&ray_search);
    args.extend(["cluster.rollout.nnodes=2".into(), "cluster.rollout.gpus_per_node=1".into(), "--ray".into()]);
    let o = run(in_ns(&hosts.a, &home, Some(TOKEN), &args.iter().map(String::as_str).collect::<Vec<_>>()));
    assert!(o.status.success(), "the search run on Ray failed");
    let placement: serde_json::Value = serde_json::from_slice(&std::fs::read(ray_search.join("placement.json")).unwrap()).unwrap();
    let rollout_nodes: std::collections::BTreeSet<String> = placement["groups"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|g| g["group"] == "rollout")
        .flat_map(|g| g["ranks"].as_array().unwrap().iter().map(|r| r["node_ip"].as_str().unwrap().to_string()))
        .collect();
    assert_eq!(rollout_nodes.len(), 2, "a rollout rank on each node: {placement}");
    same_metrics(&local_search, &ray_search, 2);
    let rows = metrics(&ray_search.join("metrics.jsonl"));
    assert!(rows.iter().all(|r| r["env/number_of_actions/mean"].is_number() && r["retrieval/queries"].is_number()), "{rows:?}");
    // Each node's server answered its own node's rank.
    for (ns, ip) in [(&hosts.a, IP_A), (&hosts.b, IP_B)] {
        let h = sh(&["ip", "netns", "exec", ns, "curl", "-s", "http://127.0.0.1:8000/health"]);
        let v: serde_json::Value = serde_json::from_slice(&h.stdout).unwrap_or_else(|e| panic!("{ip}: /health: {e}: {}", tail(&h.stdout)));
        assert!(v["requests"].as_u64().unwrap_or(0) > 0, "the server on {ip} saw no request from its node's rollout rank: {v}");
    }
    let stopped = run(in_ns(&hosts.a, &home, Some(TOKEN), &["retrieval", "stop", "--cluster", &format!("{IP_A}:6379")]));
    assert!(stopped.status.success() && String::from_utf8_lossy(&stopped.stdout).matches("stopped").count() == 2);
    let h = sh(&["ip", "netns", "exec", &hosts.b, "curl", "-s", "-m", "2", "http://127.0.0.1:8000/health"]);
    assert!(!h.status.success(), "the server on {IP_B} still answers after stop");

    // verl's tool agent on the cluster: the rollout ranks run the turns themselves (the tool
    // config and each row's tools_kwargs go with the request); the same as in one process.
    let tiny = repo().join("crates/reinforge-trainer/tests/data/tiny-tools");
    let tool_cfg = tmp.path().join("tools.toml");
    std::fs::write(
        &tool_cfg,
        format!(
            "[data]\ntrain_files = [\"{}\"]\nmax_prompt_length = 32\nmax_response_length = 48\ntrain_batch_size = 4\n\
             [actor]\nmodel = \"{}\"\ninit = \"random\"\ninit_seed = 3\nlr = 1e-3\nppo_mini_batch_size = 4\nppo_micro_batch_size = 16\n\
             [rollout]\nn = 4\n[reward]\nkind = \"math\"\nparams = {{ extract = \"gsm8k_flexible\" }}\n\
             [tools.calls]\nenable = true\ntool_config_path = \"{}\"\nmax_assistant_turns = 3\n\
             [trainer]\ntotal_steps = 2\ntest_freq = 0\nsave_freq = 0\nlogger = [\"jsonl\"]\n",
            tiny.join("train.jsonl").display(),
            tiny.display(),
            repo().join("crates/reinforge-trainer/tests/data/gsm8k_tool_config.yaml").display()
        ),
    )
    .unwrap();
    let tool_args = |out: &Path| -> Vec<String> {
        vec!["train".into(), tool_cfg.display().to_string(), format!("trainer.default_local_dir=\"{}\"", out.display()), "--resume".into(), "none".into()]
    };
    let local_tools = tmp.path().join("local-tools");
    let o = run(in_ns(&hosts.a, &home, Some(TOKEN), &tool_args(&local_tools).iter().map(String::as_str).collect::<Vec<_>>()));
    assert!(o.status.success(), "the tool-calling run in one process failed: {}", tail(&o.stderr));
    let ray_tools = tmp.path().join("ray-tools");
    let mut args = tool_args(&ray_tools);
    args.extend(["cluster.rollout.nnodes=2".into(), "cluster.rollout.gpus_per_node=1".into(), "--ray".into()]);
    let o = run(in_ns(&hosts.a, &home, Some(TOKEN), &args.iter().map(String::as_str).collect::<Vec<_>>()));
    assert!(o.status.success(), "the tool-calling run on Ray failed: {}", tail(&o.stderr));
    same_metrics(&local_tools, &ray_tools, 2);
    let rows = metrics(&ray_tools.join("metrics.jsonl"));
    assert!(rows.iter().any(|r| r["tool_calls/mean"].as_f64().unwrap_or(0.0) > 0.0), "no tool call on the cluster: {rows:?}");

    // More than the cluster has: refused before anything starts, saying what exists.
    let t = Instant::now();
    let big = train_on_ray(&hosts.a, &home, &tmp.path().join("big"), 1, &["cluster.actor.gpus_per_node=8", "actor.ppo_micro_batch_size=32"]);
    let err = String::from_utf8_lossy(&big.stderr).to_string();
    assert!(!big.status.success() && err.contains("cannot place worker group 'policy'") && err.contains("2 alive node(s)"), "{err}");
    assert!(t.elapsed() < Duration::from_secs(30));

    let list = run(in_ns(&hosts.a, &home, Some(TOKEN), &["job", "list", "--address", "http://127.0.0.1:8265"]));
    let list_out = String::from_utf8_lossy(&list.stdout).to_string();
    assert!(list_out.contains("rf-train-1") && list_out.contains("SUCCEEDED"), "{list_out}");
    let logs = run(in_ns(&hosts.a, &home, Some(TOKEN), &["job", "logs", "rf-train-1", "--address", "http://127.0.0.1:8265"]));
    assert!(String::from_utf8_lossy(&logs.stdout).contains("workers ready"));

    // No token, no job (a Ray older than token auth: no opt-out, no job).
    let mut c = in_ns(&hosts.a, &home, None, &["job", "submit", "--address", "http://127.0.0.1:8265", "--no-wait", "--", "true"]);
    c.env_remove("REINFORGE_NO_AUTH");
    let denied = run(c);
    assert!(!denied.status.success());
    assert!(String::from_utf8_lossy(&denied.stderr).to_lowercase().contains("token"));

    // Lose the worker node in the middle of a run: the job fails, naming it, in bounded time.
    let lost_out = tmp.path().join("lost");
    assert!(submit_training(&hosts.a, &home, "rf-train-2", &lost_out, 500, false, &["trainer.max_restarts=0", SLOW]).status.success());
    wait_first_step(&hosts.a, &home, "rf-train-2", &lost_out);

    // `cluster status` shows the live run: its step and phase, each rank's activity and node.
    let st = run(in_ns(&hosts.a, &home, Some(TOKEN), &["cluster", "status", "--address", "http://127.0.0.1:8265"]));
    let text = String::from_utf8_lossy(&st.stdout).to_string();
    assert!(text.contains(&format!("job rf-train-2 ({}): step ", lost_out.display())), "{text}");
    for rank in ["policy:0", "policy:1", "rollout:0", "rollout:1"] {
        assert!(text.lines().any(|l| l.starts_with(rank) && (l.contains(IP_A) || l.contains(IP_B))), "{rank} missing: {text}");
    }

    // One writer per run directory. The directory is shared by both hosts: a run started on
    // the other host is refused, naming the job that holds it; so is a second job submitted
    // for it, before it reaches the cluster.
    let mut args = train_args(&lost_out, 3);
    args.pop();
    args.push("auto".into());
    let argv: Vec<&str> = args.iter().map(String::as_str).collect();
    let t = Instant::now();
    let second = run(in_ns(&hosts.b, &home, None, &argv));
    let err = String::from_utf8_lossy(&second.stderr).to_string();
    assert!(!second.status.success() && err.contains("is in use by another run") && err.contains("Ray job rf-train-2"), "{err}");
    assert!(err.contains("`reinforge job stop rf-train-2`"), "{err}");
    eprintln!("TIMING a second run on the other host was refused in {:.1}s", t.elapsed().as_secs_f64());
    let dup = submit_training(&hosts.a, &home, "rf-train-2b", &lost_out, 3, false, &[]);
    let err = String::from_utf8_lossy(&dup.stderr).to_string();
    assert!(!dup.status.success() && err.contains("not submitted") && err.contains("Ray job rf-train-2"), "{err}");
    assert!(!job_status(&hosts.a, &home, "rf-train-2b").contains("RUNNING"), "the refused job must not exist");

    Hosts::kill_all(&hosts.b);
    let (status, secs) = wait_failed(&hosts.a, &home, "rf-train-2", Duration::from_secs(90), Duration::from_secs(1), "of losing a node");
    eprintln!("TIMING job failed {secs:.1}s after the worker node was killed: {status}");
    let logs = run(in_ns(&hosts.a, &home, Some(TOKEN), &["job", "logs", "rf-train-2", "--address", "http://127.0.0.1:8265"]));
    let text = String::from_utf8_lossy(&logs.stdout).to_string();
    assert!(text.contains(&format!("on node {IP_B}")), "the failure must name the lost node {IP_B}: {}", tail(&logs.stdout));

    // Automatic recovery: the worker node dies (kill -9 of everything on it) at step 3 of 6
    // and comes back; the job restarts itself from its last checkpoint, waits for room to
    // place its workers again, and ends SUCCEEDED with the metrics of an uninterrupted run.
    rejoin(&hosts, &home, &tmp.path().join("b2"));
    // Until Ray's health check declares the killed node dead (up to 30 s), Ray 2.41 schedules
    // a new job's supervisor through it and fails the job: submit on a settled cluster.
    wait_alive(&hosts, &home, 2);
    let local6 = tmp.path().join("local6");
    assert!(run({
        let mut c = Command::new(BIN);
        c.args(train_args(&local6, 6)).arg(SLOW);
        c
    })
    .status
    .success());
    let rec_out = tmp.path().join("recover");
    assert!(submit_training(&hosts.a, &home, "rf-train-4", &rec_out, 6, false, &["trainer.save_freq=1", SLOW]).status.success());
    wait_rows(&hosts.a, &home, "rf-train-4", &rec_out, 2);
    let t_kill = Instant::now();
    Hosts::kill_all(&hosts.b);
    rejoin(&hosts, &home, &tmp.path().join("b3"));
    let text = wait_succeeded(&hosts.a, &home, "rf-train-4", Duration::from_secs(240), "recover", || ());
    eprintln!("TIMING recovered job finished {:.1}s after the node was killed", t_kill.elapsed().as_secs_f64());
    assert!(text.contains("restart 1/3:") && text.contains(&format!("on node {IP_B}")) && text.contains("back to training"), "{}", tail(text.as_bytes()));
    for line in text.lines().filter(|l| l.contains("back to training") || l.starts_with("restart ")) {
        eprintln!("TIMING recovery: {line}");
    }
    same_metrics(&local6, &rec_out, 6);

    // A network cut, and the elastic floor: the actor spans both nodes (one rank each, rollout
    // and reference in its processes); node B's link goes down for good at step 3 of 6. The
    // heartbeats stop, the run restarts, and with cluster.min_nodes = 1 it goes on with one rank
    // on node A once Ray has given B up (the same global batch over fewer data-parallel ranks);
    // its metrics still equal the uninterrupted single-process run's.
    wait_alive(&hosts, &home, 2);
    let el_out = tmp.path().join("elastic");
    let elastic = [
        SLOW,
        "trainer.save_freq=1",
        "cluster.colocate_all=true",
        "cluster.actor.nnodes=2",
        "cluster.actor.gpus_per_node=1",
        "cluster.min_nodes=1",
        "cluster.elastic_wait_s=0",
    ];
    assert!(submit_training(&hosts.a, &home, "rf-train-6", &el_out, 6, false, &elastic).status.success());
    wait_rows(&hosts.a, &home, "rf-train-6", &el_out, 2);
    let t_kill = Instant::now();
    let (_, vb) = hosts.links();
    assert!(sh(&["ip", "-n", &hosts.b, "link", "set", &vb, "down"]).status.success());
    let text = wait_succeeded(&hosts.a, &home, "rf-train-6", Duration::from_secs(300), "go on with fewer nodes", || ());
    eprintln!("TIMING elastic job finished {:.1}s after node B's network was cut for good", t_kill.elapsed().as_secs_f64());
    assert!(text.contains("going on with 1 of 2 node(s)") && text.contains("on 1 node(s) (cluster.min_nodes)"), "{}", tail(text.as_bytes()));
    assert!(text.contains(&format!("on node {IP_B}: no heartbeat for")), "the cut is found by the heartbeats: {}", tail(text.as_bytes()));
    for line in text.lines().filter(|l| l.contains("back to training") || l.starts_with("restart ")) {
        eprintln!("TIMING elastic: {line}");
    }
    let placement: serde_json::Value = serde_json::from_slice(&std::fs::read(el_out.join("placement.json")).unwrap()).unwrap();
    let policy = placement["groups"].as_array().unwrap().iter().find(|g| g["group"] == "policy").unwrap();
    let ips: Vec<&str> = policy["ranks"].as_array().unwrap().iter().map(|r| r["node_ip"].as_str().unwrap()).collect();
    assert_eq!(ips, [IP_A], "after the loss the actor runs on node A alone: {placement}");
    same_metrics(&local6, &el_out, 6);
    assert!(sh(&["ip", "-n", &hosts.b, "link", "set", &vb, "up"]).status.success());
    Hosts::kill_all(&hosts.b);
    rejoin(&hosts, &home, &tmp.path().join("b5"));
    wait_alive(&hosts, &home, 2);

    // A hang the heartbeats cannot see: the actor's two ranks (one per node) all-reduce over a
    // connection of their own, and a firewall rule drops that one connection at step 3 of 6.
    // Both ranks wait in the all-reduce while their heartbeats flow; the stall watchdog names
    // them and, with trainer.on_stall = restart, the run restarts from its last checkpoint and
    // ends with the metrics of the uninterrupted run.
    let st_out = tmp.path().join("stall-restart");
    let stall = [
        SLOW,
        "trainer.save_freq=1",
        "cluster.colocate_all=true",
        "cluster.actor.nnodes=2",
        "cluster.actor.gpus_per_node=1",
        "cluster.controller_port=29650",
        "trainer.stall_timeout_s=4",
        "trainer.on_stall=\"restart\"",
    ];
    assert!(submit_training(&hosts.a, &home, "rf-train-7", &st_out, 6, false, &stall).status.success());
    wait_rows(&hosts.a, &home, "rf-train-7", &st_out, 2);
    let star = all_reduce_connection(&hosts.b);
    let t_hang = Instant::now();
    nft(&hosts.b, &[
        vec!["add", "table", "inet", "rfstall"],
        vec!["add", "chain", "inet", "rfstall", "out", "{ type filter hook output priority 0; }"],
        vec!["add", "rule", "inet", "rfstall", "out", "ip", "daddr", IP_A, "tcp", "sport", &star.0, "tcp", "dport", &star.1, "drop"],
    ]);
    let mut dropped = true;
    let text = wait_succeeded(&hosts.a, &home, "rf-train-7", Duration::from_secs(240), "restart and finish", || {
        if dropped && job_logs(&hosts.a, &home, "rf-train-7").contains("restart 1/3: ") {
            // The restarted run makes new connections; the rule is for the old one only.
            nft(&hosts.b, &[vec!["delete", "table", "inet", "rfstall"]]);
            dropped = false;
            eprintln!("TIMING stall found and the run restarting {:.1}s after the all-reduce hung", t_hang.elapsed().as_secs_f64());
        }
    });
    assert!(text.contains("stall: step ") && text.contains(": all-reduce for"), "the watchdog names the hang: {}", tail(text.as_bytes()));
    assert!(text.contains("(trainer.on_stall = restart)") && text.contains("back to training"), "{}", tail(text.as_bytes()));
    for line in text.lines().filter(|l| l.contains("back to training") || l.starts_with("restart ")) {
        eprintln!("TIMING stall restart: {line}");
    }
    same_metrics(&local6, &st_out, 6);

    // A node that vanishes without closing its connections (cable pulled): its workers'
    // heartbeats stop, and the run stops within seconds (cluster.heartbeat_timeout_s = 6 by
    // default), naming the node, instead of waiting for Ray's health checks (over a minute).
    let cut_out = tmp.path().join("cut");
    assert!(submit_training(&hosts.a, &home, "rf-train-3", &cut_out, 500, false, &["trainer.max_restarts=0", SLOW]).status.success());
    wait_first_step(&hosts.a, &home, "rf-train-3", &cut_out);
    assert!(sh(&["ip", "-n", &hosts.b, "link", "set", &vb, "down"]).status.success());
    let (status, secs) = wait_failed(&hosts.a, &home, "rf-train-3", Duration::from_secs(30), Duration::from_millis(500), "of a network cut");
    eprintln!("TIMING job failed {secs:.1}s after the worker node's network was cut: {status}");
    let logs = run(in_ns(&hosts.a, &home, Some(TOKEN), &["job", "logs", "rf-train-3", "--address", "http://127.0.0.1:8265"]));
    let text = String::from_utf8_lossy(&logs.stdout).to_string();
    assert!(text.contains(&format!("on node {IP_B}: no heartbeat for")), "{}", tail(&logs.stdout));

    // Faults for the doctor to find. Node B comes back with a 16 MiB /dev/shm, its own private
    // copy of the checkpoint directory's parent, and a different reinforge binary at the same
    // path (each a mount in a mount namespace of its own, as a container would have it), and a
    // firewall dropping the controller's port towards the head.
    assert!(sh(&["ip", "-n", &hosts.b, "link", "set", &vb, "up"]).status.success());
    Hosts::kill_all(&hosts.b);
    wait_alive(&hosts, &home, 1);
    let private = tmp.path().join("private");
    std::fs::create_dir_all(&private).unwrap();
    let other_bin = tmp.path().join("reinforge-other");
    std::fs::copy(BIN, &other_bin).unwrap();
    std::fs::OpenOptions::new().append(true).open(&other_bin).unwrap().write_all(b"another build").unwrap();
    let faults = format!(
        "mount -t tmpfs -o size=16m tmpfs /dev/shm && mount -t tmpfs tmpfs {private} && mount --bind {other} {bin} &&",
        private = private.display(),
        other = other_bin.display(),
        bin = BIN,
    );
    let c = join_b(&hosts.b, &home, tmp.path(), &tmp.path().join("b4"), &faults, &[]);
    assert!(run(c).status.success(), "node B did not rejoin in its faulty namespace");
    wait_alive(&hosts, &home, 2);
    nft(&hosts.b, &[
        vec!["add", "table", "inet", "rf"],
        vec!["add", "chain", "inet", "rf", "out", "{ type filter hook output priority 0; }"],
        vec!["add", "rule", "inet", "rf", "out", "ip", "daddr", IP_A, "tcp", "dport", "29650", "drop"],
    ]);
    let run_dir = private.join("run");
    let (ok, checks, secs) = doctor(
        &hosts,
        &home,
        &run_dir,
        &["cluster.controller_port=29650", "data.train_batch_size=2000", "rollout.n=512", "actor.ppo_mini_batch_size=2000"],
    );
    eprintln!("TIMING doctor on 2 nodes, with faults: {secs:.1}s");
    assert!(!ok, "doctor must fail");
    let failed = |checks: &[serde_json::Value], name: &str, node: Option<&str>, text: &str| {
        let found = finding(checks, name, node);
        assert!(
            found.iter().any(|c| c["status"] == "FAIL" && c["saw"].as_str().unwrap().contains(text) && c["fix"].is_string()),
            "expected a FAIL for {name} on {node:?} saying `{text}`: {found:?}"
        );
    };
    failed(&checks, "ports", Some(IP_B), &format!("cannot reach the controller at {IP_A}:29650"));
    failed(&checks, "shared dir", Some(IP_B), &format!("is not shared: this node does not see the files written there by {IP_A}"));
    failed(&checks, "shared dir", Some(IP_A), &format!("by {IP_B}"));
    failed(&checks, "binary", Some(IP_B), "a different reinforge");
    failed(&checks, "shm", Some(IP_B), "/dev/shm is 16 MiB");
    // 2000 prompts × 512 samples: the rollout ranks' KV cache does not fit, wherever they land.
    assert!(
        checks.iter().any(|c| c["name"] == "memory" && c["status"] == "FAIL" && c["saw"].as_str().unwrap().contains("2 × rollout")),
        "no memory failure for the rollout's node: {checks:?}"
    );
    for name in ["binary", "shm", "ports"] {
        assert!(finding(&checks, name, Some(IP_A)).iter().all(|c| c["status"] == "PASS"), "{name} on the head must pass: {checks:?}");
    }
    let (ok, checks, _) = doctor(&hosts, &home, &tmp.path().join("doc"), &["cluster.actor.gpus_per_node=8", "actor.ppo_micro_batch_size=4"]);
    assert!(!ok);
    failed(&checks, "placement", None, "cannot place worker group 'policy': it needs 1 node(s) with 8 CPU");

    // The same checks stop `train --ray` before anything is placed.
    let t = Instant::now();
    let refused = train_on_ray(&hosts.a, &home, &tmp.path().join("refused"), 2, &[]);
    let err = String::from_utf8_lossy(&refused.stderr).to_string();
    assert!(!refused.status.success() && err.contains("preflight failed:") && err.contains("binary on 10.77.0.2"), "{err}");
    assert!(!err.contains("workers ready"), "nothing may be placed: {err}");
    eprintln!("TIMING train --ray refused by its preflight in {:.1}s", t.elapsed().as_secs_f64());
    eprintln!("TIMING whole two-host test {:.1}s", t_test.elapsed().as_secs_f64());
    drop(hosts);
}

/// `train --ray` without a reachable cluster: one line, within seconds (not Ray's reconnect
/// timeouts), for a named head and for `auto`.
#[test]
fn train_on_ray_without_a_cluster_fails_fast() {
    support::ensure_ray();
    let tmp = tempfile::tempdir().unwrap();
    let closed = {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        l.local_addr().unwrap().port()
    };
    for (addr, expect) in [(format!("127.0.0.1:{closed}"), "no Ray head answers at"), ("auto".to_string(), "Could not find any running Ray instance")] {
        let t = Instant::now();
        let mut c = Command::new(BIN);
        c.args(train_args(&tmp.path().join("x"), 1)).arg(format!("--ray={addr}"));
        c.env("HOME", tmp.path()).env_remove("RAY_ADDRESS");
        let o = c.output().unwrap();
        let err = String::from_utf8_lossy(&o.stderr).to_string();
        assert!(!o.status.success(), "{addr}: should fail");
        let line = err.lines().find(|l| l.starts_with("error:")).unwrap_or_else(|| panic!("{addr}: no error line in {err}"));
        assert!(line.contains(expect), "{addr}: {line}");
        assert!(t.elapsed() < Duration::from_secs(30), "{addr}: took {:?}", t.elapsed());
    }
}
