//! `reinforge cluster start|stop|status` and `reinforge job submit|list|status|logs|stop`:
//! Ray bring-up and Ray's Jobs API, with token auth on by default.

use anyhow::{bail, Context, Result};
use clap::{Args, Subcommand};
use reinforge_cluster::bringup::{self, Progress, StartOptions, Started};
use reinforge_cluster::jobs::{self, Dashboard, JobInfo, JobSpec};
use reinforge_cluster::{status, RayInstall};
use std::collections::BTreeMap;
use std::io::Write;
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

/// `reinforge cluster …`
#[derive(Subcommand)]
pub enum ClusterCmd {
    /// Start Ray on this node: `--head`, or `--address HEAD:PORT` to join (in any order), or
    /// from torchrun / RunPod / Slurm / dstack environment variables.
    Start(StartArgs),
    /// Stop every Ray process on this machine (`ray stop`).
    Stop(StopArgs),
    /// Nodes, GPUs and what runs where.
    Status(StatusArgs),
}

/// `reinforge job …`
#[derive(Subcommand)]
pub enum JobCmd {
    /// Submit a command as a Ray job and follow its logs until it ends.
    Submit(SubmitArgs),
    /// List the cluster's jobs.
    List(ListArgs),
    /// Show one job's status.
    Status(JobIdArgs),
    /// Print a job's logs (`--follow` until it ends).
    Logs(LogsArgs),
    /// Stop a job and wait until it has stopped.
    Stop(JobIdArgs),
}

#[derive(Args)]
pub struct StartArgs {
    /// Start the head node.
    #[arg(long, conflicts_with = "address")]
    head: bool,
    /// Join the head at HOST:PORT (waits for it; see --wait).
    #[arg(long, value_name = "HOST:PORT")]
    address: Option<String>,
    /// The head's Ray port (default 6379; not torchrun's MASTER_PORT).
    #[arg(long)]
    port: Option<u16>,
    /// The head's dashboard port (on a worker: where to check auth and registration).
    #[arg(long, default_value_t = jobs::DEFAULT_DASHBOARD_PORT)]
    dashboard_port: u16,
    /// This node's dashboard agent port (change it to run two nodes on one machine).
    #[arg(long, default_value_t = bringup::DEFAULT_AGENT_PORT)]
    dashboard_agent_listen_port: u16,
    /// The head's Ray Client server port.
    #[arg(long, default_value_t = bringup::DEFAULT_CLIENT_SERVER_PORT)]
    ray_client_server_port: u16,
    /// CPUs Ray may schedule on this node (default: all).
    #[arg(long)]
    num_cpus: Option<u32>,
    /// GPUs Ray may schedule on this node (default: all detected).
    #[arg(long)]
    num_gpus: Option<u32>,
    /// The IP other nodes reach this node at (default: Ray picks one).
    #[arg(long, value_name = "IP")]
    node_ip_address: Option<String>,
    /// Ray's temporary directory on this node (logs, sockets; default /tmp/ray).
    #[arg(long, value_name = "DIR")]
    temp_dir: Option<PathBuf>,
    /// The cluster token (default: RAY_AUTH_TOKEN, RAY_AUTH_TOKEN_PATH, ~/.ray/auth_token).
    #[arg(long)]
    token: Option<String>,
    /// Run without token auth (anyone who reaches the ports can run code): explicit opt-out
    /// (REINFORGE_NO_AUTH=1 says the same; Ray older than 2.52 has no token auth at all).
    #[arg(long)]
    no_auth: bool,
    /// Worker: how long to wait for the head to answer, in seconds.
    #[arg(long, value_name = "SECS", default_value_t = 300)]
    wait: u64,
    /// Stay in the foreground until Ray stops (for Slurm/containers); Ctrl-C stops the node.
    #[arg(long)]
    block: bool,
}

#[derive(Args)]
pub struct StopArgs {
    /// Kill with SIGKILL instead of asking politely.
    #[arg(long)]
    force: bool,
}

/// Where the dashboard is and how to authenticate.
#[derive(Args)]
pub struct Conn {
    /// The head's dashboard (default: RAY_API_SERVER_ADDRESS, an http RAY_ADDRESS, http://127.0.0.1:8265).
    #[arg(long, value_name = "URL")]
    address: Option<String>,
    /// The cluster token (default: RAY_AUTH_TOKEN, RAY_AUTH_TOKEN_PATH, ~/.ray/auth_token).
    #[arg(long)]
    token: Option<String>,
    /// Talk to a cluster that runs without token auth (refused otherwise; REINFORGE_NO_AUTH=1
    /// says the same for every command).
    #[arg(long)]
    allow_no_auth: bool,
}

