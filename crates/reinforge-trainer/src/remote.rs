//! The Ray backend for worker groups (DESIGN.md §2): the controller places one worker group per
//! role (or per colocated set of roles) through Ray, then talks to its `reinforge worker` ranks
//! directly over TCP. Batches are split across a group's ranks and gathered in rank order;
//! data-parallel ranks all-reduce gradients among themselves; a separate rollout group gets the
//! actor's weights after every update.

use crate::config::TrainConfig;
use crate::error::TrainError;
use crate::multi_turn::{Agent, MultiTurnRollout};
use crate::roles::{
    rows_of, ActorGroup, ActorMiniBatch, CriticGroup, MicroBatching, MiniNorm, ModelState, PolicyGroup, RefGroup, Roles, RolloutGroup,
    SeqBatch,
};
use crate::worker::{unpack_tensors, Request, Response, RoleKind};
use reinforge_algos::Mat;
use reinforge_cluster::launch::{Event, GroupSpec, Launcher, LauncherHandle, Placement};
use reinforge_cluster::wire::{Beat, Conn, Hello};
use reinforge_engine::{Completion, SamplingParams};
use reinforge_metrics::Metrics;
use std::collections::BTreeMap;
use std::net::{TcpListener, TcpStream};
use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// One worker group to place and the roles its ranks host.
#[derive(Debug, Clone, PartialEq)]
pub struct PlannedGroup {
    /// Placement request.
    pub spec: GroupSpec,
    /// Roles hosted by every rank.
    pub roles: Vec<RoleKind>,
}

/// The worker groups a config asks for: `policy` (actor, plus whatever is colocated with it),
/// then `rollout`, `ref` and `critic` groups for roles that are not.
pub fn plan(cfg: &TrainConfig) -> Vec<PlannedGroup> {
    let c = &cfg.cluster;
    // One GPU per rank on a GPU; the emulator runs on CPUs.
    let gpus = if matches!(cfg.trainer.device.parse(), Ok(reinforge_engine::DeviceSpec::Cuda(_))) { 1.0 } else { 0.0 };
    let spec = |name: &str, p: &crate::config::RolePlacement| GroupSpec {
        name: name.into(),
        nnodes: p.nnodes,
        ranks_per_node: p.gpus_per_node,
        cpus_per_rank: c.cpus_per_rank,
        gpus_per_rank: gpus,
    };
    let mut policy = vec![RoleKind::Actor];
    let mut groups = Vec::new();
    if c.colocate_all {
        policy.push(RoleKind::Rollout);
    } else {
        groups.push(PlannedGroup { spec: spec("rollout", &c.rollout), roles: vec![RoleKind::Rollout] });
    }
    if cfg.ref_enabled() {
        if c.colocate_all || c.colocate_actor_ref {
            policy.push(RoleKind::Ref);
        } else {
            groups.push(PlannedGroup { spec: spec("ref", &c.reference), roles: vec![RoleKind::Ref] });
        }
    }
    let reward_model = cfg.reward_uses_model();
    if cfg.critic_enabled() {
        if c.colocate_all {
            policy.push(RoleKind::Critic);
        } else {
            let mut roles = vec![RoleKind::Critic];
            if reward_model && c.colocate_critic_reward {
                roles.push(RoleKind::Reward);
            }
            groups.push(PlannedGroup { spec: spec("critic", &c.critic), roles });
        }
    }
    if reward_model {
        if c.colocate_all {
            policy.push(RoleKind::Reward);
        } else if !(c.colocate_critic_reward && cfg.critic_enabled()) {
            groups.push(PlannedGroup { spec: spec("reward", &c.reward), roles: vec![RoleKind::Reward] });
        }
    }
    groups.insert(0, PlannedGroup { spec: spec("policy", &c.actor), roles: policy });
    groups
}

struct Rank {
    conn: Conn,
    at: Placement,
}

struct Group {
    name: String,
    ranks: Vec<Rank>,
}

/// Each rank's answer to one call, in rank order: the response and its binary payload.
type Answers = Vec<(Response, Vec<u8>)>;

/// Every connection of the run, shared by the role handles.
struct Cluster {
    groups: Vec<Group>,
    /// Why the run lost a rank, as the supervisor heard it from Ray.
    lost: Arc<Mutex<Option<String>>>,
    /// Set when the controller shuts the workers down itself.
    closing: Arc<AtomicBool>,
    _launcher: Option<LauncherHandle>,
}

/// Shared by every role handle (and the reward function, which must be `Send + Sync`).
type Shared = Arc<Mutex<Cluster>>;

fn lock(cl: &Shared) -> std::sync::MutexGuard<'_, Cluster> {
    // A panic while holding it leaves connections mid-message; nothing sensible continues.
    cl.lock().unwrap_or_else(|p| p.into_inner())
}

impl Cluster {
    fn group(&mut self, name: &str) -> Result<&mut Group, TrainError> {
        self.groups.iter_mut().find(|g| g.name == name).ok_or_else(|| TrainError::Other(format!("no worker group {name}")))
    }

    /// Sends one request per rank (`reqs[i]` to rank `i`, each with `payload`), then gathers the
    /// answers in rank order.
    fn call(&mut self, group: &str, reqs: Vec<Request>, payload: &[u8]) -> Result<Answers, TrainError> {
        Ok(self.call_groups(vec![(group, reqs)], payload)?.remove(0))
    }

