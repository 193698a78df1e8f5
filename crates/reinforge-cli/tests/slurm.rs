//! Slurm for real: slurmctld and two slurmd (Debian's Slurm, munge for auth) on two test hosts
//! in network namespaces, each slurmd with its own hostname, `/etc/hosts` and `/tmp/ray` (as
//! separate machines have). The README's sbatch recipe (`examples/slurm/reinforge.sbatch`, its
//! GPU line dropped: the test hosts have none) brings Ray up on both nodes with `reinforge
//! cluster start`, runs a tiny GRPO job across them with `reinforge job submit`, and takes Ray
//! down on every node when it ends.
//!
//! Needs root, iproute2, util-linux `unshare`, slurmctld, slurmd, munge and openssl (`.ci/run`
//! installs them), and Ray. Outside CI, without them, it says so and passes; in CI that is a
//! failure.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

mod support;

use support::{is_root, sh, Hosts, IP_A, IP_B};

const BIN: &str = env!("CARGO_BIN_EXE_reinforge");

fn prerequisites() -> bool {
    let has = |cmd: &str, arg: &str| Command::new(cmd).arg(arg).output().is_ok();
    let ok = is_root()
        && has("ip", "-V")
        && has("unshare", "--version")
        && has("nsenter", "--version")
        && has("slurmctld", "-V")
        && has("slurmd", "-V")
        && has("sbatch", "--version")
        && has("munged", "--version")
        && has("openssl", "version");
    if !ok {
        assert!(
            std::env::var("CI").is_err(),
            "CI must run the Slurm test: it needs root, iproute2, unshare, slurmctld, slurmd, slurm-client, munge and openssl"
        );
        eprintln!("skipping the Slurm test: it needs root, iproute2, unshare, Slurm (slurmctld, slurmd, slurm-client), munge and openssl (CI has them)");
        return false;
    }
    support::ensure_ray();
    true
}

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..").canonicalize().unwrap()
}

/// Everything of one test cluster under one directory.
struct Slurm {
    dir: PathBuf,
    conf: PathBuf,
    daemons: Vec<Child>,
}

impl Slurm {
    /// munged, slurmctld on host A, a slurmd on each host.
    fn up(hosts: &Hosts, dir: &Path) -> Slurm {
        for d in ["state", "spool/nodea", "spool/nodeb", "ray-a", "ray-b", "submit"] {
            std::fs::create_dir_all(dir.join(d)).unwrap();
        }
        // munge: a key of our own and a socket of our own, shared by both hosts (one machine).
        let key = dir.join("munge.key");
        std::fs::write(&key, random_bytes(1024)).unwrap();
        sh(&["chmod", "0400", &key.display().to_string()]);
        let sock = dir.join("munge.sock");
        let o = sh(&[
            "munged",
            "--force",
            &format!("--key-file={}", key.display()),
            &format!("--socket={}", sock.display()),
            &format!("--pid-file={}", dir.join("munged.pid").display()),
            &format!("--log-file={}", dir.join("munged.log").display()),
            &format!("--seed-file={}", dir.join("munged.seed").display()),
        ]);
        assert!(o.status.success(), "munged: {}{}", String::from_utf8_lossy(&o.stderr), log_of(&dir.join("munged.log")));

        let conf = dir.join("slurm.conf");
        let d = dir.display();
        std::fs::write(
            &conf,
            format!(
                "ClusterName=rftest
SlurmctldHost=nodea({IP_A})
AuthType=auth/munge
AuthInfo=socket={sock}
CredType=cred/munge
SlurmUser=root
SlurmdUser=root
StateSaveLocation={d}/state
SlurmdSpoolDir={d}/spool/%n
SlurmctldPidFile={d}/slurmctld.pid
SlurmdPidFile={d}/slurmd-%n.pid
SlurmctldLogFile={d}/slurmctld.log
SlurmdLogFile={d}/slurmd-%n.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
SchedulerType=sched/builtin
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU
ReturnToService=2
MpiDefault=none
NodeName=nodea NodeHostname=nodea NodeAddr={IP_A} CPUs=2 State=UNKNOWN
NodeName=nodeb NodeHostname=nodeb NodeAddr={IP_B} CPUs=2 State=UNKNOWN
PartitionName=rf Nodes=nodea,nodeb Default=YES MaxTime=INFINITE State=UP
",
                sock = sock.display()
            ),
        )
        .unwrap();
        let hosts_file = dir.join("hosts");
        let base = std::fs::read_to_string("/etc/hosts").unwrap_or_default();
        std::fs::write(&hosts_file, format!("{base}\n{IP_A} nodea\n{IP_B} nodeb\n")).unwrap();
        std::fs::create_dir_all("/tmp/ray").unwrap();

        let mut s = Slurm { dir: dir.to_path_buf(), conf, daemons: Vec::new() };
        s.daemons.push(s.on(&hosts.a, "nodea", "ray-a", &["slurmctld", "-D", "-f", &s.conf.display().to_string()]).spawn().unwrap());
        std::thread::sleep(Duration::from_secs(1));
        s.daemons.push(s.on(&hosts.a, "nodea", "ray-a", &["slurmd", "-D", "-f", &s.conf.display().to_string()]).spawn().unwrap());
        s.daemons.push(s.on(&hosts.b, "nodeb", "ray-b", &["slurmd", "-D", "-f", &s.conf.display().to_string()]).spawn().unwrap());
        s
    }

