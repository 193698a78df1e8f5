//! Starts worker ranks on Ray through the embedded Python launcher and reports what it sees.
//!
//! The launcher (`python/reinforge_ray/launch.py`, compiled into the binary so no install path
//! is needed) creates a placement group per worker group and a Ray actor per rank; each actor
//! starts a `reinforge worker` process that dials the controller. Events come back as
//! `@@reinforge {json}` lines on its stdout; every other line is a worker's log forwarded by Ray
//! and goes to our stderr, so `reinforge job logs` shows the workers too.

use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::io::{BufRead, BufReader, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, Command, Stdio};
use std::sync::mpsc::{self, Receiver, RecvTimeoutError};
use std::time::{Duration, Instant};

/// The launcher's source, embedded at build time.
pub const LAUNCHER_PY: &str = include_str!("../../../python/reinforge_ray/launch.py");
const EVENT_PREFIX: &str = "@@reinforge ";

/// One worker group to place: `nnodes × ranks_per_node` ranks.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct GroupSpec {
    /// Group name (`policy`, `rollout`, `ref`, `critic`).
    pub name: String,
    /// Nodes the group spans.
    pub nnodes: usize,
    /// Ranks on each node (GPUs per node on GPU clusters).
    pub ranks_per_node: usize,
    /// CPUs reserved per rank.
    pub cpus_per_rank: f64,
    /// GPUs per rank (0 on CPU clusters).
    pub gpus_per_rank: f64,
}

impl GroupSpec {
    /// Ranks in the group.
    pub fn world(&self) -> usize {
        self.nnodes * self.ranks_per_node
    }
}

#[derive(Serialize)]
struct LaunchRequest<'a> {
    groups: &'a [GroupSpec],
    worker_cmd: &'a [String],
    env: &'a BTreeMap<String, String>,
    placement_timeout_s: u64,
}

/// Where a rank landed.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct Placement {
    /// Worker group.
    pub group: String,
    /// Rank in the group.
    pub rank: usize,
    /// The node's IP as Ray knows it.
    pub node_ip: String,
    /// Ray's node id.
    pub node_id: String,
    /// The worker process id.
    pub pid: u32,
}

/// Something the launcher reported.
#[derive(Debug, Clone, PartialEq)]
pub enum Event {
    /// A rank's worker process started on a node.
    Placed(Placement),
    /// Every rank is placed.
    Ready,
    /// A rank's worker process exited.
    Exited {
        /// Group and rank.
        group: String,
        /// Rank.
        rank: usize,
        /// Node it ran on.
        node_ip: String,
        /// Exit code.
        code: i64,
    },
    /// A rank's actor died with its node (or was killed).
    Lost {
        /// Group.
        group: String,
        /// Rank.
        rank: usize,
        /// Node it ran on.
        node_ip: String,
        /// Ray's reason.
        message: String,
    },
    /// The launcher connected to Ray on the node `node_ip`; `cluster` summarises the nodes.
    Driver {
        /// The controller's node IP as Ray sees it.
        node_ip: String,
        /// Alive nodes and their resources.
        cluster: String,
        /// The head's GCS address (`HOST:PORT`).
        gcs: String,
        /// The dashboard's address (`HOST:PORT`), empty when it does not run.
        dashboard: String,
    },
    /// Answers of a probe run on every node (see [`Launcher::probe`]).
    Probed(serde_json::Value),
    /// What became of a service on every node (see [`Launcher::services`]).
    Services(serde_json::Value),
    /// The launcher failed (connection, placement).
    Error(String),
    /// The launcher process ended.
    Ended(Option<i32>),
}

/// Launch failures.
#[derive(Debug, thiserror::Error)]
pub enum LaunchError {
    /// The launcher could not be started or talked to.
    #[error("Ray launcher: {0}")]
    Io(String),
    /// The launcher reported a failure.
    #[error("{0}")]
    Reported(String),
    /// Nothing came within the time limit.
    #[error("Ray launcher: {0}")]
    Timeout(String),
}

