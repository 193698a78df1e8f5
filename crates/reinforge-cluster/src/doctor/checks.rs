//! Judging what the nodes reported against what the run needs: one [`Check`] per finding, each
//! with what was seen and, when it is not a pass, the one-line fix.

use super::probe::{NodeFacts, PortFacts, Space};
use super::{Check, Status};
use crate::launch::GroupSpec;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::path::PathBuf;

/// `/dev/shm` below this fails: NCCL's intra-node transport and Ray's object store live there,
/// and containers default to 64 MiB.
pub const MIN_SHM: u64 = 1 << 30;
/// Clock offsets above these warn and fail (leases and heartbeats compare wall clocks).
const CLOCK_WARN_MS: f64 = 500.0;
const CLOCK_FAIL_MS: f64 = 5000.0;

/// One worker group as the run would place it, with its host-memory estimate.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct GroupDemand {
    /// Ranks and resources, as the launcher will ask Ray for them.
    pub spec: GroupSpec,
    /// Roles the group's processes hold (`actor`, `rollout`, ...).
    pub roles: Vec<String>,
    /// Host memory one rank needs, in bytes (None: no estimate, e.g. the model is not here).
    pub ram_per_rank: Option<u64>,
}

/// What the run needs from the machines, derived from its config by the trainer.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Default)]
pub struct Requirements {
    /// Worker groups (empty for a single-process run).
    pub groups: Vec<GroupDemand>,
    /// Host memory of a single-process run (every role in one process).
    pub local_ram: Option<u64>,
    /// Why there is no memory estimate, when there is none.
    pub ram_note: Option<String>,
    /// The run directory (checkpoints, metrics).
    pub run_dir: PathBuf,
    /// Bytes of one checkpoint.
    pub checkpoint_bytes: Option<u64>,
    /// Checkpoints kept at once (`trainer.max_ckpt_to_keep`).
    pub checkpoints_kept: usize,
    /// Whether the run uses GPUs.
    pub wants_gpus: bool,
}

/// One probe round's outcome on a node: the facts, or why the probe could not run.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct RoundResult {
    /// Exit code of `reinforge doctor --probe`.
    pub code: i64,
    /// Its stdout (the facts as JSON).
    #[serde(default)]
    pub stdout: String,
    /// The end of its stderr.
    #[serde(default)]
    pub stderr: String,
    /// Python version of the node's Ray worker.
    #[serde(default)]
    pub python: String,
    /// Ray version of the node's Ray worker.
    #[serde(default)]
    pub ray: String,
}

impl RoundResult {
    /// The facts, or a one-line reason.
    pub fn facts(&self) -> Result<NodeFacts, String> {
        if self.code != 0 {
            let err = self.stderr.lines().rev().find(|l| !l.trim().is_empty()).unwrap_or("no output");
            return Err(format!("exit code {}: {}", self.code, err.trim()));
        }
        serde_json::from_str(self.stdout.trim()).map_err(|e| format!("unreadable answer ({e})"))
    }
}

/// A node as Ray lists it, with its probe rounds.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct ProbedNode {
    /// The node's IP.
    pub node_ip: String,
    /// Ray's node id.
    pub node_id: String,
    /// Ray's CPU resource.
    #[serde(default)]
    pub cpus: f64,
    /// Ray's GPU resource.
    #[serde(default)]
    pub gpus: f64,
    /// The raylet's port (the head must reach it).
    #[serde(default)]
    pub raylet_port: Option<u16>,
    /// One result per round.
    pub rounds: Vec<RoundResult>,
}

/// Everything a cluster probe brought back.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct ClusterProbe {
    /// Alive nodes.
    pub nodes: Vec<ProbedNode>,
    /// Python of the driver (the node running doctor).
    #[serde(default)]
    pub python: String,
    /// Ray of the driver.
    #[serde(default)]
    pub ray: String,
    /// The GCS address (`HOST:PORT`).
    #[serde(default)]
    pub gcs: String,
    /// The dashboard address (`HOST:PORT`), when it runs.
    #[serde(default)]
    pub dashboard: String,
}