    /// [`Cluster::call`] over several groups at once: every request is sent before any answer
    /// is awaited (a collective between groups, such as an NCCL broadcast from the actor to the
    /// rollout engines, needs all its ranks in it together).
    fn call_groups(&mut self, calls: Vec<(&str, Vec<Request>)>, payload: &[u8]) -> Result<Vec<Answers>, TrainError> {
        let lost = self.lost.clone();
        let fail = |group: &str, r: &Rank, e: String| {
            let why = lost.lock().ok().and_then(|l| l.clone());
            TrainError::LostWorker(match why {
                // The supervisor's line already names the rank and node.
                Some(w) => w,
                None => format!("lost worker {group}:{} on node {} ({e}); `reinforge cluster status` shows the nodes", r.at.rank, r.at.node_ip),
            })
        };
        let mut sent = Vec::with_capacity(calls.len());
        for (group, reqs) in calls {
            let n = reqs.len();
            let g = self.group(group)?;
            for (r, req) in g.ranks.iter_mut().zip(reqs) {
                r.conn.send(&req, payload).map_err(|e| fail(group, r, e.to_string()))?;
            }
            sent.push((group, n));
        }
        let mut out = Vec::with_capacity(sent.len());
        for (group, n) in sent {
            let g = self.group(group)?;
            let mut answers = Vec::with_capacity(n);
            for r in g.ranks.iter_mut().take(n) {
                let (resp, payload): (Response, Vec<u8>) = r.conn.recv().map_err(|e| fail(group, r, e.to_string()))?;
                if let Response::Error { message } = resp {
                    return Err(TrainError::Other(format!("worker {group}:{} on node {}: {message}", r.at.rank, r.at.node_ip)));
                }
                answers.push((resp, payload));
            }
            out.push(answers);
        }
        Ok(out)
    }

    /// The same request to every rank of `group`.
    fn each(&mut self, group: &str, mk: impl Fn() -> Request, payload: &[u8]) -> Result<Vec<(Response, Vec<u8>)>, TrainError> {
        let n = self.world(group);
        self.call(group, (0..n).map(|_| mk()).collect(), payload)
    }

    /// Splits items `0..n` into contiguous shares over the ranks of `group` (rank order = item
    /// order), sends `mk(share)` to each and returns the answers with their shares. Ranks with
    /// an empty share are skipped unless `every_rank` (a data-parallel step needs every rank in
    /// its all-reduce).
    fn scatter(
        &mut self,
        group: &str,
        n: usize,
        every_rank: bool,
        mut mk: impl FnMut(std::ops::Range<usize>) -> Request,
    ) -> Result<Vec<(std::ops::Range<usize>, Response)>, TrainError> {
        let parts: Vec<_> = shares(n, self.world(group)).into_iter().filter(|p| every_rank || !p.is_empty()).collect();
        let reqs = parts.iter().map(|p| mk(p.clone())).collect();
        Ok(parts.into_iter().zip(self.call(group, reqs, &[])?).map(|(p, (r, _))| (p, r)).collect())
    }

    fn world(&self, group: &str) -> usize {
        self.groups.iter().find(|g| g.name == group).map_or(0, |g| g.ranks.len())
    }
}

impl Drop for Cluster {
    fn drop(&mut self) {
        self.closing.store(true, Ordering::SeqCst);
        for g in &mut self.groups {
            for r in &mut g.ranks {
                let _ = r.conn.send(&Request::Shutdown, &[]);
            }
        }
    }
}

/// How the controller learns that a rank is gone, from Ray or from silence: the first reason
/// is kept for the error, and every connection is shut so no call waits forever.
struct Alarm {
    lost: Arc<Mutex<Option<String>>>,
    /// Set when the controller shuts the workers down itself: then nothing is an alarm.
    closing: Arc<AtomicBool>,
    sockets: Vec<TcpStream>,
}

impl Alarm {
    /// Records `why` and unblocks every call; `false` once the run is closing.
    fn raise(&self, why: String) -> bool {
        if self.closing.load(Ordering::SeqCst) {
            return false;
        }
        eprintln!("ray: {why}");
        if let Ok(mut l) = self.lost.lock() {
            l.get_or_insert(why);
        }
        for s in &self.sockets {
            let _ = s.shutdown(std::net::Shutdown::Both);
        }
        true
    }
}

/// What the ranks' heartbeats said last, where their stack dumps go, and how to ask for them.
struct Board {
    ranks: Mutex<BTreeMap<String, (String, Beat, Instant)>>,
    dump_dir: Mutex<Option<std::path::PathBuf>>,
    askers: Mutex<BTreeMap<String, Conn>>,
    /// The run directory's lease: stacks go into it only while this run owns it.
    fence: reinforge_lease::Fence,
}

/// The stall watchdog's handle on a cluster run's ranks.
struct Monitor {
    board: Arc<Board>,
    alarm: Arc<Alarm>,
}

impl crate::roles::RankMonitor for Monitor {
    fn ranks(&self) -> Vec<crate::roles::RankView> {
        let ranks = self.board.ranks.lock().map(|r| r.clone()).unwrap_or_default();
        ranks
            .into_iter()
            .map(|(rank, (node, beat, at))| crate::roles::RankView {
                rank,
                node,
                activity: beat.activity,
                activity_s: beat.activity_s + at.elapsed().as_secs_f64(),
                beat_age_s: at.elapsed().as_secs_f64(),
            })
            .collect()
    }

    fn request_stacks(&self, dir: &Path, reason: &str, which: &[String]) {
        if let Ok(mut d) = self.board.dump_dir.lock() {
            *d = Some(dir.to_path_buf());
        }
        if let Ok(mut askers) = self.board.askers.lock() {
            for w in which {
                if let Some(c) = askers.get_mut(w) {
                    let _ = c.send(&reinforge_cluster::wire::StackRequest { reason: reason.to_string() }, &[]);
                }
            }
        }
    }

