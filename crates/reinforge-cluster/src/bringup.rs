//! `reinforge cluster start|stop`: brings a Ray node up as head or worker with token auth,
//! in any order (a worker waits for its head), and checks what it can before Ray does: free
//! ports, that the address is a Ray head, that auth modes and tokens match. Long waits print
//! what they wait for and give up with a message.

use crate::conventions::{self, Convention, Role, RoleFlags};
use crate::error::{ClusterError, Result};
use crate::jobs::{AuthMode, Dashboard, DEFAULT_DASHBOARD_PORT};
use crate::ray::{last_line, RayInstall};
use crate::token::{self, Token};
use std::collections::BTreeSet;
use std::io::{BufRead, BufReader, IsTerminal, Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream, ToSocketAddrs};
use std::path::PathBuf;
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// Ray's default port for the dashboard agent's HTTP server, one per node.
pub const DEFAULT_AGENT_PORT: u16 = 52365;
/// Ray's default port for the Ray Client server on the head.
pub const DEFAULT_CLIENT_SERVER_PORT: u16 = 10001;
/// How long `ray start` may take before we give up (it takes 5–20 s).
const RAY_START_TIMEOUT: Duration = Duration::from_secs(180);
/// How long the head's dashboard may take to answer after `ray start` returned.
const DASHBOARD_READY_TIMEOUT: Duration = Duration::from_secs(120);
/// How long a worker waits for the head's dashboard once the head's Ray port answers.
const HEAD_DASHBOARD_TIMEOUT: Duration = Duration::from_secs(60);
/// How long a new node may take to show up in the head's node table.
const REGISTER_TIMEOUT: Duration = Duration::from_secs(60);

/// Options of `reinforge cluster start`.
#[derive(Debug, Clone)]
pub struct StartOptions {
    /// `--head`.
    pub head: bool,
    /// `--address HOST:PORT` of the head.
    pub address: Option<String>,
    /// `--port`: the head's Ray (GCS) port.
    pub port: Option<u16>,
    /// `--dashboard-port` (the head's; a worker uses it to check auth and registration).
    pub dashboard_port: u16,
    /// `--dashboard-agent-listen-port`: this node's dashboard agent.
    pub agent_port: u16,
    /// `--ray-client-server-port` (head only).
    pub client_server_port: u16,
    /// `--num-cpus`.
    pub num_cpus: Option<u32>,
    /// `--num-gpus`.
    pub num_gpus: Option<u32>,
    /// `--node-ip-address`.
    pub node_ip_address: Option<String>,
    /// `--temp-dir`.
    pub temp_dir: Option<PathBuf>,
    /// `--no-auth`: run (or join) without token auth, explicitly.
    pub no_auth: bool,
    /// `--block`: stay in the foreground.
    pub block: bool,
    /// `--token`.
    pub token: Option<String>,
    /// `--wait`: how long a worker waits for its head.
    pub wait: Duration,
}

impl Default for StartOptions {
    fn default() -> Self {
        StartOptions {
            head: false,
            address: None,
            port: None,
            dashboard_port: DEFAULT_DASHBOARD_PORT,
            agent_port: DEFAULT_AGENT_PORT,
            client_server_port: DEFAULT_CLIENT_SERVER_PORT,
            num_cpus: None,
            num_gpus: None,
            node_ip_address: None,
            temp_dir: None,
            no_auth: false,
            block: false,
            token: None,
            wait: Duration::from_secs(300),
        }
    }
}

/// Status lines for long waits: on a terminal one line updated in place, otherwise a line about
/// every 10 s (so logs of batch jobs stay short).
pub struct Progress {
    tty: bool,
    state: Mutex<(Option<Instant>, bool)>,
}

impl Progress {
    /// Progress on stderr.
    pub fn stderr() -> Progress {
        Progress {
            tty: std::io::stderr().is_terminal(),
            state: Mutex::new((None, false)),
        }
    }

    /// A permanent line.
    pub fn line(&self, msg: &str) {
        self.finish();
        eprintln!("{msg}");
    }

    /// A transient status (overwritten on a TTY, throttled otherwise).
    pub fn tick(&self, msg: &str) {
        let Ok(mut st) = self.state.lock() else {
            return;
        };
        if self.tty {
            eprint!("\r\x1b[K{msg}");
            let _ = std::io::stderr().flush();
            st.1 = true;
        } else if st.0.is_none_or(|t| t.elapsed() >= Duration::from_secs(10)) {
            eprintln!("{msg}");
            st.0 = Some(Instant::now());
        }
    }

    /// Ends a run of ticks (a newline on a TTY).
    pub fn finish(&self) {
        let Ok(mut st) = self.state.lock() else {
            return;
        };
        if st.1 {
            eprintln!();
            st.1 = false;
        }
        st.0 = None;
    }
}

/// A `ray start --block` left running in the foreground.
pub struct BlockingRay {
    child: RayChild,
}