    /// `args` on a host as its own machine: in network namespace `ns`, with hostname `name`,
    /// the test's `/etc/hosts` and a `/tmp/ray` of its own.
    fn on(&self, ns: &str, name: &str, ray_dir: &str, args: &[&str]) -> Command {
        let script = format!(
            "hostname {name} && mount --bind {hosts} /etc/hosts && mount --bind {ray} /tmp/ray && exec \"$@\"",
            hosts = self.dir.join("hosts").display(),
            ray = self.dir.join(ray_dir).display()
        );
        // nsenter, not `ip netns exec`: that one remounts /sys, and slurmd needs the cgroup
        // hierarchy under it.
        let mut c = Command::new("nsenter");
        c.arg(format!("--net=/run/netns/{ns}"));
        c.args(["unshare", "-u", "-m", "--propagation", "private", "sh", "-c", &script, "sh"]).args(args);
        c.env("SLURM_CONF", &self.conf).stdout(Stdio::null()).stderr(Stdio::null());
        c
    }

    fn logs(&self) -> String {
        ["slurmctld.log", "slurmd-nodea.log", "slurmd-nodeb.log"].iter().map(|f| log_of(&self.dir.join(f))).collect::<Vec<_>>().join("\n")
    }
}

impl Drop for Slurm {
    fn drop(&mut self) {
        for d in &mut self.daemons {
            let _ = d.kill();
            let _ = d.wait();
        }
        if let Ok(pid) = std::fs::read_to_string(self.dir.join("munged.pid")) {
            let _ = sh(&["kill", pid.trim()]);
        }
    }
}

/// `n` random bytes from the kernel (a munge key must not be predictable, even in a test).
fn random_bytes(n: usize) -> Vec<u8> {
    use std::io::Read;
    let mut b = vec![0u8; n];
    std::fs::File::open("/dev/urandom").and_then(|mut f| f.read_exact(&mut b)).unwrap();
    b
}

fn log_of(path: &Path) -> String {
    let text = std::fs::read_to_string(path).unwrap_or_default();
    let lines: Vec<&str> = text.lines().collect();
    format!("--- {} (last 30 lines)\n{}", path.display(), lines[lines.len().saturating_sub(30)..].join("\n"))
}

/// The processes left in namespace `ns` whose command name is one of Ray's daemons.
fn ray_processes(ns: &str) -> Vec<String> {
    let pids = sh(&["ip", "netns", "pids", ns]);
    String::from_utf8_lossy(&pids.stdout)
        .split_whitespace()
        .filter_map(|pid| std::fs::read_to_string(format!("/proc/{pid}/comm")).ok().map(|c| format!("{pid} {}", c.trim())))
        .filter(|p| ["raylet", "gcs_server", "ray::", "dashboard"].iter().any(|n| p.contains(n)))
        .collect()
}