    fn fail(&self, why: String) {
        self.alarm.raise(why);
    }
}

/// Reads one rank's heartbeats in a thread of its own; silence for `timeout`, or a closed
/// connection, raises the alarm naming the rank and its node. Each beat's activity goes on the
/// board, and stacks it carries go to the board's dump directory.
fn watch_heartbeats(mut conn: Conn, who: String, node_ip: String, timeout: Duration, alarm: Arc<Alarm>, board: Arc<Board>) {
    let stream = conn.try_clone_stream().ok();
    if let Some(s) = &stream {
        let _ = s.set_read_timeout(Some(timeout));
        if let (Ok(w), Ok(mut askers)) = (s.try_clone(), board.askers.lock()) {
            askers.insert(who.clone(), Conn::new(w));
        }
    }
    // The silence allowed for the next beat: longer from a rank's notice that gdb is about to
    // stop it for its stacks until the beat that carries them.
    let allow = move |d: Duration| {
        if let Some(s) = &stream {
            let _ = s.set_read_timeout(Some(d));
        }
    };
    std::thread::spawn(move || loop {
        let t = Instant::now();
        match conn.recv::<Beat>() {
            Ok((mut beat, _)) => {
                if let Some(pause) = beat.pause_s.filter(|p| p.is_finite() && *p > 0.0) {
                    allow(timeout + Duration::from_secs_f64(pause));
                }
                if let Some(text) = beat.stacks.take() {
                    allow(timeout);
                    let dir = board.dump_dir.lock().ok().and_then(|d| d.clone());
                    if let Some(dir) = dir {
                        let path = dir.join(format!("{}.txt", who.replace(':', "-")));
                        // Whole (the stall report waits for these files to appear), and only
                        // while this run owns the directory.
                        match board.fence.publish(&path, text.as_bytes()) {
                            Ok(()) => eprintln!("stall: stacks of {who} on node {node_ip} in {}", path.display()),
                            Err(e) => eprintln!("stall: cannot write {}: {e}", path.display()),
                        }
                    }
                }
                if let Ok(mut r) = board.ranks.lock() {
                    r.insert(who.clone(), (node_ip.clone(), beat, Instant::now()));
                }
                continue;
            }
            Err(e) => {
                let why = if t.elapsed() >= timeout {
                    format!(
                        "lost worker {who} on node {node_ip}: no heartbeat for {:.1}s (a network cut, or the node or its process froze; cluster.heartbeat_timeout_s)",
                        t.elapsed().as_secs_f64()
                    )
                } else {
                    format!("lost worker {who} on node {node_ip}: its heartbeat connection closed ({e})")
                };
                alarm.raise(why);
                return;
            }
        }
    });
}

/// Contiguous, near-equal shares of `0..n` over `world` ranks (rank order = batch order).
fn shares(n: usize, world: usize) -> Vec<std::ops::Range<usize>> {
    let base = n / world.max(1);
    let extra = n % world.max(1);
    let mut start = 0;
    (0..world)
        .map(|r| {
            let len = base + usize::from(r < extra);
            let range = start..start + len;
            start += len;
            range
        })
        .collect()
}

fn expect_mat(resp: Response) -> Result<Mat, TrainError> {
    match resp {
        Response::Mat { mat } => Ok(mat),
        other => Err(TrainError::Other(format!("worker answered {other:?} to a log-prob/value request"))),
    }
}

fn stack(parts: Vec<Mat>, cols: usize) -> Result<Mat, TrainError> {
    let rows = parts.iter().map(Mat::rows).sum();
    let data = parts.into_iter().flat_map(|m| m.data().to_vec()).collect();
    Ok(Mat::new(rows, cols, data)?)
}

/// Splits rows of `batch` across a group and gathers `[N, R]` answers.
fn per_row_call(cl: &Shared, group: &str, batch: &SeqBatch, mk: impl Fn(SeqBatch) -> Request) -> Result<Mat, TrainError> {
    let answers = lock(cl).scatter(group, batch.len(), false, |p| mk(batch.select(&p.collect::<Vec<_>>())))?;
    let mats = answers.into_iter().map(|(_, r)| expect_mat(r)).collect::<Result<Vec<_>, _>>()?;
    stack(mats, batch.response_len)
}

/// One data-parallel optimizer step over `rows`, each rank sent `mk(its rows)`: the metrics
/// of all ranks merged.
fn dp_update(cl: &Shared, group: &str, rows: &[usize], mk: impl Fn(&[usize]) -> Request) -> Result<Metrics, TrainError> {
    let answers = lock(cl).scatter(group, rows.len(), true, |p| mk(&rows[p]))?;
    let parts = answers.into_iter().map(|(_, r)| expect_metrics(r)).collect::<Result<Vec<_>, _>>()?;
    Ok(merge_rank_metrics(parts))
}

/// Sums per-rank update metrics: losses and fractions are already shares of the whole
/// mini-batch; the gradient norm and learning rate are the same on every rank.
fn merge_rank_metrics(parts: Vec<Vec<(String, f64)>>) -> Metrics {
    let mut m = Metrics::new();
    for (i, part) in parts.into_iter().enumerate() {
        for (k, v) in part {
            if k.ends_with("grad_norm") || k.ends_with("/lr") {
                if i == 0 {
                    m.insert(k, v);
                }
            } else {
                m.accumulate(&k, v);
            }
        }
    }
    m
}

fn expect_metrics(resp: Response) -> Result<Vec<(String, f64)>, TrainError> {
    match resp {
        Response::Metrics { metrics } => Ok(metrics),
        other => Err(TrainError::Other(format!("worker answered {other:?} to an update"))),
    }
}