impl Conn {
    fn open(&self) -> Result<Dashboard> {
        let d = reinforge_cluster::connect(self.address.as_deref(), self.token.as_deref())?;
        d.ensure_auth(self.allow_no_auth)?;
        Ok(d)
    }
}

#[derive(Args)]
pub struct StatusArgs {
    #[command(flatten)]
    conn: Conn,
    /// Print JSON.
    #[arg(long)]
    json: bool,
}

#[derive(Args)]
pub struct SubmitArgs {
    #[command(flatten)]
    conn: Conn,
    /// A local directory to upload; the job runs inside it (.git and target/ are left out).
    #[arg(long, value_name = "DIR")]
    working_dir: Option<PathBuf>,
    /// Run the command in DIR on the node that runs it (the head): a directory that node sees,
    /// e.g. on a shared filesystem, so relative paths mean what they mean here (sbatch's
    /// --chdir). Without it (and without --working-dir) the command starts wherever Ray starts it.
    #[arg(long, value_name = "DIR", conflicts_with = "working_dir")]
    chdir: Option<PathBuf>,
    /// An environment variable for the job (repeatable).
    #[arg(long = "env", value_name = "KEY=VALUE")]
    env: Vec<String>,
    /// Choose the job's id (default: Ray makes one).
    #[arg(long, value_name = "ID")]
    submission_id: Option<String>,
    /// Print the id and return instead of following the logs.
    #[arg(long)]
    no_wait: bool,
    /// The command (after `--`; one word is run as a shell command line).
    #[arg(last = true, required = true, value_name = "CMD")]
    command: Vec<String>,
}

#[derive(Args)]
pub struct ListArgs {
    #[command(flatten)]
    conn: Conn,
    /// Print JSON.
    #[arg(long)]
    json: bool,
}

#[derive(Args)]
pub struct JobIdArgs {
    /// The submission id.
    id: String,
    #[command(flatten)]
    conn: Conn,
}

#[derive(Args)]
pub struct LogsArgs {
    /// The submission id.
    id: String,
    #[command(flatten)]
    conn: Conn,
    /// Keep printing new output until the job ends.
    #[arg(long, short)]
    follow: bool,
}

/// Runs `reinforge cluster …`.
pub fn run_cluster(c: ClusterCmd) -> Result<ExitCode> {
    match c {
        ClusterCmd::Start(a) => start(a),
        ClusterCmd::Stop(a) => stop(a),
        ClusterCmd::Status(a) => cluster_status(a),
    }
}

/// Runs `reinforge job …`.
pub fn run_job(c: JobCmd) -> Result<ExitCode> {
    match c {
        JobCmd::Submit(a) => submit(a),
        JobCmd::List(a) => list(a),
        JobCmd::Status(a) => job_status(a),
        JobCmd::Logs(a) => logs(a),
        JobCmd::Stop(a) => job_stop(a),
    }
}

fn start(a: StartArgs) -> Result<ExitCode> {
    let install = RayInstall::locate()?;
    let opts = StartOptions {
        head: a.head,
        address: a.address,
        port: a.port,
        dashboard_port: a.dashboard_port,
        agent_port: a.dashboard_agent_listen_port,
        client_server_port: a.ray_client_server_port,
        num_cpus: a.num_cpus,
        num_gpus: a.num_gpus,
        node_ip_address: a.node_ip_address,
        temp_dir: a.temp_dir,
        no_auth: a.no_auth || reinforge_cluster::jobs::no_auth_from_env(),
        block: a.block,
        token: a.token,
        wait: Duration::from_secs(a.wait),
    };
    let progress = Progress::stderr();
    let started = bringup::start(&install, &opts, &|k| std::env::var(k).ok(), &progress)?;
    let blocking = match started {
        Started::Head(h) => {
            let auth = match &h.token {
                Some(t) if h.token_created => {
                    format!("token auth on; new token saved to {}", t.source)
                }
                Some(t) => format!("token auth on; token from {}", t.source),
                None => "token auth OFF (--no-auth)".to_string(),
            };
            println!(
                "Ray head up in {:.1} s at {} ({auth})",
                h.elapsed.as_secs_f64(),
                h.gcs_address
            );
            println!("dashboard: {}", h.dashboard_url);
            println!("join from every other node, in any order:");
            println!("  {}", h.join_command);
            println!("submit a job:");
            println!("  {}", h.submit_example);
            if let Some(env) = &h.ray_cli_env {
                println!("for Ray's own CLI (ray status, ray job submit) on any node:");
                println!("  {env}");
            }
            println!("status: reinforge cluster status --address {}    stop: reinforge cluster stop (on each node)", h.dashboard_url);
            h.blocking
        }
        Started::Worker(w) => {
            println!(
                "node {} joined {} in {:.1} s (node id {}, waited {:.1} s for the head)",
                w.node_ip,
                w.head,
                w.join_time.as_secs_f64(),
                w.node_id.get(..8).unwrap_or(&w.node_id),
                w.waited_for_head.as_secs_f64()
            );
            w.blocking
        }
    };
    let _ = std::io::stdout().flush();
    if let Some(b) = blocking {
        eprintln!("running in the foreground (--block); Ctrl-C stops Ray on this node");
        // Ctrl-C reaches `ray start --block` too (same process group); stay until it has
        // stopped its processes instead of dying first.
        static INTERRUPTED: std::sync::atomic::AtomicBool =
            std::sync::atomic::AtomicBool::new(false);
        let _ = ctrlc::set_handler(|| {
            INTERRUPTED.store(true, std::sync::atomic::Ordering::SeqCst);
            eprintln!("stopping Ray on this node…");
        });
        match b.wait() {
            Ok(()) => {}
            // Ray exits non-zero when interrupted; that is the requested way to stop.
            Err(_) if INTERRUPTED.load(std::sync::atomic::Ordering::SeqCst) => {}
            Err(e) => return Err(e.into()),
        }
        eprintln!("Ray stopped on this node");
    }
    Ok(ExitCode::SUCCESS)
}