impl BlockingRay {
    /// Waits until Ray exits (Ctrl-C stops it and its processes); an error unless it exited cleanly.
    pub fn wait(mut self) -> Result<()> {
        self.child.forward.store(true, Ordering::SeqCst);
        let status = self
            .child
            .child
            .wait()
            .map_err(|e| ClusterError::RayCommand {
                command: self.child.command.clone(),
                detail: e.to_string(),
            })?;
        if status.success() {
            Ok(())
        } else {
            Err(self.child.failure(status))
        }
    }
}

/// What `cluster start` did on a head.
pub struct HeadStarted {
    /// How the role was decided.
    pub convention: Convention,
    /// The head's node IP as Ray registered it.
    pub node_ip: String,
    /// `IP:PORT` workers join.
    pub gcs_address: String,
    /// `http://IP:DASHBOARD_PORT`.
    pub dashboard_url: String,
    /// The cluster token (`None` with `--no-auth`).
    pub token: Option<Token>,
    /// Whether the token was generated now (and saved to `~/.ray/auth_token`).
    pub token_created: bool,
    /// From `ray start` to a dashboard that answers.
    pub elapsed: Duration,
    /// The command to run on every other node.
    pub join_command: String,
    /// An example job submission.
    pub submit_example: String,
    /// The environment Ray's own CLI (`ray status`, `ray job submit`) needs for this head, as
    /// an `export` line (with token auth only: without it Ray's CLI needs nothing).
    pub ray_cli_env: Option<String>,
    /// `ray start --block` still running, if `--block`.
    pub blocking: Option<BlockingRay>,
}

/// What `cluster start` did on a worker.
pub struct WorkerJoined {
    /// How the role was decided.
    pub convention: Convention,
    /// This node's IP as the head sees it.
    pub node_ip: String,
    /// This node's Ray id.
    pub node_id: String,
    /// The head's `HOST:PORT`.
    pub head: String,
    /// The head's dashboard URL.
    pub dashboard_url: String,
    /// How long we waited for the head to answer.
    pub waited_for_head: Duration,
    /// From `ray start` to the node registered on the head.
    pub join_time: Duration,
    /// `ray start --block` still running, if `--block`.
    pub blocking: Option<BlockingRay>,
}

/// The outcome of `cluster start`.
pub enum Started {
    /// This node is the head.
    Head(HeadStarted),
    /// This node joined a head.
    Worker(WorkerJoined),
}

/// Starts this node as head or worker (from flags, else the environment conventions).
pub fn start(
    install: &RayInstall,
    opts: &StartOptions,
    env: &dyn Fn(&str) -> Option<String>,
    progress: &Progress,
) -> Result<Started> {
    // A Ray older than token auth would silently start a cluster anyone can use.
    if !install.has_token_auth() && !opts.no_auth {
        return Err(ClusterError::NoTokenAuth { version: install.version.clone(), pinned: crate::ray::pinned_version().to_string() });
    }
    let resolved = conventions::resolve(
        &RoleFlags {
            head: opts.head,
            address: opts.address.clone(),
            port: opts.port,
        },
        env,
    )?;
    if resolved.convention != Convention::Flags {
        let rank = resolved
            .node_rank
            .map(|r| format!(", node rank {r}"))
            .unwrap_or_default();
        let n = resolved
            .nnodes
            .map(|n| format!(" of {n}"))
            .unwrap_or_default();
        progress.line(&format!("role from {}{rank}{n}", resolved.convention));
    }
    let mut opts = opts.clone();
    if opts.node_ip_address.is_none() {
        if let Some(hint) = &resolved.node_ip_hint {
            match resolve_ip(hint) {
                Some(ip) => opts.node_ip_address = Some(ip),
                None => {
                    tracing::warn!(%hint, "cannot resolve this node's address from the launcher; letting Ray pick the node IP")
                }
            }
        }
    }
    match resolved.role {
        Role::Head { port } => {
            start_head(install, &opts, port, resolved.convention, progress).map(Started::Head)
        }
        Role::Worker { host, port } => {
            start_worker(install, &opts, &host, port, resolved.convention, progress)
                .map(Started::Worker)
        }
    }
}

fn resolve_ip(host: &str) -> Option<String> {
    if host.parse::<std::net::IpAddr>().is_ok() {
        return Some(host.to_string());
    }
    (host, 0)
        .to_socket_addrs()
        .ok()?
        .find(|a| a.is_ipv4())
        .map(|a| a.ip().to_string())
}

/// Whether nothing listens on `port` (a bind test on all interfaces).
pub fn port_is_free(port: u16) -> bool {
    TcpListener::bind(("0.0.0.0", port)).is_ok()
}

/// Ray's default range for worker processes' ports (`--min-worker-port`/`--max-worker-port`).
const WORKER_PORTS: std::ops::RangeInclusive<u16> = 10002..=19999;