/// Human-readable bytes.
pub fn bytes(b: u64) -> String {
    let g = b as f64 / (1u64 << 30) as f64;
    if g >= 1.0 {
        format!("{g:.1} GiB")
    } else {
        format!("{:.0} MiB", b as f64 / (1u64 << 20) as f64)
    }
}

fn check(name: &str, node: Option<&str>, status: Status, saw: String, fix: Option<String>) -> Check {
    Check { name: name.into(), node: node.map(str::to_string), status, saw, fix }
}

/// Checks for a single-process run on this machine.
pub fn local(req: &Requirements, f: &NodeFacts) -> Vec<Check> {
    let mut out = vec![check(
        "binary",
        None,
        Status::Pass,
        format!("reinforge {} at {} (sha256 {})", f.binary.version, f.binary.path.display(), short(&f.binary.sha256)),
        None,
    )];
    out.push(memory(None, req.local_ram, req.ram_note.as_deref(), "every role in this process", f));
    out.push(shm(None, f, false));
    out.extend(disk(req, None, f));
    out.push(gpu(None, req.wants_gpus, 0.0, f));
    out.extend(cuda_libs(None, req.wants_gpus, f));
    out
}

/// Whether Ray could not run the probe on `n` at all (the node is gone or going).
fn gone(n: &ProbedNode) -> bool {
    n.rounds.first().is_none_or(|r| r.code == -1)
}

/// Node ids Ray still lists as alive that could not run the probe while another node at the
/// same address did: the old entry of a node that was restarted, which Ray marks dead within
/// about 30 s. They are reported as a warning and left out of every other check (placement
/// included): the node that replaced them is the one that runs workers.
pub fn replaced_nodes(probe: &ClusterProbe) -> Vec<String> {
    probe
        .nodes
        .iter()
        .filter(|n| gone(n) && probe.nodes.iter().any(|m| m.node_id != n.node_id && m.node_ip == n.node_ip && !gone(m)))
        .map(|n| n.node_id.clone())
        .collect()
}