fn fetch_state(cl: &Shared, group: &str, role: RoleKind) -> Result<ModelState, TrainError> {
    let mut c = lock(cl);
    let (resp, bytes) = c.call(group, vec![Request::State { role }], &[])?.remove(0);
    match resp {
        Response::Tensors { names, config_json, optimizer_len, lora } => {
            let (tensors, rest) = unpack_tensors(&names, &bytes)?;
            if rest.len() != optimizer_len {
                return Err(TrainError::Other(format!("{group}: optimizer state is {} bytes, expected {optimizer_len}", rest.len())));
            }
            let optimizer = reinforge_engine::OptimizerState::read(rest, std::path::Path::new(&format!("{group}: optimizer state")))?;
            Ok(ModelState { tensors, config_json, optimizer, lora })
        }
        other => Err(TrainError::Other(format!("worker answered {other:?} to a state request"))),
    }
}

/// Actor ranks (data parallel) plus rollout engines (their own group, or the actor's ranks).
struct RemotePolicy {
    cl: Shared,
    /// `None`: the actor's ranks generate with their own weights (hybrid engine).
    rollout_group: Option<String>,
    /// How weights reach that group (settled at the first sync).
    weight_sync: WeightSync,
}

/// How the actor's weights reach rollout engines on other ranks.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum WeightSync {
    /// Not settled yet.
    Undecided,
    /// NCCL broadcast from actor rank 0's GPU to the engines' GPUs.
    Nccl,
    /// Through the controller, as f32 tensors.
    Host,
}

impl RemotePolicy {
    /// Settles [`WeightSync`]: NCCL when actor rank 0 and every engine hold their weights on a
    /// GPU with NCCL (`cluster.gpu_collectives = "nccl"`) in one flat buffer of the same size;
    /// then every one of them joins the communicator, actor rank 0 as its rank 0.
    fn settle_weight_sync(c: &mut Cluster, group: &str) -> Result<WeightSync, TrainError> {
        let engines = c.world(group);
        let answers = c.call_groups(vec![("policy", vec![Request::NcclId { make: true }]), (group, (0..engines).map(|_| Request::NcclId { make: false }).collect())], &[])?;
        let mut id = None;
        let mut sizes = Vec::new();
        for (resp, _) in answers.into_iter().flatten() {
            let Response::NcclId { id: made, elems } = resp else {
                return Err(TrainError::Other(format!("a worker answered {resp:?} to NcclId")));
            };
            id = id.or(made);
            sizes.push(elems);
        }
        let Some(id) = id.filter(|_| sizes.iter().all(|s| s.is_some() && *s == sizes[0])) else {
            return Ok(WeightSync::Host);
        };
        let elems = sizes[0].unwrap_or(0);
        let world = 1 + engines;
        let join = |rank: usize| Request::WeightCommJoin { id: id.clone(), rank, world, elems };
        c.call_groups(vec![("policy", vec![join(0)]), (group, (0..engines).map(|i| join(1 + i)).collect())], &[])?;
        eprintln!("weights reach the {engines} rollout engine(s) by NCCL broadcast");
        Ok(WeightSync::Nccl)
    }
}

impl RolloutGroup for RemotePolicy {
    fn generate(&mut self, prompts: &[Vec<u32>], params: &SamplingParams) -> Result<Vec<Completion>, TrainError> {
        let group = self.rollout_group.clone().unwrap_or_else(|| "policy".into());
        let answers = lock(&self.cl).scatter(&group, prompts.len(), false, |p| Request::Generate {
            // Per-prompt settings travel with their prompts.
            params: SamplingParams {
                first_prompt: params.first_prompt + p.start,
                prompt_keys: params.prompt_keys.get(p.clone()).map(<[_]>::to_vec).unwrap_or_default(),
                max_new_tokens_per_prompt: params.max_new_tokens_per_prompt.get(p.clone()).map(<[_]>::to_vec).unwrap_or_default(),
                ..params.clone()
            },
            prompts: prompts[p].to_vec(),
            agent: None,
            agent_kwargs: Vec::new(),
        })?;
        let mut out = Vec::with_capacity(prompts.len() * params.n);
        for (p, resp) in answers {
            match resp {
                Response::Completions { completions } => {
                    out.extend(completions.into_iter().map(|mut x| {
                        x.prompt_index += p.start;
                        x
                    }));
                }
                other => return Err(TrainError::Other(format!("worker answered {other:?} to generate"))),
            }
        }
        Ok(out)
    }

    /// Each rollout rank runs the turns of its share itself, calling the tool servers (the
    /// retrieval server at its URL) from its own node (the node-local server on a cluster).
    fn generate_turns(&mut self, prompts: &[Vec<u32>], agent_kwargs: &[serde_json::Value], params: &SamplingParams, agent: &Agent) -> Result<MultiTurnRollout, TrainError> {
        let group = self.rollout_group.clone().unwrap_or_else(|| "policy".into());
        let settings = agent.settings();
        let answers = lock(&self.cl).scatter(&group, prompts.len(), false, |p| Request::Generate {
            params: SamplingParams { first_prompt: params.first_prompt + p.start, ..params.clone() },
            prompts: prompts[p.clone()].to_vec(),
            agent: Some(settings.clone()),
            agent_kwargs: agent_kwargs.get(p).map(<[_]>::to_vec).unwrap_or_default(),
        })?;
        let mut out = MultiTurnRollout::default();
        for (p, resp) in answers {
            match resp {
                Response::Trajectories { rollout } => out.extend(rollout, p.start),
                other => return Err(TrainError::Other(format!("worker answered {other:?} to a multi-turn generate"))),
            }
        }
        Ok(out)
    }
}