/// Fails on the first taken port, naming it, its purpose and the flag that moves it; also on a
/// port inside Ray's worker port range, which `ray start` would refuse after a slow start.
fn check_ports(ports: &[(u16, &str, &str)]) -> Result<()> {
    for (port, what, flag) in ports {
        if WORKER_PORTS.contains(port) {
            return Err(ClusterError::usage(format!(
                "{flag} {port} ({what}) is inside Ray's worker port range {}-{}; pick a port outside it",
                WORKER_PORTS.start(),
                WORKER_PORTS.end()
            )));
        }
        if !port_is_free(*port) {
            return Err(ClusterError::PortInUse {
                port: *port,
                what: what.to_string(),
                flag: flag.to_string(),
            });
        }
    }
    Ok(())
}

fn common_args(opts: &StartOptions, args: &mut Vec<String>) {
    if let Some(n) = opts.num_cpus {
        args.extend(["--num-cpus".into(), n.to_string()]);
    }
    if let Some(n) = opts.num_gpus {
        args.extend(["--num-gpus".into(), n.to_string()]);
    }
    if let Some(ip) = &opts.node_ip_address {
        args.extend(["--node-ip-address".into(), ip.clone()]);
    }
    if let Some(d) = &opts.temp_dir {
        args.extend(["--temp-dir".into(), d.display().to_string()]);
    }
    args.extend([
        "--dashboard-agent-listen-port".into(),
        opts.agent_port.to_string(),
    ]);
    // No usage reporting from clusters Reinforge starts.
    args.push("--disable-usage-stats".into());
    if opts.block {
        args.push("--block".into());
    }
}

/// The environment a Ray process needs to join or talk to a cluster with this token (`None`:
/// auth explicitly off): `RAY_AUTH_MODE` and `RAY_AUTH_TOKEN`, where `None` means "unset it".
pub fn ray_auth_env(token: Option<&Token>) -> Vec<(String, Option<String>)> {
    match token {
        Some(t) => vec![
            ("RAY_AUTH_MODE".into(), Some("token".into())),
            ("RAY_AUTH_TOKEN".into(), Some(t.value.clone())),
        ],
        // Explicitly off: Ray 2.60 turns auth on by itself when it finds a token.
        None => vec![
            ("RAY_AUTH_MODE".into(), Some("disabled".into())),
            ("RAY_AUTH_TOKEN".into(), None),
        ],
    }
}