fn stop(a: StopArgs) -> Result<ExitCode> {
    let install = RayInstall::locate()?;
    let s = bringup::stop(&install, a.force)?;
    match s.processes {
        Some(0) => println!("no Ray processes were running on this machine"),
        Some(n) => println!("stopped {n} Ray processes on this machine"),
        None => println!("ray stop: {}", s.summary),
    }
    Ok(ExitCode::SUCCESS)
}

/// What each running `reinforge train` job's controller and ranks are doing, from the
/// `ranks.json` its watchdog keeps in the run directory (when that directory is visible here).
fn run_activity(jobs: &[reinforge_cluster::jobs::JobInfo]) -> Vec<status::RunActivity> {
    jobs.iter()
        .filter(|j| j.status == "RUNNING")
        .filter_map(|j| {
            let words = shlex::split(j.entrypoint.as_deref()?)?;
            let (dir, _) = super::train::run_dir_of(&words, std::path::Path::new("/"))?;
            let path = dir.join("ranks.json");
            let age_s = std::fs::metadata(&path).ok()?.modified().ok()?.elapsed().map_or(0.0, |d| d.as_secs_f64());
            let ranks = serde_json::from_slice(&std::fs::read(&path).ok()?).ok()?;
            Some(status::RunActivity { job: j.id().to_string(), run_dir: dir.display().to_string(), age_s, ranks })
        })
        .collect()
}

fn cluster_status(a: StatusArgs) -> Result<ExitCode> {
    // Status only reads; a cluster without auth is shown (its mode is in the output), not refused.
    let d = reinforge_cluster::connect(a.conn.address.as_deref(), a.conn.token.as_deref())?;
    let mut st = status::status(&d)?;
    st.runs = run_activity(&st.jobs);
    if a.json {
        println!("{}", serde_json::to_string_pretty(&st)?);
    } else {
        print!("{}", status::render(&st));
        if st.auth == "disabled" {
            eprintln!("warning: this cluster runs without token auth");
        }
    }
    Ok(ExitCode::SUCCESS)
}

fn final_line(j: &JobInfo) -> String {
    let mut s = format!("job {} {}", j.id(), j.status);
    if let Some(m) = j.message.as_deref().filter(|m| !m.is_empty()) {
        s.push_str(&format!(": {}", m.lines().next().unwrap_or(m)));
    }
    s
}