/// Checks for a run on a Ray cluster; `here` is the doctor's own node (the controller's).
pub fn cluster(req: &Requirements, probe: &ClusterProbe, here: &NodeFacts, head_reach: &[(String, PortFacts)]) -> Vec<Check> {
    let mut out = Vec::new();
    let replaced = replaced_nodes(probe);
    for n in probe.nodes.iter().filter(|n| replaced.contains(&n.node_id)) {
        out.push(check(
            "probe",
            Some(&n.node_ip),
            Status::Warn,
            format!("node {} did not answer, and a newer node at {} did: the entry of a restarted node that Ray has not yet marked dead", short(&n.node_id), n.node_ip),
            Some("nothing to do: Ray marks it dead within about 30 s, and workers go to the node that answered".into()),
        ));
    }
    let live = ClusterProbe { nodes: probe.nodes.iter().filter(|n| !replaced.contains(&n.node_id)).cloned().collect(), ..probe.clone() };
    let probe = &live;
    let mut facts: Vec<(&ProbedNode, NodeFacts, Option<NodeFacts>)> = Vec::new();
    for n in &probe.nodes {
        let first = n.rounds.first().map(RoundResult::facts).unwrap_or_else(|| Err("no answer".into()));
        match first {
            Ok(f) => {
                let tokens = n.rounds.get(1).and_then(|r| r.facts().ok());
                facts.push((n, f, tokens));
            }
            // Ray could not run the task at all: the node is gone or going.
            Err(why) if gone(n) => out.push(check(
                "probe",
                Some(&n.node_ip),
                Status::Fail,
                format!("the node did not answer ({why})"),
                Some("see `reinforge cluster status`: a node that died is marked dead by Ray within about 30 s; restart or remove it".into()),
            )),
            Err(why) => out.push(check(
                "probe",
                Some(&n.node_ip),
                Status::Fail,
                format!("cannot run {} there ({why})", here.binary.path.display()),
                Some(format!(
                    "install this reinforge at {} on every node (a shared filesystem or the same install path), or set REINFORGE_WORKER_BIN",
                    here.binary.path.display()
                )),
            )),
        }
    }
    // Nodes whose probe could not run are reported above; the shared-directory test counts
    // only the nodes that wrote a token.
    let answered: Vec<&str> = facts.iter().map(|(n, _, _)| n.node_ip.as_str()).collect();
    let placed = assign(req, probe);
    out.push(placement(&placed, probe));
    let assigned = placed.unwrap_or_default();
    for (n, f, tokens) in &facts {
        let ip = n.node_ip.as_str();
        out.push(if f.binary.sha256 == here.binary.sha256 {
            check("binary", Some(ip), Status::Pass, format!("same reinforge {} (sha256 {})", f.binary.version, short(&f.binary.sha256)), None)
        } else {
            check(
                "binary",
                Some(ip),
                Status::Fail,
                format!(
                    "a different reinforge at {}: sha256 {} ({}), this node has {} ({})",
                    f.binary.path.display(),
                    short(&f.binary.sha256),
                    f.binary.version,
                    short(&here.binary.sha256),
                    here.binary.version
                ),
                Some("install the same build on every node (copy this binary, or put it on a shared filesystem)".into()),
            )
        });
        let r0 = &n.rounds[0];
        out.push(if r0.python == probe.python && r0.ray == probe.ray {
            check("versions", Some(ip), Status::Pass, format!("Ray {}, Python {}", r0.ray, r0.python), None)
        } else {
            check(
                "versions",
                Some(ip),
                Status::Fail,
                format!("Ray {} / Python {} there, Ray {} / Python {} here", r0.ray, r0.python, probe.ray, probe.python),
                Some(format!("install Ray {} on Python {} on every node (python/requirements.txt pins Ray)", probe.ray, probe.python)),
            )
        });
        let (need, what) = match assigned.get(ip) {
            Some(groups) => (
                groups.iter().map(|(g, ranks)| g.ram_per_rank.map(|r| r * *ranks as u64)).sum::<Option<u64>>(),
                groups.iter().map(|(g, ranks)| format!("{} × {}", ranks, g.spec.name)).collect::<Vec<_>>().join(" + "),
            ),
            None => (Some(0), "no ranks".to_string()),
        };
        out.push(memory(Some(ip), need, req.ram_note.as_deref(), &what, f));
        out.push(shm(Some(ip), f, true));
        out.push(gpu(Some(ip), req.wants_gpus, n.gpus, f));
        out.extend(cuda_libs(Some(ip), req.wants_gpus, f));
        out.extend(ports(ip, f));
        out.push(interface(ip, f));
        out.push(clock(ip, f));
        out.push(shared_dir(req, ip, f, tokens.as_ref(), &answered));
    }
    for (ip, p) in head_reach.iter().filter(|(ip, _)| answered.contains(&ip.as_str())) {
        if let Some(e) = &p.error {
            out.push(check(
                "ports",
                Some(ip),
                Status::Fail,
                format!("this node cannot reach {} at {}: {e}", p.name, p.addr),
                Some(format!("open TCP {} on {ip} to the other nodes (Ray's node-manager port; `ray start --node-manager-port` fixes it)", port_of(&p.addr))),
            ));
        }
    }
    out.extend(disk(req, Some(&here.node), here));
    out
}

fn short(sha: &str) -> &str {
    &sha[..sha.len().min(12)]
}

fn port_of(addr: &str) -> &str {
    addr.rsplit(':').next().unwrap_or(addr)
}

/// The ranks each node gets, by group.
type Assignment<'a> = BTreeMap<String, Vec<(&'a GroupDemand, usize)>>;