#[test]
fn the_readme_sbatch_recipe_runs_on_two_slurm_nodes() {
    if !prerequisites() {
        return;
    }
    let t_test = Instant::now();
    let tmp = tempfile::Builder::new().prefix("rfsl").tempdir_in("/tmp").unwrap();
    let hosts = Hosts::up();
    hosts.default_routes();
    let slurm = Slurm::up(&hosts, tmp.path());

    // Both nodes registered and idle.
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let o = slurm.on(&hosts.a, "nodea", "ray-a", &["sinfo", "-h", "-N", "-o", "%N %t"]).stdout(Stdio::piped()).output().unwrap();
        let text = String::from_utf8_lossy(&o.stdout).to_string();
        if text.lines().filter(|l| l.ends_with(" idle")).count() == 2 {
            break;
        }
        assert!(Instant::now() < deadline, "the Slurm nodes never became idle: {text}\n{}", slurm.logs());
        std::thread::sleep(Duration::from_millis(500));
    }
    eprintln!("TIMING slurmctld and two slurmd up in {:.1}s", t_test.elapsed().as_secs_f64());

    // The recipe as README shows it, less its GPU request.
    let recipe = std::fs::read_to_string(repo().join("examples/slurm/reinforge.sbatch")).unwrap();
    let readme = std::fs::read_to_string(repo().join("README.md")).unwrap();
    assert!(readme.contains(&format!("```bash\n{recipe}```")), "README must show examples/slurm/reinforge.sbatch as it is");
    let script = tmp.path().join("submit/reinforge.sbatch");
    std::fs::write(&script, recipe.lines().filter(|l| !l.contains("--gpus-per-node")).collect::<Vec<_>>().join("\n") + "\n").unwrap();
    let cfg = tmp.path().join("submit/cfg.toml");
    std::fs::write(
        &cfg,
        format!(
            "{}\n",
            std::fs::read_to_string(repo().join("examples/quickstart.toml"))
                .unwrap()
                .replace("[trainer]", "[trainer]\ndefault_local_dir = \"runs/slurm\"")
        ),
    )
    .unwrap();
    // The job gets this environment (sbatch's default): `reinforge` and Ray's venv on PATH.
    let path = format!("{}:{}", Path::new(BIN).parent().unwrap().display(), std::env::var("PATH").unwrap_or_default());
    let t_job = Instant::now();
    let o = slurm
        .on(&hosts.a, "nodea", "ray-a", &[
            "sbatch",
            "--parsable",
            &format!("--chdir={}", tmp.path().join("submit").display()),
            &script.display().to_string(),
            "cfg.toml",
            &format!("actor.model=\"{}\"", repo().join("examples/tiny-arith").display()),
            "trainer.total_steps=2",
            "trainer.test_freq=0",
            "trainer.val_before_train=false",
            "trainer.logger=[\"jsonl\"]",
        ])
        .env("PATH", &path)
        .env("RANKS_PER_NODE", "1")
        .env("HOME", tmp.path())
        .env_remove("RAY_ADDRESS")
        .env_remove("RAY_AUTH_TOKEN")
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .output()
        .unwrap();
    assert!(o.status.success(), "sbatch: {}\n{}", String::from_utf8_lossy(&o.stderr), slurm.logs());
    let job = String::from_utf8_lossy(&o.stdout).trim().to_string();
    let out = tmp.path().join(format!("submit/reinforge-{job}.out"));

    // Until Slurm says the job is over.
    let deadline = Instant::now() + Duration::from_secs(300);
    let state = loop {
        let o = slurm.on(&hosts.a, "nodea", "ray-a", &["scontrol", "show", "job", &job]).stdout(Stdio::piped()).output().unwrap();
        let text = String::from_utf8_lossy(&o.stdout).to_string();
        let state = text.split_whitespace().find_map(|w| w.strip_prefix("JobState=")).unwrap_or("?").to_string();
        if !["PENDING", "RUNNING", "CONFIGURING", "COMPLETING", "?"].contains(&state.as_str()) {
            break text;
        }
        assert!(Instant::now() < deadline, "Slurm job {job} still {state} after 5 min:\n{}\n{}", log_of(&out), slurm.logs());
        std::thread::sleep(Duration::from_secs(1));
    };
    let output = std::fs::read_to_string(&out).unwrap_or_default();
    eprintln!("TIMING sbatch job (Ray up on 2 nodes, 2 training steps, Ray down) {:.1}s", t_job.elapsed().as_secs_f64());
    assert!(state.contains("JobState=COMPLETED") && state.contains("ExitCode=0:0"), "the job did not complete:\n{state}\n{output}\n{}", slurm.logs());

    // The training ran on both nodes, in the directory sbatch was run from.
    let run = tmp.path().join("submit/runs/slurm");
    let rows = std::fs::read_to_string(run.join("metrics.jsonl")).unwrap_or_default().lines().count();
    assert_eq!(rows, 2, "two training steps in {}:\n{output}", run.display());
    let placement: serde_json::Value = serde_json::from_slice(&std::fs::read(run.join("placement.json")).unwrap()).unwrap();
    let policy = placement["groups"].as_array().unwrap().iter().find(|g| g["group"] == "policy").unwrap();
    let mut ips: Vec<&str> = policy["ranks"].as_array().unwrap().iter().map(|r| r["node_ip"].as_str().unwrap()).collect();
    ips.sort();
    assert_eq!(ips, [IP_A, IP_B], "one actor rank per Slurm node: {placement}");
    assert!(output.contains("role from Slurm"), "cluster start must say it took its role from Slurm:\n{output}");

    // Ray is down on both nodes.
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let left: Vec<String> = [&hosts.a, &hosts.b].iter().flat_map(|ns| ray_processes(ns)).collect();
        if left.is_empty() {
            break;
        }
        assert!(Instant::now() < deadline, "Ray processes left after the job: {left:?}");
        std::thread::sleep(Duration::from_millis(500));
    }
    eprintln!("TIMING whole Slurm test {:.1}s", t_test.elapsed().as_secs_f64());
    drop(slurm);
    drop(hosts);
}