fn start_head(
    install: &RayInstall,
    opts: &StartOptions,
    port: u16,
    convention: Convention,
    progress: &Progress,
) -> Result<HeadStarted> {
    check_ports(&[
        (port, "Ray head (GCS)", "--port"),
        (opts.dashboard_port, "Ray dashboard", "--dashboard-port"),
        (
            opts.agent_port,
            "Ray dashboard agent",
            "--dashboard-agent-listen-port",
        ),
        (
            opts.client_server_port,
            "Ray Client server",
            "--ray-client-server-port",
        ),
    ])?;
    let (token, token_created) = if opts.no_auth {
        let why = if install.has_token_auth() { "--no-auth".to_string() } else { format!("Ray {} has none", install.version) };
        progress.line(&format!("warning: token auth is OFF ({why}): anyone who can reach this head's ports can run code on every node"));
        (None, false)
    } else {
        let (t, created) = token::load_or_create(opts.token.as_deref())?;
        if created {
            progress.line(&format!(
                "generated a new cluster token, saved to {}",
                t.source
            ));
        } else {
            tracing::debug!(source = %t.source, "using the existing cluster token");
        }
        (Some(t), created)
    };

    let mut args: Vec<String> = vec![
        "start".into(),
        "--head".into(),
        "--port".into(),
        port.to_string(),
        "--dashboard-host".into(),
        "0.0.0.0".into(),
        "--dashboard-port".into(),
        opts.dashboard_port.to_string(),
        "--ray-client-server-port".into(),
        opts.client_server_port.to_string(),
    ];
    common_args(opts, &mut args);
    let t0 = Instant::now();
    progress.line(&format!(
        "starting the Ray head on port {port} (Ray {})…",
        install.version
    ));
    let mut child = RayChild::spawn(install, &args, &ray_auth_env(token.as_ref()))?;

    // Readiness: the dashboard answers /api/version with our token.
    let local = Dashboard::new(
        &format!("http://127.0.0.1:{}", opts.dashboard_port),
        token.clone(),
    );
    let deadline = t0 + RAY_START_TIMEOUT + DASHBOARD_READY_TIMEOUT;
    let mut ray_start_done = false;
    let mut last_err = String::from("not started yet");
    loop {
        if !ray_start_done {
            ray_start_done = child.exited_ok(opts.block, progress)?;
        }
        if ray_start_done || opts.block {
            // Ready = the dashboard answers with our token and lists the head node as ALIVE
            // (with --block the dashboard can answer before the head's raylet registered).
            match local.version().and_then(|_| alive_nodes(&local)) {
                Ok(nodes) if nodes.iter().any(|n| n.is_head) => break,
                Ok(_) => last_err = "the head node has not registered yet".into(),
                Err(
                    e @ (ClusterError::Unauthorized { .. } | ClusterError::TokenRejected { .. }),
                ) => {
                    progress.finish();
                    return Err(ClusterError::RayCommand {
                        command: child.command.clone(),
                        detail: format!("the dashboard on port {} does not accept our token ({e}); another Ray may own that port: `reinforge cluster stop`", opts.dashboard_port),
                    });
                }
                Err(e) => last_err = e.to_string(),
            }
        }
        let waited = t0.elapsed();
        if Instant::now() >= deadline {
            progress.finish();
            let _ = child.kill();
            return Err(ClusterError::Timeout(format!(
                "the Ray head did not come up within {} s ({last_err}); see the logs under {}/session_latest/logs, then `reinforge cluster stop` and retry",
                waited.as_secs(),
                opts.temp_dir.as_ref().map(|d| d.display().to_string()).unwrap_or_else(|| "/tmp/ray".into())
            )));
        }
        let what = if ray_start_done || opts.block {
            "waiting for the dashboard"
        } else {
            "ray start"
        };
        progress.tick(&format!("{what}… {:.0} s", waited.as_secs_f64()));
        std::thread::sleep(Duration::from_millis(250));
    }
    let elapsed = t0.elapsed();
    progress.finish();

    let node_ip = match &opts.node_ip_address {
        Some(ip) => ip.clone(),
        None => alive_nodes(&local)?
            .into_iter()
            .find(|n| n.is_head)
            .map(|n| n.ip)
            .unwrap_or_else(|| "127.0.0.1".into()),
    };
    let host = if node_ip.contains(':') {
        format!("[{node_ip}]")
    } else {
        node_ip.clone()
    };
    let gcs_address = format!("{host}:{port}");
    let dashboard_url = format!("http://{host}:{}", opts.dashboard_port);
    let dash_flag = if opts.dashboard_port != DEFAULT_DASHBOARD_PORT {
        format!(" --dashboard-port {}", opts.dashboard_port)
    } else {
        String::new()
    };
    let (join_command, submit_example) = match &token {
        Some(t) => (
            format!("RAY_AUTH_TOKEN={} reinforge cluster start --address {gcs_address}{dash_flag}", t.value),
            format!("RAY_AUTH_TOKEN={} reinforge job submit --address {dashboard_url} -- echo hello from Ray", t.value),
        ),
        None => (
            format!("reinforge cluster start --address {gcs_address}{dash_flag} --no-auth"),
            format!("reinforge job submit --address {dashboard_url} --allow-no-auth -- echo hello from Ray"),
        ),
    };
    // Ray's CLI sends the token only when told the auth mode; RAY_ADDRESS serves `ray status`,
    // RAY_API_SERVER_ADDRESS `ray job submit`.
    let ray_cli_env = token.as_ref().map(|t| {
        format!("export RAY_AUTH_MODE=token RAY_AUTH_TOKEN={} RAY_ADDRESS={gcs_address} RAY_API_SERVER_ADDRESS={dashboard_url}", t.value)
    });
    let blocking = if opts.block {
        Some(BlockingRay { child })
    } else {
        None
    };
    Ok(HeadStarted {
        convention,
        node_ip,
        gcs_address,
        dashboard_url,
        token,
        token_created,
        elapsed,
        join_command,
        submit_example,
        ray_cli_env,
        blocking,
    })
}

/// Waits until `host:port` accepts TCP connections, showing a countdown; DNS failures are
/// retried too (cloud DNS names appear when the head's pod starts).
fn wait_for_tcp(
    host: &str,
    port: u16,
    wait: Duration,
    progress: &Progress,
) -> Result<(TcpStream, Duration)> {
    let t0 = Instant::now();
    let address = format!("{host}:{port}");
    let mut last_err = String::from("not tried");
    loop {
        let addrs: Vec<SocketAddr> = match (host, port).to_socket_addrs() {
            Ok(a) => a.collect(),
            Err(e) => {
                last_err = format!("cannot resolve {host}: {e}");
                Vec::new()
            }
        };
        for a in &addrs {
            match TcpStream::connect_timeout(a, Duration::from_secs(2)) {
                Ok(s) => {
                    progress.finish();
                    return Ok((s, t0.elapsed()));
                }
                Err(e) => last_err = e.to_string(),
            }
        }
        let waited = t0.elapsed();
        if waited >= wait {
            progress.finish();
            return Err(ClusterError::HeadUnreachable {
                address,
                waited_s: wait.as_secs(),
                last_error: last_err,
            });
        }
        let left = wait.saturating_sub(waited);
        progress.tick(&format!(
            "waiting for the Ray head at {address}: {} s left ({last_err})",
            left.as_secs()
        ));
        std::thread::sleep(Duration::from_millis(1000).min(left));
    }
}

/// The outcome of probing a port for Ray's GCS (a gRPC server, so HTTP/2).
#[derive(Debug, PartialEq, Eq)]
enum Probe {
    /// It answered an HTTP/2 preface with SETTINGS: gRPC.
    Grpc,
    /// Clearly something else (the detail says what it looked like).
    NotGrpc(String),
    /// Cannot tell (TLS, silence): let `ray start` decide.
    Unknown,
}