/// Nodes each group would land on: biggest per-node demands first onto the emptiest nodes, the
/// order the launcher places them in. The error is the first group that does not fit.
fn assign<'a>(req: &'a Requirements, probe: &ClusterProbe) -> Result<Assignment<'a>, &'a GroupDemand> {
    let mut free: Vec<(String, f64, f64)> = probe.nodes.iter().map(|n| (n.node_ip.clone(), n.cpus, n.gpus)).collect();
    let per_node = |g: &GroupDemand| (g.spec.ranks_per_node as f64 * g.spec.cpus_per_rank, g.spec.ranks_per_node as f64 * g.spec.gpus_per_rank);
    let mut order: Vec<&GroupDemand> = req.groups.iter().collect();
    order.sort_by(|a, b| {
        let (ac, ag) = per_node(a);
        let (bc, bg) = per_node(b);
        bg.total_cmp(&ag).then(bc.total_cmp(&ac))
    });
    let mut placed = Assignment::new();
    for g in order {
        let (cpu, gpu) = per_node(g);
        let mut fits: Vec<usize> = (0..free.len()).filter(|&i| free[i].1 + 1e-9 >= cpu && free[i].2 + 1e-9 >= gpu).collect();
        if fits.len() < g.spec.nnodes {
            return Err(g);
        }
        fits.sort_by(|&a, &b| free[b].2.total_cmp(&free[a].2).then(free[b].1.total_cmp(&free[a].1)));
        for &i in &fits[..g.spec.nnodes] {
            free[i].1 -= cpu;
            free[i].2 -= gpu;
            placed.entry(free[i].0.clone()).or_default().push((g, g.spec.ranks_per_node));
        }
    }
    Ok(placed)
}

fn placement(placed: &Result<Assignment<'_>, &GroupDemand>, probe: &ClusterProbe) -> Check {
    let nodes = probe.nodes.iter().map(|n| format!("{}: {} CPU, {} GPU", n.node_ip, n.cpus, n.gpus)).collect::<Vec<_>>().join("; ");
    let nodes = format!("{} alive node(s) ({nodes})", probe.nodes.len());
    match placed {
        Ok(placed) => {
            let saw = placed
                .iter()
                .map(|(ip, gs)| format!("{ip}: {}", gs.iter().map(|(g, r)| format!("{} ×{r}", g.spec.name)).collect::<Vec<_>>().join(", ")))
                .collect::<Vec<_>>()
                .join("; ");
            let saw = if saw.is_empty() { format!("nothing to place; {nodes}") } else { format!("ranks per node: {saw}") };
            check("placement", None, Status::Pass, saw, None)
        }
        Err(g) => {
            let (cpu, gpu) = (g.spec.ranks_per_node as f64 * g.spec.cpus_per_rank, g.spec.ranks_per_node as f64 * g.spec.gpus_per_rank);
            check(
                "placement",
                None,
                Status::Fail,
                format!(
                    "cannot place worker group '{}': it needs {} node(s) with {cpu} CPU and {gpu} GPU free each (after the larger groups), the cluster has {nodes}",
                    g.spec.name, g.spec.nnodes
                ),
                Some(format!(
                    "lower cluster.{}.nnodes or gpus_per_node, colocate roles (cluster.colocate_all), or add nodes",
                    g.spec.name.replace("policy", "actor")
                )),
            )
        }
    }
}

fn memory(node: Option<&str>, need: Option<u64>, note: Option<&str>, what: &str, f: &NodeFacts) -> Check {
    let have = format!("{} available of {}", bytes(f.mem_available), bytes(f.mem_total));
    match need {
        None => check(
            "memory",
            node,
            Status::Warn,
            format!("{have}; no estimate for the run ({})", note.unwrap_or("unknown model size")),
            Some("make actor.model readable on this node for an estimate".into()),
        ),
        Some(n) if n > f.mem_available => check(
            "memory",
            node,
            Status::Fail,
            format!("the run needs about {} of host memory here ({what}), {have}", bytes(n)),
            Some("fewer ranks on this node, smaller micro-batches (actor.ppo_micro_batch_size), shorter sequences, or a node with more memory".into()),
        ),
        Some(n) if n as f64 > 0.8 * f.mem_available as f64 => check(
            "memory",
            node,
            Status::Warn,
            format!("the run needs about {} here ({what}), {have}: little headroom", bytes(n)),
            Some("expect swapping or the OOM killer if other processes grow; lower actor.ppo_micro_batch_size".into()),
        ),
        Some(n) => check("memory", node, Status::Pass, format!("needs about {} ({what}), {have}", bytes(n)), None),
    }
}