fn submit(a: SubmitArgs) -> Result<ExitCode> {
    let mut env_vars = BTreeMap::new();
    for e in &a.env {
        let (k, v) = jobs::parse_env_pair(e)?;
        env_vars.insert(k, v);
    }
    let mut entrypoint = jobs::entrypoint_from_args(&a.command);
    if entrypoint.trim().is_empty() {
        bail!("no command to run; write it after `--`, e.g. `reinforge job submit -- reinforge train cfg.toml`");
    }
    if let Some(dir) = &a.chdir {
        let dir = std::path::absolute(dir).with_context(|| format!("--chdir {}", dir.display()))?;
        let quoted = shlex::try_quote(dir.to_str().context("--chdir: the path is not UTF-8")?).context("--chdir: the path cannot be quoted for a shell")?;
        entrypoint = format!("cd {quoted} && {entrypoint}");
    }
    let base = match (&a.working_dir, &a.chdir) {
        (Some(d), _) | (None, Some(d)) => d.clone(),
        (None, None) => std::env::current_dir().context("reading the current directory")?,
    };
    if let Some(held) = super::train::held_run_dir(&a.command, &base) {
        bail!("not submitted: {held}");
    }
    let d = a.conn.open()?;
    let spec = JobSpec {
        entrypoint,
        submission_id: a.submission_id,
        env_vars,
        working_dir: a.working_dir,
    };
    let id = d
        .submit_job(&spec)
        .with_context(|| format!("submitting to {}", d.url()))?;
    if a.no_wait {
        println!("{id}");
        eprintln!(
            "submitted job {id}; follow it with `reinforge job logs {id} --follow --address {}`",
            d.url()
        );
        return Ok(ExitCode::SUCCESS);
    }
    eprintln!(
        "submitted job {id} to {}; following its logs (Ctrl-C stops following, not the job)",
        d.url()
    );
    follow(&d, &id)
}

fn follow(d: &Dashboard, id: &str) -> Result<ExitCode> {
    let hint = format!(
        "stopped following job {id}; it keeps running: `reinforge job stop {id} --address {}`",
        d.url()
    );
    // One handler per process; if another command already set one, the default Ctrl-C is fine.
    let _ = ctrlc::set_handler(move || {
        eprintln!("\n{hint}");
        std::process::exit(130);
    });
    let mut out = std::io::stdout();
    let info = d.follow_logs(
        id,
        &mut out,
        Duration::from_secs(1),
        &mut |j| tracing::debug!(job = %j.id(), status = %j.status, "job status"),
    )?;
    let _ = out.flush();
    eprintln!("{}", final_line(&info));
    Ok(if info.status == "SUCCEEDED" {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    })
}

fn list(a: ListArgs) -> Result<ExitCode> {
    let d = a.conn.open()?;
    let mut jobs = d.list_jobs()?;
    jobs.sort_by_key(|j| j.start_time.unwrap_or(0));
    if a.json {
        println!("{}", serde_json::to_string_pretty(&jobs)?);
        return Ok(ExitCode::SUCCESS);
    }
    if jobs.is_empty() {
        println!("no jobs on {}", d.url());
        return Ok(ExitCode::SUCCESS);
    }
    let mut rows = vec![[
        "ID".to_string(),
        "STATUS".into(),
        "STARTED".into(),
        "ENTRYPOINT".into(),
    ]];
    for j in &jobs {
        rows.push([
            j.id().to_string(),
            j.status.clone(),
            j.start_time.map(ago).unwrap_or_default(),
            status::truncate(j.entrypoint.as_deref().unwrap_or(""), 70),
        ]);
    }
    print!("{}", status::table(&rows));
    Ok(ExitCode::SUCCESS)
}

/// "12 s ago" / "5 min ago" / "3 h ago" from a start time in ms since the epoch.
fn ago(ms: u64) -> String {
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_millis() as u64)
        .unwrap_or(ms);
    let s = now.saturating_sub(ms) / 1000;
    match s {
        0..=119 => format!("{s} s ago"),
        120..=7199 => format!("{} min ago", s / 60),
        _ => format!("{} h ago", s / 3600),
    }
}

fn job_status(a: JobIdArgs) -> Result<ExitCode> {
    let d = a.conn.open()?;
    let j = d.job(&a.id)?;
    println!("{}", final_line(&j));
    Ok(ExitCode::SUCCESS)
}

fn logs(a: LogsArgs) -> Result<ExitCode> {
    let d = a.conn.open()?;
    if a.follow {
        let mut out = std::io::stdout();
        let info = d.follow_logs(&a.id, &mut out, Duration::from_secs(1), &mut |_| {})?;
        let _ = out.flush();
        eprintln!("{}", final_line(&info));
    } else {
        print!("{}", d.job_logs(&a.id)?);
    }
    Ok(ExitCode::SUCCESS)
}

fn job_stop(a: JobIdArgs) -> Result<ExitCode> {
    let d = a.conn.open()?;
    let was_running = d.stop_job(&a.id)?;
    let j = d.wait_terminal(&a.id, Duration::from_secs(60))?;
    if !was_running {
        eprintln!("job {} had already ended", a.id);
    }
    println!("{}", final_line(&j));
    Ok(ExitCode::SUCCESS)
}