/// Sends the HTTP/2 client preface and an empty SETTINGS frame; a gRPC server answers with a
/// SETTINGS frame (type 4). Catches "that is the dashboard port" in milliseconds instead of a
/// `ray start` that hangs and times out.
fn probe_grpc(mut s: TcpStream) -> Probe {
    let _ = s.set_read_timeout(Some(Duration::from_secs(3)));
    let _ = s.set_write_timeout(Some(Duration::from_secs(3)));
    let mut hello = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n".to_vec();
    hello.extend_from_slice(&[0, 0, 0, 4, 0, 0, 0, 0, 0]);
    if s.write_all(&hello).is_err() {
        return Probe::Unknown;
    }
    let mut buf = [0u8; 64];
    let mut n = 0;
    while n < 9 {
        match s.read(&mut buf[n..]) {
            Ok(0) => break,
            Ok(k) => n += k,
            Err(_) => break,
        }
    }
    classify_probe(&buf[..n])
}

fn classify_probe(b: &[u8]) -> Probe {
    if b.len() >= 9 && b[3] == 4 {
        return Probe::Grpc;
    }
    if b.starts_with(b"HTTP/") {
        return Probe::NotGrpc("it speaks HTTP/1, like a web server or Ray's dashboard".into());
    }
    if b.first().is_some_and(|c| *c == 0x15 || *c == 0x16) {
        return Probe::Unknown; // TLS: a head with RAY_USE_TLS; `ray start` will tell
    }
    if b.is_empty() {
        return Probe::NotGrpc(
            "it closed the connection or stayed silent instead of answering gRPC".into(),
        );
    }
    let text: String = String::from_utf8_lossy(&b[..b.len().min(40)])
        .chars()
        .filter(|c| !c.is_control())
        .collect();
    Probe::NotGrpc(format!("it answered {text:?} instead of gRPC"))
}