fn shm(node: Option<&str>, f: &NodeFacts, cluster: bool) -> Check {
    match &f.shm {
        Some(Space { total, .. }) if *total >= MIN_SHM => check("shm", node, Status::Pass, format!("/dev/shm {}", bytes(*total)), None),
        other => check(
            "shm",
            node,
            if cluster { Status::Fail } else { Status::Warn },
            match other {
                Some(s) => format!("/dev/shm is {} (needs ≥ 1 GiB: NCCL and Ray's object store use it)", bytes(s.total)),
                None => "no /dev/shm".into(),
            },
            Some("give the container more shared memory (`docker run --shm-size=16g`, Kubernetes: an emptyDir with medium: Memory on /dev/shm)".into()),
        ),
    }
}

fn disk(req: &Requirements, node: Option<&str>, f: &NodeFacts) -> Vec<Check> {
    let Some(d) = &f.run_dir else { return Vec::new() };
    let mut out = Vec::new();
    if let Some(e) = &d.write_error {
        out.push(check(
            "run dir",
            node,
            Status::Fail,
            format!("cannot write in {}: {e}", d.path.display()),
            Some("fix the permissions, or set trainer.default_local_dir to a writable directory".into()),
        ));
    }
    let Some(space) = &d.space else { return out };
    let saw = format!("{} free at {}", bytes(space.free), d.existing.display());
    out.push(match req.checkpoint_bytes {
        Some(c) if space.free < c => check(
            "disk",
            node,
            Status::Fail,
            format!("{saw}; one checkpoint takes about {}", bytes(c)),
            Some("free space there, or set trainer.default_local_dir to a larger filesystem".into()),
        ),
        Some(c) if space.free < c * (req.checkpoints_kept.max(1) as u64 + 1) => check(
            "disk",
            node,
            Status::Warn,
            format!("{saw}; {} checkpoints of about {} each do not fit", req.checkpoints_kept + 1, bytes(c)),
            Some("lower trainer.max_ckpt_to_keep or free space".into()),
        ),
        Some(c) => check("disk", node, Status::Pass, format!("{saw}; a checkpoint takes about {}", bytes(c)), None),
        None => check("disk", node, Status::Pass, saw, None),
    });
    out
}

fn gpu(node: Option<&str>, wants: bool, ray_gpus: f64, f: &NodeFacts) -> Check {
    let g = &f.gpu;
    let versions = format!(
        "driver {}, CUDA {}, NCCL {}",
        g.driver.as_deref().unwrap_or("?"),
        g.cuda.as_deref().unwrap_or("?"),
        g.nccl.as_deref().unwrap_or("not found")
    );
    if g.gpus.is_empty() {
        let why = g.error.clone().unwrap_or_else(|| "no GPUs listed".into());
        return if wants {
            check("gpu", node, Status::Fail, format!("the run wants GPUs, this node has none ({why})"), Some("install the NVIDIA driver, or run with trainer.device=cpu".into()))
        } else {
            check("gpu", node, Status::Pass, "no GPU; a CPU run".into(), None)
        };
    }
    let n = g.gpus.len() as f64;
    if node.is_some() && (ray_gpus - n).abs() > 0.5 {
        return check(
            "gpu",
            node,
            Status::Warn,
            format!("{} GPU(s) ({}) but Ray counts {ray_gpus}; {versions}", g.gpus.len(), g.gpus[0]),
            Some("restart the node's Ray with the right --num-gpus (or unset CUDA_VISIBLE_DEVICES there)".into()),
        );
    }
    check("gpu", node, Status::Pass, format!("{} × {}; {versions}", g.gpus.len(), g.gpus[0]), None)
}