impl ActorGroup for RemotePolicy {
    fn logprobs(&mut self, batch: &SeqBatch, micro: MicroBatching) -> Result<Mat, TrainError> {
        per_row_call(&self.cl, "policy", batch, |b| Request::LogProbs { role: RoleKind::Actor, batch: b, micro })
    }

    fn update(&mut self, batch: &SeqBatch, mini: &ActorMiniBatch<'_>, lr: f64) -> Result<Metrics, TrainError> {
        let norm = mini.norm.unwrap_or_else(|| MiniNorm::of(&batch.response_mask, mini.rows));
        dp_update(&self.cl, "policy", mini.rows, |rows| Request::ActorUpdate {
            batch: batch.select(rows),
            old_log_probs: mini.old_log_probs.map(|o| rows_of(o, rows)),
            advantages: rows_of(mini.advantages, rows),
            ref_log_probs: mini.ref_log_probs.map(|r| rows_of(r, rows)),
            norm,
            lr,
        })
    }
}

impl PolicyGroup for RemotePolicy {
    fn sync_rollout(&mut self) -> Result<(), TrainError> {
        let mut c = lock(&self.cl);
        // The actor ranks' own no-autodiff view (used for log-probs, and for generation when
        // colocated) is a pointer swap.
        c.each("policy", || Request::SyncLocal, &[])?;
        match &self.rollout_group {
            None => {}
            Some(g) => {
                if self.weight_sync == WeightSync::Undecided {
                    self.weight_sync = Self::settle_weight_sync(&mut c, g)?;
                }
                // Every actor rank holds the same weights after the all-reduced step: rank 0's
                // copy goes to every engine.
                if self.weight_sync == WeightSync::Nccl {
                    let engines = c.world(g);
                    c.call_groups(vec![("policy", vec![Request::BroadcastWeights]), (g, (0..engines).map(|_| Request::BroadcastWeights).collect())], &[])?;
                    return Ok(());
                }
                let (resp, bytes) = c.call("policy", vec![Request::GetWeights], &[])?.remove(0);
                let Response::Tensors { names, .. } = resp else {
                    return Err(TrainError::Other("actor rank 0 did not send weights".into()));
                };
                c.each(g, || Request::SetWeights { names: names.clone() }, &bytes)?;
            }
        }
        Ok(())
    }

    fn state(&mut self) -> Result<ModelState, TrainError> {
        fetch_state(&self.cl, "policy", RoleKind::Actor)
    }
}

struct RemoteRef {
    cl: Shared,
    group: String,
}

impl RefGroup for RemoteRef {
    fn logprobs(&mut self, batch: &SeqBatch, micro: MicroBatching) -> Result<Mat, TrainError> {
        per_row_call(&self.cl, &self.group, batch, |b| Request::LogProbs { role: RoleKind::Ref, batch: b, micro })
    }
}

struct RemoteCritic {
    cl: Shared,
    group: String,
}

impl CriticGroup for RemoteCritic {
    fn values(&mut self, batch: &SeqBatch, micro: MicroBatching) -> Result<Mat, TrainError> {
        per_row_call(&self.cl, &self.group, batch, |b| Request::Values { batch: b, micro })
    }

    fn update(&mut self, batch: &SeqBatch, rows: &[usize], values: &Mat, returns: &Mat, lr: f64, norm: Option<MiniNorm>) -> Result<Metrics, TrainError> {
        let norm = norm.unwrap_or_else(|| MiniNorm::of(&batch.response_mask, rows));
        dp_update(&self.cl, &self.group, rows, |r| Request::CriticUpdate {
            batch: batch.select(r),
            values: rows_of(values, r),
            returns: rows_of(returns, r),
            norm,
            lr,
        })
    }

    fn state(&mut self) -> Result<ModelState, TrainError> {
        fetch_state(&self.cl, &self.group, RoleKind::Critic)
    }
}

/// A reward function whose model runs on worker ranks: inputs split in order across them.
struct RemoteReward {
    cl: Shared,
    group: String,
}

impl reinforge_reward::RewardFn for RemoteReward {
    fn name(&self) -> &str {
        "remote_ranks"
    }

    fn score(&self, sample: &reinforge_reward::RewardInput) -> Result<reinforge_reward::RewardOutput, reinforge_reward::RewardError> {
        let mut out = self.score_batch(std::slice::from_ref(sample))?;
        out.pop().ok_or_else(|| reinforge_reward::RewardError::config("reward", "no score came back"))
    }

    fn score_batch(&self, samples: &[reinforge_reward::RewardInput]) -> Result<Vec<reinforge_reward::RewardOutput>, reinforge_reward::RewardError> {
        let err = |e: String| reinforge_reward::RewardError::config("reward", e);
        let answers =
            lock(&self.cl).scatter(&self.group, samples.len(), false, |p| Request::Score { inputs: samples[p].to_vec() }).map_err(|e| err(e.to_string()))?;
        let mut out = Vec::with_capacity(samples.len());
        for (_, resp) in answers {
            match resp {
                Response::Scores { outputs } => out.extend(outputs),
                other => return Err(err(format!("worker answered {other:?} to a score request"))),
            }
        }
        Ok(out)
    }
}

/// Where every rank landed, as written to `<out_dir>/placement.json`.
pub fn placement_report(placements: &[Placement], plan: &[PlannedGroup]) -> serde_json::Value {
    let groups: Vec<_> = plan
        .iter()
        .map(|g| {
            let ranks: Vec<_> = placements
                .iter()
                .filter(|p| p.group == g.spec.name)
                .map(|p| serde_json::json!({"rank": p.rank, "node_ip": p.node_ip, "node_id": p.node_id, "pid": p.pid}))
                .collect();
            serde_json::json!({"group": g.spec.name, "roles": g.roles, "ranks": ranks})
        })
        .collect();
    serde_json::json!({ "groups": groups })
}