fn start_worker(
    install: &RayInstall,
    opts: &StartOptions,
    host: &str,
    port: u16,
    convention: Convention,
    progress: &Progress,
) -> Result<WorkerJoined> {
    // Ray's gRPC resolves names on its own (c-ares, DNS), not through this system's resolver:
    // a head named by a host only /etc/hosts or NSS knows (a Slurm node list) hangs `ray
    // start`. Ray gets the address this system resolves.
    let ip = resolve_ip(host);
    let host = ip.as_deref().unwrap_or(host);
    let head = if host.contains(':') {
        format!("[{host}]:{port}")
    } else {
        format!("{host}:{port}")
    };
    check_ports(&[(
        opts.agent_port,
        "Ray dashboard agent",
        "--dashboard-agent-listen-port",
    )])?;
    let t_start = Instant::now();
    progress.line(&format!(
        "joining the Ray head at {head} (waiting up to {} s for it)…",
        opts.wait.as_secs()
    ));
    let (stream, _) = wait_for_tcp(host, port, opts.wait, progress)?;
    match probe_grpc(stream) {
        Probe::Grpc => {}
        Probe::NotGrpc(detail) => {
            return Err(ClusterError::NotRayHead {
                address: head,
                detail,
            })
        }
        Probe::Unknown => {
            tracing::warn!(%head, "cannot tell whether {head} is a Ray head; trying anyway")
        }
    }

    // The head's Ray port can answer a few seconds before its dashboard.
    let url_host = if host.contains(':') {
        format!("[{host}]")
    } else {
        host.to_string()
    };
    let dashboard_url = format!("http://{url_host}:{}", opts.dashboard_port);
    let anon = Dashboard::new(&dashboard_url, None);
    let t_dash = Instant::now();
    let dash_limit = HEAD_DASHBOARD_TIMEOUT.max(opts.wait.saturating_sub(t_start.elapsed()));
    let mode = loop {
        match anon.auth_mode() {
            Ok(m) => break m,
            Err(e @ ClusterError::NoDashboard { .. }) => {
                if t_dash.elapsed() >= dash_limit {
                    progress.finish();
                    let detail = match e {
                        ClusterError::NoDashboard { detail, .. } => detail,
                        other => other.to_string(),
                    };
                    return Err(ClusterError::DashboardMissing {
                        address: head,
                        url: dashboard_url,
                        detail,
                    });
                }
                progress.tick(&format!(
                    "the head answers; waiting for its dashboard at {dashboard_url}: {} s left",
                    dash_limit.saturating_sub(t_dash.elapsed()).as_secs()
                ));
                std::thread::sleep(Duration::from_millis(500));
            }
            Err(e) => return Err(e),
        }
    };
    progress.finish();
    let waited_for_head = t_start.elapsed();

    let token = match (&mode, opts.no_auth) {
        (AuthMode::Disabled, false) => {
            return Err(ClusterError::AuthDisabled {
                what: format!("the Ray head {head}"),
                url: dashboard_url,
                flag: "--no-auth on this node".into(),
            })
        }
        (AuthMode::Unavailable, false) => {
            return Err(ClusterError::AuthDisabled {
                what: format!("the Ray head {head} (a Ray older than 2.52, which has no token auth)"),
                url: dashboard_url,
                flag: "--no-auth on this node (or REINFORGE_NO_AUTH=1)".into(),
            })
        }
        (AuthMode::Disabled, true) | (AuthMode::Unavailable, true) => None,
        (AuthMode::Token, true) => return Err(ClusterError::AuthRequired { url: dashboard_url }),
        (AuthMode::Token, false) | (AuthMode::Unknown(_), false) => {
            match token::load(opts.token.as_deref())? {
                Some(t) => Some(t),
                None => return Err(ClusterError::NoToken { url: dashboard_url }),
            }
        }
        (AuthMode::Unknown(_), true) => None,
    };
    let dash = Dashboard::new(&dashboard_url, token.clone());
    // Check the token now: a wrong one would otherwise fail deep inside `ray start`.
    dash.version()?;
    // A head whose own node is not registered yet is still starting: wait for it, or the head
    // itself would look like the node this command added.
    let t_reg = Instant::now();
    let before: BTreeSet<String> = loop {
        let nodes = alive_nodes(&dash)?;
        if nodes.iter().any(|n| n.is_head) {
            break nodes.into_iter().map(|n| n.id).collect();
        }
        if t_reg.elapsed() >= REGISTER_TIMEOUT {
            return Err(ClusterError::Timeout(format!(
                "the head at {head} answers but has no live head node after {} s; check it with `reinforge cluster status --address {dashboard_url}`",
                REGISTER_TIMEOUT.as_secs()
            )));
        }
        progress.tick(&format!(
            "waiting for the head node to register at {dashboard_url}…"
        ));
        std::thread::sleep(Duration::from_millis(500));
    };
    progress.finish();

    let mut args: Vec<String> = vec!["start".into(), "--address".into(), head.clone()];
    common_args(opts, &mut args);
    let t0 = Instant::now();
    let mut child = RayChild::spawn(install, &args, &ray_auth_env(token.as_ref()))?;
    let mut ray_start_done = false;
    let (node_id, node_ip) = loop {
        if !ray_start_done {
            ray_start_done = child.exited_ok(opts.block, progress)?;
        }
        // A dashboard hiccup while the node starts is not fatal: keep polling until the limit.
        match alive_nodes(&dash) {
            Ok(nodes) => {
                let mut new = nodes.into_iter().filter(|n| {
                    !n.is_head
                        && !before.contains(&n.id)
                        && opts
                            .node_ip_address
                            .as_ref()
                            .is_none_or(|want| *want == n.ip)
                });
                if let Some(n) = new.next() {
                    break (n.id, n.ip);
                }
            }
            Err(e) => tracing::debug!(error = %e, "polling the head's node table"),
        }
        if t0.elapsed() >= RAY_START_TIMEOUT + REGISTER_TIMEOUT
            || (ray_start_done
                && child
                    .done_at
                    .is_some_and(|d| d.elapsed() >= REGISTER_TIMEOUT))
        {
            progress.finish();
            let _ = child.kill();
            return Err(ClusterError::Timeout(format!(
                "this node did not appear on the head {head} within {} s after `ray start`; check that the head can reach this node (all ports, not just {port}), then `reinforge cluster stop` and retry",
                t0.elapsed().as_secs()
            )));
        }
        progress.tick(&format!(
            "ray start --address {head}… {:.0} s",
            t0.elapsed().as_secs_f64()
        ));
        std::thread::sleep(Duration::from_millis(250));
    };
    let join_time = t0.elapsed();
    progress.finish();
    let blocking = if opts.block {
        Some(BlockingRay { child })
    } else {
        None
    };
    Ok(WorkerJoined {
        convention,
        node_ip,
        node_id,
        head,
        dashboard_url,
        waited_for_head,
        join_time,
        blocking,
    })
}

/// A live node of the head's node table.
struct LiveNode {
    id: String,
    ip: String,
    is_head: bool,
}

/// The ALIVE nodes.
fn alive_nodes(d: &Dashboard) -> Result<Vec<LiveNode>> {
    Ok(d.state_list("/api/v0/nodes?limit=10000")?
        .iter()
        .filter(|n| n.get("state").and_then(|v| v.as_str()) == Some("ALIVE"))
        .map(|n| {
            let s = |k: &str| n.get(k).and_then(|v| v.as_str()).unwrap_or("").to_string();
            LiveNode {
                id: s("node_id"),
                ip: s("node_ip"),
                is_head: n
                    .get("is_head_node")
                    .and_then(|v| v.as_bool())
                    .unwrap_or(false),
            }
        })
        .collect())
}

/// What `cluster stop` did.
#[derive(Debug, Clone)]
pub struct Stopped {
    /// Number of Ray processes stopped (None if Ray did not say).
    pub processes: Option<u32>,
    /// Ray's own summary line.
    pub summary: String,
}