/// The CUDA engine's libraries, for a run that wants GPUs: one missing that the engine needs
/// fails (the run would stop at its first GPU call); NCCL missing warns (gradients then go
/// through the host, slower).
fn cuda_libs(node: Option<&str>, wants: bool, f: &NodeFacts) -> Option<Check> {
    if !wants {
        return None;
    }
    let Some(libs) = f.gpu.libs.as_ref() else {
        return Some(check("cuda-libs", node, Status::Warn, "not checked: this node's reinforge did not look for the CUDA libraries".into(), Some("run the same reinforge build on every node".into())));
    };
    if let Some(l) = libs.iter().find(|l| l.required && l.error.is_some()) {
        let saw = format!("{} (needed by the CUDA engine): {}", l.lib, l.error.as_deref().unwrap_or("not found"));
        return Some(check("cuda-libs", node, Status::Fail, saw, l.fix.clone()));
    }
    if let Some(l) = libs.iter().find(|l| l.error.is_some()) {
        let saw = format!("{}: {}; GPU ranks will sum gradients and send weights through the host instead (slower)", l.lib, l.error.as_deref().unwrap_or("not found"));
        return Some(check("cuda-libs", node, Status::Warn, saw, l.fix.clone()));
    }
    let found = libs.iter().map(|l| format!("{} {}", l.lib, l.path.as_deref().unwrap_or("(dynamic loader's path)"))).collect::<Vec<_>>().join(", ");
    Some(check("cuda-libs", node, Status::Pass, found, None))
}

fn ports(ip: &str, f: &NodeFacts) -> Vec<Check> {
    let failed: Vec<&PortFacts> = f.ports.iter().filter(|p| p.error.is_some()).collect();
    if failed.is_empty() {
        let saw = f.ports.iter().map(|p| format!("{} {} ({:.0} ms)", p.name, p.addr, p.ms)).collect::<Vec<_>>().join(", ");
        return vec![check("ports", Some(ip), Status::Pass, format!("reaches {saw}"), None)];
    }
    failed
        .into_iter()
        .map(|p| {
            let (host, port) = p.addr.rsplit_once(':').unwrap_or((&p.addr, "?"));
            let fix = if p.name == "controller" {
                format!("open TCP {port} on {host} to this node (cluster.controller_port fixes the controller's port so a firewall rule can name it)")
            } else {
                format!("open TCP {port} on {host} to this node")
            };
            check("ports", Some(ip), Status::Fail, format!("cannot reach the {} at {}: {}", p.name, p.addr, p.error.as_deref().unwrap_or("")), Some(fix))
        })
        .collect()
}

/// Whether NCCL's interface filter `spec` (comma-separated prefixes, `^` to exclude, `=` for
/// exact names) admits `iface`.
pub fn ifname_admits(spec: &str, iface: &str) -> bool {
    let (exclude, rest) = match spec.strip_prefix('^') {
        Some(r) => (true, r),
        None => (false, spec),
    };
    let (exact, rest) = match rest.strip_prefix('=') {
        Some(r) => (true, r),
        None => (false, rest),
    };
    let hit = rest.split(',').map(str::trim).filter(|p| !p.is_empty()).any(|p| if exact { iface == p } else { iface.starts_with(p) });
    hit != exclude
}

fn interface(ip: &str, f: &NodeFacts) -> Check {
    let Some(r) = &f.route else {
        return check("interface", Some(ip), Status::Warn, "no route to the head found".into(), Some("check the node's routing table (`ip route get HEAD_IP`)".into()));
    };
    let iface = r.interface.clone().unwrap_or_else(|| "?".into());
    for (k, v) in &f.ifname_env {
        if !ifname_admits(v, &iface) {
            return check(
                "interface",
                Some(ip),
                Status::Fail,
                format!("{k}={v} here, but the route to the head leaves through {iface} ({})", r.local_ip),
                Some(format!("set {k}={iface} on this node before `reinforge cluster start` (or unset it)")),
            );
        }
    }
    if r.local_ip != ip {
        return check(
            "interface",
            Some(ip),
            Status::Warn,
            format!("Ray knows this node as {ip}, but the route to the head leaves from {} on {iface}", r.local_ip),
            Some(format!("start this node with `reinforge cluster start --node-ip-address {}`, or set NCCL_SOCKET_IFNAME/GLOO_SOCKET_IFNAME to the interface of {ip}", r.local_ip)),
        );
    }
    let set = if f.ifname_env.is_empty() { "not set; NCCL picks it itself" } else { "set and admits it" };
    check("interface", Some(ip), Status::Pass, format!("route to the head leaves through {iface} ({}): NCCL_SOCKET_IFNAME={iface} GLOO_SOCKET_IFNAME={iface} ({set})", r.local_ip), None)
}