/// The config the workers load: model paths made absolute so a rank's working directory does
/// not matter (named models resolve through each node's REINFORGE_HOME).
fn worker_config(cfg: &TrainConfig) -> TrainConfig {
    let mut c = cfg.clone();
    fn abs(s: &str) -> String {
        let p = Path::new(s);
        if p.exists() {
            std::fs::canonicalize(p).map(|x| x.display().to_string()).unwrap_or_else(|_| s.to_string())
        } else {
            s.to_string()
        }
    }
    c.actor.model = abs(&c.actor.model);
    c.critic.model = c.critic.model.as_deref().map(abs);
    // The tool agent's settings (its YAML files read) travel with each multi-turn request: a
    // worker on another node needs neither the files nor to read them when it checks the config.
    c.tools.calls = Default::default();
    c
}

/// Fails in seconds, not after Ray's own reconnect timeouts, when `HOST:PORT` does not answer.
fn probe_head(address: &str) -> Result<(), TrainError> {
    use std::net::ToSocketAddrs;
    if address == "auto" {
        return Ok(());
    }
    let bad = |why: String| {
        TrainError::Other(format!(
            "no Ray head answers at {address} ({why}): start one with `reinforge cluster start --head`, or fix cluster.address / --ray (HEAD:6379, or auto on a cluster node)"
        ))
    };
    let sa = address.to_socket_addrs().map_err(|e| bad(e.to_string()))?.next().ok_or_else(|| bad("does not resolve".into()))?;
    TcpStream::connect_timeout(&sa, Duration::from_secs(5)).map_err(|e| bad(e.to_string()))?;
    Ok(())
}

/// The fast part of `reinforge doctor`, on every node, before anything is placed: a failure
/// stops the run with the checks that failed; warnings are printed and the run goes on.
fn preflight(cfg: &TrainConfig, launcher: &mut Launcher, listener: &TcpListener, bin: &Path) -> Result<(), TrainError> {
    use reinforge_cluster::doctor::{self, Status};
    let t = Instant::now();
    let req = crate::preflight::requirements(cfg);
    let checks = doctor::cluster(&req, launcher, listener, bin, doctor::PROBE_TIMEOUT).map_err(|e| TrainError::Other(format!("preflight: {e}")))?;
    let fails: Vec<&doctor::Check> = checks.iter().filter(|c| c.status == Status::Fail).collect();
    for c in checks.iter().filter(|c| c.status == Status::Warn) {
        eprintln!("preflight: warning: {}", c.line());
    }
    eprintln!("preflight: {} checks in {:.1}s, {} failed", checks.len(), t.elapsed().as_secs_f64(), fails.len());
    let Some(first) = fails.first() else { return Ok(()) };
    let more = match fails.len() {
        1 => String::new(),
        n => format!(" (and {} more: {})", n - 1, fails[1..].iter().map(|c| c.line()).collect::<Vec<_>>().join(" | ")),
    };
    let msg = format!("preflight failed: {}{more}; `reinforge doctor` shows every check, trainer.preflight=false skips them", first.line());
    // A cluster short of nodes, or listing a node that died and is not yet declared dead, may
    // still become right: a restart after a loss waits for that (a first start does not).
    if fails.iter().all(|c| c.name == "placement" || c.name == "probe") {
        Err(TrainError::Unplaceable(msg))
    } else {
        Err(TrainError::Other(msg))
    }
}