/// A running launcher.
pub struct Launcher {
    child: Child,
    stdin: Option<ChildStdin>,
    events: Receiver<Event>,
    _script: tempfile_guard::TempFile,
    /// The IP of the node the controller runs on, as Ray sees it.
    pub driver_ip: String,
    /// Ray's summary of the cluster at connect time.
    pub cluster: String,
    /// The head's GCS address (`HOST:PORT`).
    pub gcs: String,
    /// The dashboard's address (`HOST:PORT`), empty when it does not run.
    pub dashboard: String,
}

mod tempfile_guard {
    use std::path::PathBuf;
    /// Removes the file on drop.
    pub struct TempFile(pub PathBuf);
    impl Drop for TempFile {
        fn drop(&mut self) {
            let _ = std::fs::remove_file(&self.0);
        }
    }
}

fn parse_event(line: &str) -> Option<Event> {
    let v: serde_json::Value = serde_json::from_str(line.strip_prefix(EVENT_PREFIX)?).ok()?;
    let s = |k: &str| v.get(k).and_then(|x| x.as_str()).unwrap_or("?").to_string();
    let u = |k: &str| v.get(k).and_then(|x| x.as_u64()).unwrap_or(0);
    Some(match v.get("event")?.as_str()? {
        "placed" => Event::Placed(Placement {
            group: s("group"),
            rank: u("rank") as usize,
            node_ip: s("node_ip"),
            node_id: s("node_id"),
            pid: u("pid") as u32,
        }),
        "ready" => Event::Ready,
        "exited" => Event::Exited {
            group: s("group"),
            rank: u("rank") as usize,
            node_ip: s("node_ip"),
            code: v.get("code").and_then(|x| x.as_i64()).unwrap_or(-1),
        },
        "lost" => Event::Lost { group: s("group"), rank: u("rank") as usize, node_ip: s("node_ip"), message: s("message") },
        "error" => Event::Error(s("message")),
        "driver" => Event::Driver { node_ip: s("node_ip"), cluster: s("cluster"), gcs: s("gcs"), dashboard: s("dashboard") },
        "probed" => Event::Probed(v),
        "services" => Event::Services(v),
        _ => return None,
    })
}

