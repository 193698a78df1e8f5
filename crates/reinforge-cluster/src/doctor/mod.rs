//! `reinforge doctor`: preflight checks on this node, and on a Ray cluster on every node.
//!
//! Each node runs `reinforge doctor --probe` (a Ray task pinned to it, started by the launcher)
//! and reports [`probe::NodeFacts`]: memory, `/dev/shm`, the checkpoint directory, the binary's
//! hash, reachability of the head's ports and of the controller's port, the interface that routes
//! to the head, GPUs, and its clock against ours. [`checks`] judges the facts against what the
//! run needs ([`checks::Requirements`], derived from the config by the trainer) and produces
//! PASS / WARN / FAIL lines with a fix each.
//!
//! The shared-directory test needs every node to write before any reads, so probes run in
//! three rounds: facts (and a token file), tokens (list them), cleanup.

pub mod checks;
pub mod probe;

use crate::launch::{LaunchError, Launcher};
use checks::{ClusterProbe, Requirements};
use probe::{NodeFacts, PortFacts, ProbeRequest, Round, Target};
use serde::Serialize;
use std::net::TcpListener;
use std::path::Path;
use std::time::Duration;

/// A check's outcome.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "UPPERCASE")]
pub enum Status {
    /// Fine.
    Pass,
    /// Works, but likely to hurt (slow, fragile, little headroom).
    Warn,
    /// The run would fail or hang.
    Fail,
}

/// One finding.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Check {
    /// What was checked (`memory`, `ports`, ...).
    pub name: String,
    /// The node it concerns (None: the cluster, or this machine for a local run).
    pub node: Option<String>,
    /// Outcome.
    pub status: Status,
    /// What was seen.
    pub saw: String,
    /// How to fix it (WARN and FAIL).
    pub fix: Option<String>,
}

/// All findings of one doctor run.
#[derive(Debug, Clone, Serialize)]
pub struct Report {
    /// Findings, in the order checked.
    pub checks: Vec<Check>,
    /// Nodes looked at.
    pub nodes: usize,
    /// Seconds the whole run took.
    pub wall_s: f64,
}

impl Report {
    /// Findings with this status.
    pub fn count(&self, s: Status) -> usize {
        self.checks.iter().filter(|c| c.status == s).count()
    }

    /// The failures, one line each (for a refusal message).
    pub fn failures(&self) -> Vec<String> {
        self.checks.iter().filter(|c| c.status == Status::Fail).map(Check::line).collect()
    }

    /// The report as text: one line per check, the fix on the next, a summary last.
    pub fn render(&self) -> String {
        let mut s = String::new();
        for c in &self.checks {
            let tag = match c.status {
                Status::Pass => "PASS",
                Status::Warn => "WARN",
                Status::Fail => "FAIL",
            };
            s += &format!("{tag}  {:<11} {:<15} {}\n", c.name, c.node.as_deref().unwrap_or("-"), c.saw);
            if let Some(f) = &c.fix {
                s += &format!("      {:<27} fix: {f}\n", "");
            }
        }
        s += &format!(
            "{} passed, {} warning(s), {} failed on {} node(s) in {:.1}s\n",
            self.count(Status::Pass),
            self.count(Status::Warn),
            self.count(Status::Fail),
            self.nodes,
            self.wall_s
        );
        s
    }
}

impl Check {
    /// `name on node: saw; fix`.
    pub fn line(&self) -> String {
        let on = self.node.as_deref().map(|n| format!(" on {n}")).unwrap_or_default();
        let fix = self.fix.as_deref().map(|f| format!("; {f}")).unwrap_or_default();
        format!("{}{on}: {}{fix}", self.name, self.saw)
    }
}

/// This machine's facts for `run_dir` (its own token session, removed again): the binary,
/// memory, `/dev/shm` and disk the controller itself runs with.
fn this_node(run_dir: &Path, session: String, cuda_libs: bool) -> NodeFacts {
    let ask = |round| ProbeRequest { round, session: session.clone(), run_dir: Some(run_dir.to_path_buf()), head_ip: None, targets: Vec::new(), clock: None, cuda_libs };
    let facts = probe::probe(&ask(Round::Facts));
    probe::probe(&ask(Round::Cleanup));
    facts
}

/// Checks for a single-process run on this machine.
pub fn local(req: &Requirements) -> Vec<Check> {
    checks::local(req, &this_node(&req.run_dir, format!("local-{:08x}", rand::random::<u32>()), req.wants_gpus))
}

/// How long a node may take to answer one probe round, for `reinforge doctor` and the preflight
/// of `train --ray` alike (a node that passes one passes the other): a round takes about a
/// second, but a cold node first starts a Ray worker and loads the CUDA libraries, from a
/// network file system on some clusters.
pub const PROBE_TIMEOUT: Duration = Duration::from_secs(60);

/// Probes every node of the cluster `launcher` is connected to and judges the answers.
/// `listener` is bound on the controller's port: nodes must reach it, and it carries the clock
/// exchange. `bin` is the `reinforge` every node runs (the same path as the workers'). A node
/// that does not answer a round within `timeout` fails the `probe` check.
pub fn cluster(req: &Requirements, launcher: &mut Launcher, listener: &TcpListener, bin: &Path, timeout: Duration) -> Result<Vec<Check>, LaunchError> {
    let _clock = probe::ClockServer::start(listener).map_err(|e| LaunchError::Io(format!("clock server: {e}")))?;
    let port = listener.local_addr().map_err(|e| LaunchError::Io(e.to_string()))?.port();
    let controller = format!("{}:{port}", launcher.driver_ip);
    let head_ip = launcher.gcs.rsplit_once(':').map(|(h, _)| h.to_string());
    let mut targets = vec![Target { name: "Ray GCS".into(), addr: launcher.gcs.clone() }];
    if !launcher.dashboard.is_empty() {
        targets.push(Target { name: "Ray dashboard".into(), addr: launcher.dashboard.clone() });
    }
    targets.push(Target { name: "controller".into(), addr: controller.clone() });
    let session = format!("{:016x}", rand::random::<u64>());
    let ask = |round| ProbeRequest {
        round,
        session: session.clone(),
        run_dir: Some(req.run_dir.clone()),
        head_ip: head_ip.clone(),
        targets: if round == Round::Facts { targets.clone() } else { Vec::new() },
        clock: (round == Round::Facts).then(|| controller.clone()),
        cuda_libs: req.wants_gpus,
    };
    let rounds: Vec<Vec<String>> = [Round::Facts, Round::Tokens, Round::Cleanup]
        .into_iter()
        .map(|r| vec!["doctor".to_string(), "--probe".to_string(), serde_json::to_string(&ask(r)).unwrap_or_default()])
        .collect();
    let answer = launcher.probe(&[bin.display().to_string()], &rounds, timeout)?;
    let probe: ClusterProbe = serde_json::from_value(answer).map_err(|e| LaunchError::Io(format!("unreadable probe results: {e}")))?;
    // This node as the controller sees itself: the binary every node must match, and the disk
    // the controller writes checkpoints to.
    let mut here = this_node(&req.run_dir, format!("{session}-here"), false);
    here.node = launcher.driver_ip.clone();
    let replaced = checks::replaced_nodes(&probe);
    let head_reach: Vec<(String, PortFacts)> = probe
        .nodes
        .iter()
        .filter(|n| !replaced.contains(&n.node_id))
        .filter_map(|n| n.raylet_port.map(|p| (n.node_ip.clone(), probe::connect("raylet", &format!("{}:{p}", n.node_ip)))))
        .collect();
    Ok(checks::cluster(req, &probe, &here, &head_reach))
}