/// Places the worker groups on Ray and connects to every rank.
pub fn ray_roles(cfg: &TrainConfig, resume: Option<&Path>, fence: &reinforge_lease::Fence) -> Result<Roles, TrainError> {
    let t0 = Instant::now();
    let other = |e: String| TrainError::Other(e);
    let ray = reinforge_cluster::ray::RayInstall::locate().map_err(|e| other(e.to_string()))?;
    probe_head(&cfg.cluster.address)?;
    let listener = TcpListener::bind(("0.0.0.0", cfg.cluster.controller_port)).map_err(|e| {
        other(format!(
            "controller: cannot listen for workers on port {} ({e}): choose a free port with cluster.controller_port (0 = any)",
            cfg.cluster.controller_port
        ))
    })?;
    let port = listener.local_addr().map_err(|e| other(e.to_string()))?.port();
    let secret = format!("{:032x}", rand::random::<u128>());
    let plan = plan(cfg);
    eprintln!("ray: connecting to {} ...", cfg.cluster.address);
    let launcher_env = reinforge_cluster::launch::client_env();
    let mut launcher = Launcher::start(&ray.python, &cfg.cluster.address, &launcher_env, Duration::from_secs(60))
        .map_err(|e| match e {
            reinforge_cluster::launch::LaunchError::Reported(m) => other(m),
            e => other(format!("connecting to the Ray cluster at {}: {e}", cfg.cluster.address)),
        })?;
    eprintln!("ray: connected in {:.1}s; cluster: {}", t0.elapsed().as_secs_f64(), launcher.cluster);
    let controller = format!("{}:{port}", launcher.driver_ip);
    let bin = reinforge_cluster::launch::worker_binary().map_err(|e| other(e.to_string()))?;
    if cfg.trainer.preflight {
        preflight(cfg, &mut launcher, &listener, &bin)?;
    }
    let worker_cmd = vec![bin.display().to_string(), "worker".to_string()];
    let mut env = BTreeMap::new();
    env.insert("REINFORGE_CONTROLLER".to_string(), controller.clone());
    env.insert("REINFORGE_SECRET".to_string(), secret.clone());
    env.insert("REINFORGE_HEARTBEAT_INTERVAL_S".to_string(), cfg.cluster.heartbeat_interval_s.to_string());
    // Ray starts workers with the raylet's environment, not ours: models named by Hub id must
    // be looked up in the Hub cache this run was given (a shared HF_HOME, typically).
    for k in ["REINFORGE_HOME", "REINFORGE_LOG", "RUST_BACKTRACE", "HF_HUB_CACHE", "HUGGINGFACE_HUB_CACHE", "HF_HOME", "XDG_CACHE_HOME"] {
        if let Ok(v) = std::env::var(k) {
            env.insert(k.to_string(), v);
        }
    }
    let specs: Vec<GroupSpec> = plan.iter().map(|g| g.spec.clone()).collect();
    launcher
        .place(&specs, &worker_cmd, &env, Duration::from_secs(cfg.cluster.placement_timeout_s))
        .map_err(|e| other(e.to_string()))?;
    let total: usize = specs.iter().map(GroupSpec::world).sum();
    let deadline = Instant::now() + Duration::from_secs(cfg.cluster.placement_timeout_s + 60);
    let mut placements = Vec::new();
    loop {
        let ev = launcher.next_event(deadline.saturating_duration_since(Instant::now())).map_err(|e| other(format!("placing workers: {e}")))?;
        match ev {
            Event::Placed(p) => {
                eprintln!("ray: {}:{} on node {} (pid {})", p.group, p.rank, p.node_ip, p.pid);
                placements.push(p);
            }
            Event::Ready => break,
            Event::Error(m) => return Err(TrainError::Unplaceable(m)),
            Event::Lost { group, rank, node_ip, message } => {
                return Err(TrainError::Unplaceable(format!("worker {group}:{rank} on node {node_ip} died while starting: {message}")))
            }
            Event::Exited { group, rank, node_ip, code } => {
                return Err(other(format!("worker {group}:{rank} on node {node_ip} exited with code {code} while starting (its log is above)")))
            }
            Event::Ended(code) => return Err(other(format!("the Ray launcher exited (code {code:?}) while placing workers"))),
            Event::Driver { .. } | Event::Probed(_) | Event::Services(_) => {}
        }
    }
    let (events, handle) = launcher.into_parts();

    // Every rank dials back twice (requests, heartbeats); match them to their placement by
    // (group, rank).
    listener.set_nonblocking(true).map_err(|e| other(e.to_string()))?;
    let mut conns: BTreeMap<(String, usize), Conn> = BTreeMap::new();
    let mut beats: BTreeMap<(String, usize), Conn> = BTreeMap::new();
    let deadline = Instant::now() + Duration::from_secs(cfg.cluster.startup_timeout_s);
    while conns.len() < total || beats.len() < total {
        match listener.accept() {
            Ok((s, _)) => {
                s.set_nonblocking(false).map_err(|e| other(e.to_string()))?;
                let mut c = Conn::new(s);
                match c.recv::<Hello>() {
                    Ok((h, _)) if h.secret == secret => {
                        let to = if h.heartbeat { &mut beats } else { &mut conns };
                        to.insert((h.group, h.rank), c);
                    }
                    _ => tracing::warn!(peer = c.peer(), "controller: refused a connection without this run's secret"),
                }
            }
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                if let Ok(ev) = events.try_recv() {
                    if let Event::Exited { group, rank, node_ip, code } = &ev {
                        return Err(other(format!("worker {group}:{rank} on node {node_ip} exited with code {code} before connecting (its log is above)")));
                    }
                    if let Event::Lost { group, rank, node_ip, message } = &ev {
                        return Err(other(format!("worker {group}:{rank} on node {node_ip} was lost before connecting: {message}")));
                    }
                }
                if Instant::now() > deadline {
                    return Err(other(format!(
                        "only {}/{total} workers connected to the controller at {controller} within {}s: check that every node can reach it (firewall, interface) and see the worker logs above",
                        conns.len(),
                        cfg.cluster.startup_timeout_s
                    )));
                }
                std::thread::sleep(Duration::from_millis(20));
            }
            Err(e) => return Err(other(format!("controller: accept failed: {e}"))),
        }
    }
    let mut groups = Vec::new();
    let mut sockets: Vec<TcpStream> = Vec::new();
    for g in &plan {
        let mut ranks = Vec::new();
        for r in 0..g.spec.world() {
            let conn = conns.remove(&(g.spec.name.clone(), r)).ok_or_else(|| other(format!("worker {}:{r} never connected", g.spec.name)))?;
            let at = placements.iter().find(|p| p.group == g.spec.name && p.rank == r).cloned().ok_or_else(|| other(format!("no placement for {}:{r}", g.spec.name)))?;
            if let Ok(s) = conn.try_clone_stream() {
                sockets.push(s);
            }
            ranks.push(Rank { conn, at });
        }
        groups.push(Group { name: g.spec.name.clone(), ranks });
    }

    // Supervise: when Ray reports a lost rank, or a rank's heartbeats stop, remember why and
    // unblock every pending call.
    let lost = Arc::new(Mutex::new(None));
    let closing = Arc::new(AtomicBool::new(false));
    let alarm = Arc::new(Alarm { lost: lost.clone(), closing: closing.clone(), sockets });
    {
        let alarm = alarm.clone();
        std::thread::spawn(move || {
            for ev in events {
                let why = match ev {
                    Event::Lost { group, rank, node_ip, message } => format!("Ray lost worker {group}:{rank} on node {node_ip}: {message}"),
                    Event::Exited { group, rank, node_ip, code } => format!("worker {group}:{rank} on node {node_ip} exited with code {code}"),
                    Event::Ended(code) => format!("the Ray launcher exited (code {code:?})"),
                    _ => continue,
                };
                if !alarm.raise(why) {
                    break;
                }
            }
        });
    }
    let timeout = Duration::from_secs_f64(cfg.cluster.heartbeat_timeout_s);
    let board = Arc::new(Board { ranks: Mutex::default(), dump_dir: Mutex::default(), askers: Mutex::default(), fence: fence.clone() });
    for ((group, rank), conn) in beats {
        let node_ip = placements.iter().find(|p| p.group == group && p.rank == rank).map_or("?".into(), |p| p.node_ip.clone());
        watch_heartbeats(conn, format!("{group}:{rank}"), node_ip, timeout, alarm.clone(), board.clone());
    }
    let monitor = Arc::new(Monitor { board, alarm: alarm.clone() });
    let report = placement_report(&placements, &plan);
    let out = cfg.out_dir();
    std::fs::create_dir_all(&out).map_err(|e| other(format!("{}: {e}", out.display())))?;
    fence.publish(&out.join("placement.json"), &serde_json::to_vec_pretty(&report).unwrap_or_default())?;
    let cl: Shared = Arc::new(Mutex::new(Cluster { groups, lost, closing, _launcher: Some(handle) }));

    // Load models everywhere, then form the data-parallel groups.
    let wcfg = worker_config(cfg).to_toml();
    let resume = match resume {
        Some(p) => Some(std::fs::canonicalize(p).map_err(|e| other(format!("{}: {e}", p.display())))?),
        None => None,
    };
    for g in &plan {
        let n = g.spec.world();
        lock(&cl).each(&g.spec.name, || Request::Load { config: wcfg.clone(), roles: g.roles.clone(), resume: resume.clone() }, &[])?;
        let trains = g.roles.contains(&RoleKind::Actor) || g.roles.contains(&RoleKind::Critic);
        if trains && n > 1 {
            let mut c = lock(&cl);
            let addr = match c.call(&g.spec.name, vec![Request::CollectiveRoot], &[])?.remove(0).0 {
                Response::Addr { addr } => addr,
                other_resp => return Err(other(format!("rank 0 answered {other_resp:?} to CollectiveRoot"))),
            };
            c.each(&g.spec.name, || Request::CollectiveJoin { addr: addr.clone(), world: n }, &[])?;
        }
    }
    eprintln!("ray: {total} workers ready in {:.1}s (placement in {})", t0.elapsed().as_secs_f64(), out.join("placement.json").display());

    let has = |k: RoleKind| plan.iter().find(|g| g.roles.contains(&k)).map(|g| g.spec.name.clone());
    let rollout_group = has(RoleKind::Rollout).filter(|g| g != "policy");
    let mut policy = RemotePolicy { cl: cl.clone(), rollout_group, weight_sync: WeightSync::Undecided };
    // Engines start from the same weights as the actor, whatever they loaded.
    policy.sync_rollout()?;
    let reference: Option<Box<dyn RefGroup>> = has(RoleKind::Ref).map(|g| Box::new(RemoteRef { cl: cl.clone(), group: g }) as Box<dyn RefGroup>);
    let critic: Option<Box<dyn CriticGroup>> =
        has(RoleKind::Critic).map(|g| Box::new(RemoteCritic { cl: cl.clone(), group: g }) as Box<dyn CriticGroup>);
    let reward: Option<Box<dyn reinforge_reward::RewardFn>> =
        has(RoleKind::Reward).map(|g| Box::new(RemoteReward { cl: cl.clone(), group: g }) as Box<dyn reinforge_reward::RewardFn>);
    Ok(Roles { policy: Box::new(policy), reference, critic, reward, _keep: Some(Box::new(cl)), monitor: Some(monitor) })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shares_are_contiguous_and_cover_everything() {
        assert_eq!(shares(8, 2), vec![0..4, 4..8]);
        assert_eq!(shares(5, 2), vec![0..3, 3..5]);
        assert_eq!(shares(1, 3), vec![0..1, 1..1, 1..1]);
    }

    #[test]
    fn plan_follows_colocation_options() {
        let mut cfg = TrainConfig::default();
        cfg.cluster.backend = "ray".into();
        cfg.actor.use_kl_loss = true;
        let names: Vec<_> = plan(&cfg).iter().map(|g| (g.spec.name.clone(), g.roles.clone())).collect();
        assert_eq!(names[0], ("policy".into(), vec![RoleKind::Actor]));
        assert!(names.iter().any(|(n, _)| n == "rollout"));
        cfg.cluster.colocate_actor_ref = true;
        let p = plan(&cfg);
        assert_eq!(p[0].roles, vec![RoleKind::Actor, RoleKind::Ref]);
        cfg.cluster.colocate_all = true;
        let p = plan(&cfg);
        assert_eq!(p.len(), 1);
        assert_eq!(p[0].roles, vec![RoleKind::Actor, RoleKind::Rollout, RoleKind::Ref]);
    }

    #[test]
    fn rank_metrics_sum_except_norm_and_lr() {
        let m = merge_rank_metrics(vec![
            vec![("actor/pg_loss".into(), 0.25), ("actor/grad_norm".into(), 2.0), ("actor/lr".into(), 0.1)],
            vec![("actor/pg_loss".into(), 0.5), ("actor/grad_norm".into(), 2.0), ("actor/lr".into(), 0.1)],
        ]);
        assert_eq!(m.get("actor/pg_loss"), Some(0.75));
        assert_eq!(m.get("actor/grad_norm"), Some(2.0));
        assert_eq!(m.get("actor/lr"), Some(0.1));
    }
}