impl Launcher {
    /// Starts the launcher with `python` and connects it to Ray at `address` (`auto` inside a
    /// Ray job or on a node of the cluster); waits up to `timeout` for it to connect.
    pub fn start(python: &Path, address: &str, env: &BTreeMap<String, String>, timeout: Duration) -> Result<Self, LaunchError> {
        let script = std::env::temp_dir().join(format!("reinforge-launch-{}-{}.py", std::process::id(), rand::random::<u32>()));
        std::fs::write(&script, LAUNCHER_PY).map_err(|e| LaunchError::Io(format!("writing {}: {e}", script.display())))?;
        let guard = tempfile_guard::TempFile(script.clone());
        let mut cmd = Command::new(python);
        cmd.arg("-u").arg(&script).env("REINFORGE_RAY_ADDRESS", address).stdin(Stdio::piped()).stdout(Stdio::piped()).stderr(Stdio::inherit());
        for (k, v) in env {
            cmd.env(k, v);
        }
        let mut child = cmd.spawn().map_err(|e| LaunchError::Io(format!("cannot run {}: {e}", python.display())))?;
        let stdout = child.stdout.take().ok_or_else(|| LaunchError::Io("no stdout".into()))?;
        let stdin = child.stdin.take();
        let (tx, rx) = mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines() {
                let Ok(line) = line else { break };
                match parse_event(&line) {
                    Some(ev) => {
                        if tx.send(ev).is_err() {
                            break;
                        }
                    }
                    // Worker logs forwarded by Ray: keep them visible.
                    None => eprintln!("{line}"),
                }
            }
            let _ = tx.send(Event::Ended(None));
        });
        let mut l = Self { child, stdin, events: rx, _script: guard, driver_ip: String::new(), cluster: String::new(), gcs: String::new(), dashboard: String::new() };
        let deadline = Instant::now() + timeout;
        loop {
            match l.next_event(deadline.saturating_duration_since(Instant::now()))? {
                Event::Driver { node_ip, cluster, gcs, dashboard } => {
                    l.driver_ip = node_ip;
                    l.cluster = cluster;
                    l.gcs = gcs;
                    l.dashboard = dashboard;
                    return Ok(l);
                }
                Event::Error(m) => return Err(LaunchError::Reported(m)),
                Event::Ended(_) => {
                    let code = l.child.wait().ok().and_then(|s| s.code());
                    return Err(LaunchError::Io(format!(
                        "the launcher exited (code {code:?}) before connecting to Ray at {address}; see the lines above"
                    )));
                }
                other => tracing::debug!(?other, "launcher event before connect"),
            }
        }
    }

    /// The next event, or a timeout error naming what was awaited.
    pub fn next_event(&mut self, timeout: Duration) -> Result<Event, LaunchError> {
        match self.events.recv_timeout(timeout) {
            Ok(Event::Ended(_)) => Ok(Event::Ended(self.child.wait().ok().and_then(|s| s.code()))),
            Ok(e) => Ok(e),
            Err(RecvTimeoutError::Timeout) => Err(LaunchError::Timeout(format!("no answer within {}s", timeout.as_secs()))),
            Err(RecvTimeoutError::Disconnected) => Ok(Event::Ended(self.child.wait().ok().and_then(|s| s.code()))),
        }
    }

    /// Sends the placement request; then read [`Event::Placed`]s until [`Event::Ready`].
    pub fn place(&mut self, groups: &[GroupSpec], worker_cmd: &[String], env: &BTreeMap<String, String>, placement_timeout: Duration) -> Result<(), LaunchError> {
        let req = LaunchRequest { groups, worker_cmd, env, placement_timeout_s: placement_timeout.as_secs().max(1) };
        let line = serde_json::to_string(&req).map_err(|e| LaunchError::Io(e.to_string()))?;
        self.send_line(&line)
    }

    /// One request line to the launcher.
    fn send_line(&mut self, line: &str) -> Result<(), LaunchError> {
        let stdin = self.stdin.as_mut().ok_or_else(|| LaunchError::Io("launcher stdin closed".into()))?;
        writeln!(stdin, "{line}").and_then(|_| stdin.flush()).map_err(|e| LaunchError::Io(format!("writing to the launcher: {e}")))
    }

    /// Runs `cmd + round` on every alive node (a Ray task pinned to it), round after round, and
    /// returns what came back: `{"nodes": [{node_ip, node_id, cpus, gpus, raylet_port, rounds:
    /// [{code, stdout, stderr, python, ray}]}], "python", "ray", "gcs", "dashboard"}`.
    /// Call it before [`Self::place`].
    pub fn probe(&mut self, cmd: &[String], rounds: &[Vec<String>], timeout: Duration) -> Result<serde_json::Value, LaunchError> {
        let req = serde_json::json!({ "probe": { "cmd": cmd, "rounds": rounds, "timeout_s": timeout.as_secs().max(1) } });
        self.send_line(&req.to_string())?;
        // Each round may take the whole timeout on a slow node, plus Ray's task start-up.
        let deadline = Instant::now() + (timeout + Duration::from_secs(15)) * rounds.len().max(1) as u32;
        loop {
            match self.next_event(deadline.saturating_duration_since(Instant::now()))? {
                Event::Probed(v) => return Ok(v),
                Event::Error(m) => return Err(LaunchError::Reported(m)),
                Event::Ended(code) => return Err(LaunchError::Io(format!("the launcher exited (code {code:?}) while probing the nodes"))),
                other => tracing::debug!(?other, "launcher event while probing"),
            }
        }
    }

    /// Starts (`cmd` on every alive node, waiting up to `timeout` for it to listen on
    /// `port`), stops or lists a named long-lived service, one detached Ray actor per node, so
    /// it outlives this launcher. Returns `{"nodes": [{node_ip, ok, message}]}`.
    pub fn services(&mut self, action: ServiceAction, name: &str, cmd: &[String], port: u16, timeout: Duration) -> Result<serde_json::Value, LaunchError> {
        let req = serde_json::json!({ "services": { "action": action.as_str(), "name": name, "cmd": cmd, "port": port, "timeout_s": timeout.as_secs().max(1) } });
        self.send_line(&req.to_string())?;
        // Nodes are started one after the other, each within the timeout.
        let deadline = Instant::now() + (timeout + Duration::from_secs(30)) * 64;
        loop {
            match self.next_event(deadline.saturating_duration_since(Instant::now()))? {
                Event::Services(v) => return Ok(v),
                Event::Error(m) => return Err(LaunchError::Reported(m)),
                Event::Ended(code) => return Err(LaunchError::Io(format!("the launcher exited (code {code:?}) while it {} the {name} service", action.doing()))),
                other => tracing::debug!(?other, "launcher event while managing services"),
            }
        }
    }

    /// Hands the event stream to a supervisor thread (after placement).
    pub fn into_parts(mut self) -> (Receiver<Event>, LauncherHandle) {
        let (_tx, dummy) = mpsc::channel();
        let events = std::mem::replace(&mut self.events, dummy);
        (events, LauncherHandle { _inner: self })
    }
}