fn clock(ip: &str, f: &NodeFacts) -> Check {
    match &f.clock {
        None => check("clock", Some(ip), Status::Warn, "not measured (the controller's port did not answer)".into(), Some("see the ports check".into())),
        Some(c) if c.offset_ms.abs() > CLOCK_WARN_MS => check(
            "clock",
            Some(ip),
            if c.offset_ms.abs() > CLOCK_FAIL_MS { Status::Fail } else { Status::Warn },
            format!("{:+.0} ms from this node's clock (±{:.0} ms)", c.offset_ms, c.rtt_ms / 2.0),
            Some("run NTP on every node (chrony or systemd-timesyncd)".into()),
        ),
        Some(c) => check("clock", Some(ip), Status::Pass, format!("{:+.1} ms from this node's clock (±{:.1} ms)", c.offset_ms, c.rtt_ms / 2.0), None),
    }
}

fn shared_dir(req: &Requirements, ip: &str, f: &NodeFacts, tokens: Option<&NodeFacts>, nodes: &[&str]) -> Check {
    let dir = req.run_dir.display();
    if nodes.len() < 2 {
        return check("shared dir", Some(ip), Status::Pass, format!("one node: {dir} needs no sharing"), None);
    }
    if let Some(e) = f.run_dir.as_ref().and_then(|d| d.write_error.as_ref()) {
        return check("shared dir", Some(ip), Status::Fail, format!("cannot write in {dir}: {e}"), Some("make the run directory writable on every node".into()));
    }
    let seen: Vec<String> = tokens.and_then(|t| t.run_dir.as_ref()).map(|d| d.tokens.clone()).unwrap_or_default();
    let missing: Vec<&str> = nodes.iter().copied().filter(|n| !seen.iter().any(|s| s == n)).collect();
    if missing.is_empty() {
        check("shared dir", Some(ip), Status::Pass, format!("{dir} is shared: sees the files of all {} nodes", nodes.len()), None)
    } else {
        check(
            "shared dir",
            Some(ip),
            Status::Fail,
            format!("{dir} is not shared: this node does not see the files written there by {}", missing.join(", ")),
            Some("put trainer.default_local_dir on a filesystem every node mounts (NFS, Lustre, a cloud file store): workers load checkpoints from it".into()),
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::doctor::probe::LibFact;

    #[test]
    fn nccl_interface_filters() {
        assert!(ifname_admits("eth", "eth0"));
        assert!(!ifname_admits("eth", "ib0"));
        assert!(ifname_admits("ib,eth", "eth1"));
        assert!(!ifname_admits("^eth", "eth0"));
        assert!(ifname_admits("^docker,lo", "ens5"));
        assert!(ifname_admits("=eth0", "eth0"));
        assert!(!ifname_admits("=eth0", "eth01"));
    }

    fn node(ip: &str, cpus: f64, gpus: f64) -> ProbedNode {
        ProbedNode { node_ip: ip.into(), node_id: ip.into(), cpus, gpus, raylet_port: None, rounds: Vec::new() }
    }

    fn group(name: &str, nnodes: usize, ranks: usize, gpus: f64) -> GroupDemand {
        GroupDemand {
            spec: GroupSpec { name: name.into(), nnodes, ranks_per_node: ranks, cpus_per_rank: 1.0, gpus_per_rank: gpus },
            roles: vec![name.into()],
            ram_per_rank: Some(1 << 30),
        }
    }

    #[test]
    fn a_restarted_nodes_old_entry_is_a_warning_not_a_failure() {
        let answered = RoundResult { code: 0, stdout: "{}".into(), stderr: String::new(), python: String::new(), ray: String::new() };
        let not_run = RoundResult { code: -1, stdout: String::new(), stderr: "The node specified via NodeAffinitySchedulingStrategy doesn't exist any more".into(), python: String::new(), ray: String::new() };
        let mut old_b = node("10.0.0.2", 2.0, 0.0);
        old_b.node_id = "0a52aaaa".into();
        old_b.rounds = vec![not_run.clone()];
        let mut new_b = node("10.0.0.2", 2.0, 0.0);
        new_b.node_id = "36c6bbbb".into();
        new_b.rounds = vec![answered.clone()];
        let mut gone_c = node("10.0.0.3", 2.0, 0.0);
        gone_c.rounds = vec![not_run];
        let probe = ClusterProbe { nodes: vec![old_b, new_b, gone_c], python: String::new(), ray: String::new(), gcs: String::new(), dashboard: String::new() };
        // Only the entry whose address answered through a newer node counts as replaced; a
        // node that is simply gone stays a failure.
        assert_eq!(replaced_nodes(&probe), vec!["0a52aaaa".to_string()]);
    }

    #[test]
    fn cuda_libraries_fail_when_the_engine_needs_one_and_warn_without_nccl() {
        let lib = |name: &str, required, error: Option<&str>| LibFact {
            lib: name.into(),
            required,
            path: error.is_none().then(|| format!("/opt/cuda/lib{name}.so")),
            error: error.map(str::to_string),
            fix: error.map(|_| format!("pip install {name}")),
        };
        let mut f = NodeFacts::empty("10.0.0.5".into());
        assert_eq!(cuda_libs(None, false, &f), None, "a CPU run needs none");
        assert_eq!(cuda_libs(None, true, &f).map(|c| c.status), Some(Status::Warn), "not looked for");
        f.gpu.libs = Some(vec![lib("cuBLASLt", true, None), lib("NVRTC", true, Some("libnvrtc.so.13 not found (looked in /x)")), lib("NCCL", false, Some("libnccl.so.2 not found (looked in /x)"))]);
        assert_eq!(cuda_libs(None, false, &f), None, "a CPU run needs none");
        let c = cuda_libs(Some("10.0.0.5"), true, &f).unwrap();
        assert_eq!((c.status, c.node.as_deref()), (Status::Fail, Some("10.0.0.5")));
        assert!(c.saw.starts_with("NVRTC (needed by the CUDA engine): libnvrtc.so.13 not found"), "{}", c.saw);
        assert_eq!(c.fix.as_deref(), Some("pip install NVRTC"));
        f.gpu.libs.as_mut().unwrap()[1] = lib("NVRTC", true, None);
        let c = cuda_libs(None, true, &f).unwrap();
        assert_eq!(c.status, Status::Warn);
        assert!(c.saw.contains("NCCL: libnccl.so.2 not found") && c.saw.contains("through the host"), "{}", c.saw);
        f.gpu.libs.as_mut().unwrap()[2] = lib("NCCL", false, None);
        let c = cuda_libs(None, true, &f).unwrap();
        assert_eq!(c.status, Status::Pass);
        assert_eq!(c.saw, "cuBLASLt /opt/cuda/libcuBLASLt.so, NVRTC /opt/cuda/libNVRTC.so, NCCL /opt/cuda/libNCCL.so");
    }

    #[test]
    fn placement_per_node() {
        let probe = ClusterProbe { nodes: vec![node("a", 8.0, 8.0), node("b", 8.0, 8.0)], python: String::new(), ray: String::new(), gcs: String::new(), dashboard: String::new() };
        let ok = Requirements { groups: vec![group("policy", 1, 8, 1.0), group("rollout", 1, 8, 1.0)], ..Default::default() };
        let placed = assign(&ok, &probe);
        let c = placement(&placed, &probe);
        assert_eq!(c.status, Status::Pass, "{c:?}");
        let placed = placed.unwrap();
        assert_eq!(placed.len(), 2, "one group per node: {placed:?}");
        // 16 GPUs in total, but no node has 9.
        let bad = Requirements { groups: vec![group("policy", 1, 9, 1.0)], ..Default::default() };
        let c = placement(&assign(&bad, &probe), &probe);
        assert_eq!(c.status, Status::Fail);
        assert!(c.saw.contains("cannot place worker group 'policy': it needs 1 node(s) with 9 CPU and 9 GPU"), "{}", c.saw);
        assert!(c.fix.unwrap().contains("cluster.actor.nnodes"));
    }
}