/// `ray stop [--force]`: stops every Ray process of this machine.
pub fn stop(install: &RayInstall, force: bool) -> Result<Stopped> {
    let mut args = vec!["stop".to_string()];
    if force {
        args.push("--force".into());
    }
    let mut child = RayChild::spawn(install, &args, &[])?;
    let st = child.wait_bounded(Duration::from_secs(120))?;
    if !st.success() {
        return Err(child.failure(st));
    }
    let summary = telling_line(
        &child.lines(),
        &["Stopped all", "Did not find any active Ray processes", "Stopped only"],
    )
    .unwrap_or_default();
    let processes = if summary.contains("Did not find any") {
        Some(0)
    } else {
        summary
            .split_whitespace()
            .find_map(|w| w.parse::<u32>().ok())
    };
    Ok(Stopped { processes, summary })
}

/// The last line of `ray`'s output containing one of `markers`, else its last non-empty line,
/// without Ray's `<time> <LEVEL> <file> -- ` log prefix.
fn telling_line(lines: &[String], markers: &[&str]) -> Option<String> {
    lines
        .iter()
        .rev()
        .find(|l| markers.iter().any(|m| l.contains(m)))
        .or_else(|| lines.iter().rev().find(|l| !l.trim().is_empty()))
        .map(|l| l.split(" -- ").last().unwrap_or(l).trim().to_string())
}

/// A running `ray` subcommand whose output is collected (and forwarded once `forward` is set).
struct RayChild {
    child: Child,
    command: String,
    lines: Arc<Mutex<Vec<String>>>,
    forward: Arc<AtomicBool>,
    done_at: Option<Instant>,
}

/// Removes ANSI color codes (Ray's CLI colors its output even into pipes).
fn strip_ansi(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    let mut it = s.chars().peekable();
    while let Some(c) = it.next() {
        if c == '\x1b' {
            if it.peek() == Some(&'[') {
                it.next();
                for d in it.by_ref() {
                    if d.is_ascii_alphabetic() {
                        break;
                    }
                }
            }
            continue;
        }
        out.push(c);
    }
    out
}

impl RayChild {
    fn spawn(
        install: &RayInstall,
        args: &[String],
        env: &[(String, Option<String>)],
    ) -> Result<RayChild> {
        let command = format!("ray {}", args.join(" "));
        let mut cmd: Command = install.command(args);
        cmd.stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        for (k, v) in env {
            match v {
                Some(v) => cmd.env(k, v),
                None => cmd.env_remove(k),
            };
        }
        tracing::debug!(%command, "spawning");
        let mut child = cmd.spawn().map_err(|e| ClusterError::RayCommand {
            command: command.clone(),
            detail: format!("cannot run {}: {e}", install.ray.display()),
        })?;
        let lines = Arc::new(Mutex::new(Vec::new()));
        let forward = Arc::new(AtomicBool::new(false));
        // `ray start --block` prints its "next steps" banner (with Ray's own join command) after
        // we are ready; only what comes after the banner (process deaths) is worth forwarding.
        let banner_over = Arc::new(AtomicBool::new(false));
        let pipes: Vec<Box<dyn Read + Send>> = [
            child
                .stdout
                .take()
                .map(|s| Box::new(s) as Box<dyn Read + Send>),
            child
                .stderr
                .take()
                .map(|s| Box::new(s) as Box<dyn Read + Send>),
        ]
        .into_iter()
        .flatten()
        .collect();
        for pipe in pipes {
            let lines = Arc::clone(&lines);
            let forward = Arc::clone(&forward);
            let banner_over = Arc::clone(&banner_over);
            std::thread::spawn(move || {
                for line in BufReader::new(pipe).lines() {
                    let Ok(line) = line else { break };
                    let line = strip_ansi(&line);
                    tracing::debug!(target: "reinforge::ray", "{line}");
                    if forward.load(Ordering::SeqCst) && banner_over.load(Ordering::SeqCst) {
                        eprintln!("{line}");
                    }
                    if line.contains("Process exit logs will be saved to") {
                        banner_over.store(true, Ordering::SeqCst);
                    }
                    if let Ok(mut l) = lines.lock() {
                        l.push(line);
                    }
                }
            });
        }
        Ok(RayChild {
            child,
            command,
            lines,
            forward,
            done_at: None,
        })
    }

    fn try_wait(&mut self) -> Result<Option<ExitStatus>> {
        let st = self
            .child
            .try_wait()
            .map_err(|e| ClusterError::RayCommand {
                command: self.command.clone(),
                detail: e.to_string(),
            })?;
        if st.is_some() && self.done_at.is_none() {
            self.done_at = Some(Instant::now());
        }
        Ok(st)
    }