/// Keeps the launcher alive; dropping it closes its stdin, which kills every rank.
pub struct LauncherHandle {
    _inner: Launcher,
}

impl Drop for Launcher {
    fn drop(&mut self) {
        // EOF on stdin makes the launcher kill its actors and remove the placement groups.
        self.stdin.take();
        let deadline = Instant::now() + Duration::from_secs(15);
        while Instant::now() < deadline {
            if let Ok(Some(_)) = self.child.try_wait() {
                return;
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Environment a launcher needs outside a Ray job (a shell on a node): the cluster token like
/// any Ray client. Inside a job Ray already put it in the environment.
pub fn client_env() -> BTreeMap<String, String> {
    let mut env = BTreeMap::new();
    if let Ok(Some(t)) = crate::token::load(None) {
        for (k, v) in crate::bringup::ray_auth_env(Some(&t)) {
            if let Some(v) = v {
                env.insert(k, v);
            }
        }
    }
    env
}

/// The `reinforge` binary workers run: `REINFORGE_WORKER_BIN` or this executable (the same path
/// must exist on every node: a shared filesystem or the same install location).
pub fn worker_binary() -> Result<PathBuf, LaunchError> {
    if let Ok(p) = std::env::var("REINFORGE_WORKER_BIN") {
        return Ok(PathBuf::from(p));
    }
    std::env::current_exe().map_err(|e| LaunchError::Io(format!("cannot find this executable: {e}")))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn events_parse_and_logs_pass_through() {
        let e = parse_event(r#"@@reinforge {"event":"placed","group":"policy","rank":1,"node_ip":"10.0.0.2","node_id":"ab","pid":42}"#);
        assert_eq!(
            e,
            Some(Event::Placed(Placement { group: "policy".into(), rank: 1, node_ip: "10.0.0.2".into(), node_id: "ab".into(), pid: 42 }))
        );
        assert_eq!(parse_event("(RankWorker pid=1) hello"), None);
        assert_eq!(
            parse_event(r#"@@reinforge {"event":"lost","group":"rollout","rank":0,"node_ip":"10.0.0.2","message":"node died"}"#),
            Some(Event::Lost { group: "rollout".into(), rank: 0, node_ip: "10.0.0.2".into(), message: "node died".into() })
        );
        assert!(LAUNCHER_PY.contains("placement_group"));
    }
}

/// What [`Launcher::services`] does.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ServiceAction {
    /// Start on every node where it does not run yet.
    Start,
    /// Stop everywhere.
    Stop,
    /// Say where it runs.
    Status,
}

impl ServiceAction {
    fn as_str(self) -> &'static str {
        match self {
            Self::Start => "start",
            Self::Stop => "stop",
            Self::Status => "status",
        }
    }

    fn doing(self) -> &'static str {
        match self {
            Self::Start => "started",
            Self::Stop => "stopped",
            Self::Status => "listed",
        }
    }
}