    /// Polls `ray start`: `true` once it has exited successfully. A failed exit, or any exit
    /// under `--block` (where it should run until stopped), ends the bring-up with its error.
    fn exited_ok(&mut self, block: bool, progress: &Progress) -> Result<bool> {
        match self.try_wait()? {
            Some(st) if !st.success() || block => {
                progress.finish();
                Err(self.failure(st))
            }
            Some(_) => Ok(true),
            None => Ok(false),
        }
    }

    fn wait_bounded(&mut self, limit: Duration) -> Result<ExitStatus> {
        let st = crate::ray::wait_bounded(&mut self.child, limit).map_err(|e| {
            ClusterError::RayCommand {
                command: self.command.clone(),
                detail: e.to_string(),
            }
        })?;
        st.ok_or_else(|| {
            ClusterError::Timeout(format!(
                "`{}` did not finish within {} s",
                self.command,
                limit.as_secs()
            ))
        })
    }

    fn kill(&mut self) -> std::io::Result<()> {
        self.child.kill()?;
        self.child.wait().map(|_| ())
    }

    fn lines(&self) -> Vec<String> {
        // The reader threads may still be draining the pipes right after exit.
        std::thread::sleep(Duration::from_millis(100));
        self.lines.lock().map(|l| l.clone()).unwrap_or_default()
    }

    /// The most telling line of a failed run: the last line naming an error, else the last line.
    fn failure(&self, status: ExitStatus) -> ClusterError {
        let lines = self.lines();
        let telling = telling_line(
            &lines,
            &["Error", "error:", "Exception", "already running"],
        );
        let text = lines.join("\n");
        let detail = match telling {
            Some(t) => format!(
                "{t} (exit {})",
                status
                    .code()
                    .map(|c| c.to_string())
                    .unwrap_or_else(|| "by signal".into())
            ),
            None => format!(
                "exited with {status} and no output; last line: {}",
                last_line(&text).unwrap_or("")
            ),
        };
        ClusterError::RayCommand {
            command: self.command.clone(),
            detail,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ansi() {
        assert_eq!(
            strip_ansi("\x1b[32mRay runtime started.\x1b[39m"),
            "Ray runtime started."
        );
        assert_eq!(strip_ansi("plain"), "plain");
    }

    #[test]
    fn probes() {
        let mut settings = vec![0, 0, 18, 4, 0, 0, 0, 0, 0];
        settings.extend_from_slice(&[0; 18]);
        assert_eq!(classify_probe(&settings), Probe::Grpc);
        assert!(
            matches!(classify_probe(b"HTTP/1.1 400 Bad Request\r\n"), Probe::NotGrpc(d) if d.contains("HTTP/1"))
        );
        assert!(matches!(classify_probe(b""), Probe::NotGrpc(_)));
        assert!(
            matches!(classify_probe(b"-ERR unknown command"), Probe::NotGrpc(d) if d.contains("-ERR"))
        );
        assert_eq!(classify_probe(&[0x15, 3, 3, 0, 2, 2, 50]), Probe::Unknown);
    }

    #[test]
    fn taken_port_is_named() {
        // An ephemeral port outside Ray's worker range (else the range check answers first).
        let (l, port) = loop {
            let l = TcpListener::bind(("0.0.0.0", 0)).unwrap();
            let port = l.local_addr().unwrap().port();
            if !WORKER_PORTS.contains(&port) {
                break (l, port);
            }
        };
        assert!(!port_is_free(port));
        let e = check_ports(&[(port, "Ray dashboard", "--dashboard-port")])
            .unwrap_err()
            .to_string();
        assert!(
            e.contains(&format!("port {port} (Ray dashboard)"))
                && e.contains("--dashboard-port")
                && e.contains("ss -ltnp"),
            "{e}"
        );
        drop(l);
    }

    #[test]
    fn unreachable_head_times_out_with_message() {
        // A port nobody listens on: bind, note the port, close.
        let port = TcpListener::bind(("127.0.0.1", 0))
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        let t = Instant::now();
        let e = wait_for_tcp(
            "127.0.0.1",
            port,
            Duration::from_secs(2),
            &Progress {
                tty: false,
                state: Mutex::new((None, false)),
            },
        )
        .unwrap_err()
        .to_string();
        assert!(t.elapsed() < Duration::from_secs(5));
        assert!(
            e.contains(&format!("127.0.0.1:{port}"))
                && e.contains("within 2 s")
                && e.contains("--wait"),
            "{e}"
        );
    }

    #[test]
    fn http_server_is_not_a_head() {
        let l = TcpListener::bind(("127.0.0.1", 0)).unwrap();
        let port = l.local_addr().unwrap().port();
        let server = std::thread::spawn(move || {
            if let Ok((mut s, _)) = l.accept() {
                let mut buf = [0u8; 64];
                let _ = s.read(&mut buf);
                let _ = s.write_all(b"HTTP/1.1 400 Bad Request\r\nContent-Length: 0\r\n\r\n");
            }
        });
        let s = TcpStream::connect(("127.0.0.1", port)).unwrap();
        assert!(matches!(probe_grpc(s), Probe::NotGrpc(_)));
        server.join().unwrap();
    }
}
