//! `reinforge worker`: one rank of a worker group on a cluster node.
//!
//! Ray starts it (through the launcher's actor) with its group, rank and the controller's
//! address in the environment; it dials the controller, loads the roles it is told to host
//! (built by [`crate::build`], the same code the single-process run uses) and answers requests
//! until the controller says stop or goes away. Data-parallel ranks all-reduce gradients among
//! themselves ([`reinforge_cluster::collective`]); nothing goes through Ray.

use crate::build;
use crate::config::TrainConfig;
use crate::error::TrainError;
use crate::roles::{ActorGroup, ActorMiniBatch, HostedCritic, HostedPolicy, MicroBatching, MiniNorm, RefGroup, RolloutEngine, SeqBatch};
use crate::multi_turn::{Agent, AgentSettings, MultiTurnRollout};
use reinforge_algos::Mat;
use reinforge_cluster::collective::{RootListener, StarGroup};
use reinforge_cluster::activity;
use reinforge_cluster::wire::{bytes_f32, f32_bytes, Beat, Conn, Hello, StackRequest};
use reinforge_engine::{Completion, DeviceSpec, HostTensor, SamplingParams};
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// A role a rank can host.
#[derive(Debug, Clone, Copy, Serialize, Deserialize, PartialEq, Eq, PartialOrd, Ord)]
#[serde(rename_all = "snake_case")]
pub enum RoleKind {
    /// The trained policy.
    Actor,
    /// Generation (shares the actor's weights when both are in one process).
    Rollout,
    /// The frozen reference.
    Ref,
    /// The value model.
    Critic,
    /// The reward function (when it uses a model).
    Reward,
}

/// A controller → worker request.
#[derive(Debug, Serialize, Deserialize)]
#[serde(tag = "op", rename_all = "snake_case")]
pub enum Request {
    /// Build the roles from the resolved config.
    Load {
        /// The resolved config as TOML.
        config: String,
        /// Roles this rank hosts.
        roles: Vec<RoleKind>,
        /// Checkpoint to resume from (a path every node can read).
        resume: Option<PathBuf>,
    },
    /// Rank 0: open the group's collective listener and say where it is.
    CollectiveRoot,
    /// Form the data-parallel group (rank 0 accepts, the others connect).
    CollectiveJoin {
        /// Rank 0's listener.
        addr: String,
        /// Ranks in the group.
        world: usize,
    },
    /// Generate completions.
    Generate {
        /// Prompt token ids.
        prompts: Vec<Vec<u32>>,
        /// Sampling settings (with `first_prompt` set to this share's offset).
        params: SamplingParams,
        /// Multi-turn rollouts with this loop, run here against this node's tool servers (the
        /// answer is then [`Response::Trajectories`]).
        #[serde(default)]
        agent: Option<AgentSettings>,
        /// Per prompt, its `tools_kwargs` and `interaction_kwargs` (tool-calling rollouts).
        #[serde(default)]
        agent_kwargs: Vec<serde_json::Value>,
    },
    /// Per-token log-probs under the actor or the reference.
    LogProbs {
        /// Actor or Ref.
        role: RoleKind,
        /// The sequences.
        batch: SeqBatch,
        /// How they form forward passes.
        micro: MicroBatching,
    },
    /// Per-token values.
    Values {
        /// The sequences.
        batch: SeqBatch,
        /// How they form forward passes.
        micro: MicroBatching,
    },
    /// One actor optimizer step on this rank's share of a mini-batch.
    ActorUpdate {
        /// This rank's rows.
        batch: SeqBatch,
        /// Rollout-time log-probs of those rows (`None`: on-policy, the update's own).
        old_log_probs: Option<Mat>,
        /// Advantages of those rows.
        advantages: Mat,
        /// Reference log-probs (KL loss).
        ref_log_probs: Option<Mat>,
        /// Normalisers of the whole mini-batch.
        norm: MiniNorm,
        /// Learning rate.
        lr: f64,
    },
    /// One critic optimizer step on this rank's share of a mini-batch.
    CriticUpdate {
        /// This rank's rows.
        batch: SeqBatch,
        /// Values at rollout time.
        values: Mat,
        /// Regression targets.
        returns: Mat,
        /// Normalisers of the whole mini-batch.
        norm: MiniNorm,
        /// Learning rate.
        lr: f64,
    },
    /// Hybrid engine: point the rollout view at the updated weights.
    SyncLocal,
    /// The actor's weights (payload: f32s in `names` order).
    GetWeights,
    /// New rollout weights (payload: f32s in `names` order).
    SetWeights {
        /// Tensor names and shapes, in payload order.
        names: Vec<(String, Vec<usize>)>,
    },
    /// Whether this rank can take part in an NCCL weight broadcast (its policy weights on a
    /// GPU, NCCL found, `cluster.gpu_collectives = "nccl"`), and with `make` an NCCL unique id.
    NcclId {
        /// Make the id (actor rank 0).
        make: bool,
    },
    /// Join the weight-broadcast communicator (actor rank 0 is its rank 0).
    WeightCommJoin {
        /// NCCL's unique id.
        id: Vec<u8>,
        /// This rank in it.
        rank: usize,
        /// Its size.
        world: usize,
        /// Elements of the flat weight buffer every member holds.
        elems: usize,
    },
    /// The policy weights over that communicator: actor rank 0 sends, the engines receive.
    BroadcastWeights,
    /// The actor's or critic's weights and optimizer state (payload: f32s, then optimizer bytes).
    State {
        /// Actor or Critic.
        role: RoleKind,
    },
    /// Score completions with the reward function.
    Score {
        /// What the reward function sees.
        inputs: Vec<reinforge_reward::RewardInput>,
    },
    /// Finish.
    Shutdown,
}

impl Request {
    /// The activity a rank reports while it serves this request (the watchdog's phases).
    pub fn activity(&self) -> &'static str {
        match self {
            Request::Load { .. } => "load",
            Request::CollectiveRoot | Request::CollectiveJoin { .. } => "join collective",
            Request::Generate { .. } => "generate",
            Request::LogProbs { .. } | Request::Values { .. } => "log-probs",
            Request::ActorUpdate { .. } | Request::CriticUpdate { .. } => "update",
            Request::SyncLocal
            | Request::GetWeights
            | Request::SetWeights { .. }
            | Request::NcclId { .. }
            | Request::WeightCommJoin { .. }
            | Request::BroadcastWeights => "weight sync",
            Request::State { .. } => "checkpoint",
            Request::Score { .. } => "score",
            Request::Shutdown => "shutdown",
        }
    }
}

/// A worker → controller answer.
#[derive(Debug, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum Response {
    /// Done.
    Ok,
    /// The request failed on the worker.
    Error {
        /// One line: what and why.
        message: String,
    },
    /// Where rank 0 listens.
    Addr {
        /// `ip:port`.
        addr: String,
    },
    /// Generated sequences.
    Completions {
        /// In request order (prompt indices local to the request).
        completions: Vec<Completion>,
    },
    /// Multi-turn trajectories (prompt indices local to the request).
    Trajectories {
        /// The trajectories and the retrieval requests made for them.
        rollout: MultiTurnRollout,
    },
    /// A `[N, R]` matrix.
    Mat {
        /// The matrix.
        mat: Mat,
    },
    /// Update metrics.
    Metrics {
        /// Name → value.
        metrics: Vec<(String, f64)>,
    },
    /// Tensors in the payload.
    Tensors {
        /// Names and shapes in payload order.
        names: Vec<(String, Vec<usize>)>,
        /// HF config.json.
        config_json: serde_json::Value,
        /// Bytes of optimizer state after the f32s.
        optimizer_len: usize,
        /// The LoRA adapter's shape, when the tensors hold one's factors.
        #[serde(default)]
        lora: Option<reinforge_engine::LoraConfig>,
    },
    /// Reward scores, in input order.
    Scores {
        /// One per input.
        outputs: Vec<reinforge_reward::RewardOutput>,
    },
    /// An answer to [`Request::NcclId`].
    NcclId {
        /// The unique id, when asked to make one and able to.
        id: Option<Vec<u8>>,
        /// Elements of this rank's flat GPU weight buffer; `None`: it cannot use NCCL.
        elems: Option<usize>,
    },
}

/// Flattens tensors for the wire (names in map order).
pub fn pack_tensors(t: &BTreeMap<String, HostTensor>) -> (Vec<(String, Vec<usize>)>, Vec<u8>) {
    let mut names = Vec::with_capacity(t.len());
    let mut bytes = Vec::with_capacity(t.values().map(|x| x.data.len() * 4).sum());
    for (k, v) in t {
        names.push((k.clone(), v.shape.clone()));
        bytes.extend_from_slice(&f32_bytes(&v.data));
    }
    (names, bytes)
}

/// The inverse of [`pack_tensors`]; `bytes` may hold trailing data, returned as the rest.
pub fn unpack_tensors<'a>(names: &[(String, Vec<usize>)], bytes: &'a [u8]) -> Result<(BTreeMap<String, HostTensor>, &'a [u8]), TrainError> {
    let mut out = BTreeMap::new();
    let mut off = 0usize;
    for (k, shape) in names {
        let n: usize = shape.iter().product::<usize>() * 4;
        let chunk = bytes.get(off..off + n).ok_or_else(|| TrainError::Other(format!("weights payload too short at {k}")))?;
        out.insert(k.clone(), HostTensor { shape: shape.clone(), data: bytes_f32(chunk).map_err(TrainError::Other)? });
        off += n;
    }
    Ok((out, &bytes[off..]))
}

/// What one rank hosts.
#[derive(Default)]
struct Hosted {
    actor: Option<Box<dyn HostedPolicy>>,
    /// Rollout engine with its own weights (not colocated with the actor).
    rollout: Option<Box<dyn RolloutEngine>>,
    reference: Option<Box<dyn RefGroup>>,
    critic: Option<Box<dyn HostedCritic>>,
    reward: Option<Box<dyn reinforge_reward::RewardFn>>,
    cfg: Option<TrainConfig>,
    roles: Vec<RoleKind>,
    root: Option<RootListener>,
    collective: Option<StarGroup>,
    /// The NCCL communicator weights are broadcast over (actor rank 0 and the rollout engines).
    weight_comm: Option<reinforge_cuda::nccl::Comm>,
    /// Multi-turn rollouts' loop (made at the first multi-turn request).
    agent: Option<Agent>,
}

/// Worker identity from the environment the launcher sets.
pub struct WorkerEnv {
    /// The controller's `ip:port`.
    pub controller: String,
    /// The run's secret.
    pub secret: String,
    /// Group name.
    pub group: String,
    /// Rank in the group.
    pub rank: usize,
    /// This node's IP as the cluster sees it.
    pub node_ip: String,
    /// Seconds between heartbeats to the controller.
    pub heartbeat_interval: Duration,
}

impl WorkerEnv {
    /// Reads `REINFORGE_CONTROLLER`, `REINFORGE_SECRET`, `REINFORGE_GROUP`, `REINFORGE_RANK`,
    /// `REINFORGE_NODE_IP`.
    pub fn from_env() -> Result<Self, TrainError> {
        let get = |k: &str| {
            std::env::var(k).map_err(|_| {
                TrainError::Other(format!("{k} is not set: `reinforge worker` is started by `reinforge train` with cluster.backend = \"ray\", not by hand"))
            })
        };
        Ok(Self {
            controller: get("REINFORGE_CONTROLLER")?,
            secret: get("REINFORGE_SECRET")?,
            group: get("REINFORGE_GROUP")?,
            rank: get("REINFORGE_RANK")?.parse().map_err(|_| TrainError::Other("REINFORGE_RANK is not a number".into()))?,
            node_ip: std::env::var("REINFORGE_NODE_IP").unwrap_or_else(|_| "127.0.0.1".into()),
            heartbeat_interval: std::env::var("REINFORGE_HEARTBEAT_INTERVAL_S")
                .ok()
                .and_then(|v| v.parse::<f64>().ok())
                .filter(|s| *s > 0.0)
                .map_or(Duration::from_secs(1), Duration::from_secs_f64),
        })
    }
}

/// Serves requests until `Shutdown` or until the controller goes away.
pub fn serve(env: &WorkerEnv) -> Result<(), TrainError> {
    // Die with the Ray actor that started us: an orphaned rank would hold memory and devices.
    let parent = std::os::unix::process::parent_id();
    std::thread::spawn(move || loop {
        std::thread::sleep(Duration::from_millis(500));
        if std::os::unix::process::parent_id() != parent {
            eprintln!("reinforge worker: parent process exited; stopping");
            std::process::exit(3);
        }
    });
    let wire = |e: reinforge_cluster::wire::WireError| TrainError::Other(e.to_string());
    let mut conn = Conn::connect(&env.controller, Duration::from_secs(30)).map_err(wire)?;
    let hello = Hello {
        secret: env.secret.clone(),
        group: env.group.clone(),
        rank: env.rank,
        pid: std::process::id(),
        host: reinforge_lease::hostname(),
        heartbeat: false,
    };
    conn.send(&hello, &[]).map_err(wire)?;
    let mut beats = Conn::connect(&env.controller, Duration::from_secs(30)).map_err(wire)?;
    beats.send(&Hello { heartbeat: true, ..hello }, &[]).map_err(wire)?;
    let interval = env.heartbeat_interval;
    activity::allow_stack_dumps();
    // Beats come from two threads: the beat loop, and the stack dump's notice right before gdb
    // stops this whole process (a beat written whole, before the stop, under the lock).
    let beats = Arc::new(Mutex::new(beats));
    let send = {
        let (beats, seq) = (beats.clone(), Arc::new(AtomicU64::new(0)));
        move |stacks: Option<String>, pause_s: Option<f64>| {
            let (now, for_s) = activity::current();
            let beat = Beat { seq: seq.fetch_add(1, Ordering::SeqCst), activity: now, activity_s: for_s.as_secs_f64(), stacks, pause_s };
            let mut conn = beats.lock().unwrap_or_else(|p| p.into_inner());
            conn.send(&beat, &[]).is_ok()
        }
    };
    // The controller's stall watchdog may ask for our stacks on the heartbeat connection; the
    // answer rides on the next beat.
    let stacks: Arc<Mutex<Option<String>>> = Arc::default();
    let asks = beats.lock().unwrap_or_else(|p| p.into_inner()).try_clone_stream();
    if let Ok(s) = asks {
        let (mut asks, stacks, send) = (Conn::new(s), stacks.clone(), send.clone());
        std::thread::spawn(move || {
            while let Ok((req, _)) = asks.recv::<StackRequest>() {
                // Said first: gdb stops every thread here, the beat loop too, for up to the
                // limit and its slack, and a rank silent past cluster.heartbeat_timeout_s
                // would otherwise be called lost because it was asked for its stacks.
                let pause = activity::STACKS_LIMIT + activity::STACKS_SLACK;
                if !send(None, Some(pause.as_secs_f64())) {
                    return;
                }
                let dump = format!("# {}\n{}", req.reason, activity::stacks(activity::STACKS_LIMIT));
                if let Ok(mut s) = stacks.lock() {
                    *s = Some(dump);
                }
            }
        });
    }
    // Its own thread, so a long forward pass or weight load never delays a beat.
    std::thread::spawn(move || loop {
        let dump = stacks.lock().ok().and_then(|mut s| s.take());
        if !send(dump, None) {
            return; // the controller is gone; the request loop notices too
        }
        std::thread::sleep(interval);
    });
    let mut h = Hosted::default();
    loop {
        let (req, payload): (Request, Vec<u8>) = match conn.recv() {
            Ok(x) => x,
            Err(e) => {
                tracing::info!("controller went away ({e}); stopping");
                return Ok(());
            }
        };
        if matches!(req, Request::Shutdown) {
            let _ = conn.send(&Response::Ok, &[]);
            return Ok(());
        }
        activity::set(req.activity());
        let (resp, out) = match handle(&mut h, env, req, payload) {
            Ok(x) => x,
            Err(e) => (Response::Error { message: e.to_string() }, Vec::new()),
        };
        activity::set("idle");
        conn.send(&resp, &out).map_err(wire)?;
    }
}

/// The policy weights this rank holds on a GPU: the actor's, else its rollout engine's.
fn policy_weights(h: &Hosted) -> Option<crate::roles::DeviceWeights> {
    h.actor.as_ref().and_then(|a| a.device_weights()).or_else(|| h.rollout.as_ref().and_then(|r| r.device_weights()))
}

/// [`policy_weights`], which a weight-broadcast request needs.
fn gpu_weights(h: &Hosted, env: &WorkerEnv) -> Result<crate::roles::DeviceWeights, TrainError> {
    policy_weights(h).ok_or_else(|| TrainError::Other(format!("{} rank {} holds no policy weights on a GPU", env.group, env.rank)))
}

fn need<'a, T>(x: Option<&'a mut T>, what: &str, env: &WorkerEnv) -> Result<&'a mut T, TrainError> {
    x.ok_or_else(|| TrainError::Other(format!("{} rank {} does not host the {what}", env.group, env.rank)))
}

fn handle(h: &mut Hosted, env: &WorkerEnv, req: Request, payload: Vec<u8>) -> Result<(Response, Vec<u8>), TrainError> {
    let ok = |r: Response| Ok((r, Vec::new()));
    match req {
        Request::Load { config, roles, resume } => {
            let mut cfg = TrainConfig::from_str_with(&config, "controller config", &[])?;
            // Ray gives each GPU rank one GPU in CUDA_VISIBLE_DEVICES: it is device 0 here,
            // whatever index the config names for a single-node run.
            if let DeviceSpec::Cuda(i) = cfg.trainer.device.parse()? {
                if i != 0 {
                    tracing::info!("trainer.device = cuda:{i} on a Ray rank: using its assigned GPU (cuda:0 of CUDA_VISIBLE_DEVICES)");
                }
                cfg.trainer.device = "cuda:0".into();
            }
            let model_dir = reinforge_assets::resolve_model(&cfg.actor.model)?;
            let resumed = match &resume {
                Some(p) => Some(reinforge_checkpoint::open(p, &Default::default())?),
                None => None,
            };
            if roles.contains(&RoleKind::Actor) {
                h.actor = Some(build::policy_group(&cfg, &model_dir, resumed.as_ref())?);
            } else if roles.contains(&RoleKind::Rollout) {
                h.rollout = Some(build::rollout_engine(&cfg, &model_dir, resumed.as_ref())?);
            }
            if roles.contains(&RoleKind::Ref) {
                h.reference = Some(build::reference_group(&cfg, &model_dir)?);
            }
            if roles.contains(&RoleKind::Critic) {
                h.critic = Some(build::critic_group(&cfg, &model_dir, resumed.as_ref())?);
            }
            if roles.contains(&RoleKind::Reward) {
                h.reward = Some(build::reward_fn(&cfg)?);
            }
            h.cfg = Some(cfg);
            h.roles = roles;
            ok(Response::Ok)
        }
        Request::CollectiveRoot => {
            let root = RootListener::bind(&env.node_ip).map_err(|e| TrainError::Other(e.to_string()))?;
            let addr = root.addr.clone();
            h.root = Some(root);
            ok(Response::Addr { addr })
        }
        Request::CollectiveJoin { addr, world } => {
            let timeout = Duration::from_secs(120);
            let g = match h.root.take() {
                Some(root) => root.accept(world, &env.secret, timeout),
                None => StarGroup::connect(&addr, env.rank, world, &env.secret, timeout),
            }
            .map_err(|e| TrainError::Other(e.to_string()))?;
            // Actor and critic in one process train one after the other: they share the group,
            // lent to whichever updates.
            h.collective = Some(g);
            ok(Response::Ok)
        }
        Request::Generate { prompts, params, agent: None, .. } => {
            let completions = if let Some(a) = h.actor.as_mut().filter(|_| h.roles.contains(&RoleKind::Rollout)) {
                a.generate(&prompts, &params)?
            } else {
                need(h.rollout.as_mut(), "rollout", env)?.generate(&prompts, &params)?
            };
            ok(Response::Completions { completions })
        }
        Request::Generate { prompts, params, agent: Some(settings), agent_kwargs } => {
            // The loop (tokenizer, clients) is made once per rank and kept: settings do not
            // change within a run.
            if h.agent.as_ref().is_none_or(|a| !a.built_from(&settings)) {
                let cfg = h.cfg.as_ref().ok_or_else(|| TrainError::Other("generate before load".into()))?;
                let dir = reinforge_assets::resolve_model(&cfg.actor.model)?;
                let tok = reinforge_tokenizer::ChatTokenizer::load_from_dir(&dir)?;
                h.agent = Some(Agent::new(settings, &tok)?);
            }
            let agent = h.agent.as_ref().ok_or_else(|| TrainError::Other("multi-turn agent".into()))?;
            let rollout = if let Some(a) = h.actor.as_mut().filter(|_| h.roles.contains(&RoleKind::Rollout)) {
                a.generate_turns(&prompts, &agent_kwargs, &params, agent)?
            } else {
                need(h.rollout.as_mut(), "rollout", env)?.generate_turns(&prompts, &agent_kwargs, &params, agent)?
            };
            ok(Response::Trajectories { rollout })
        }
        Request::LogProbs { role, batch, micro } => {
            let mat = match role {
                RoleKind::Ref => need(h.reference.as_mut(), "reference", env)?.logprobs(&batch, micro)?,
                _ => ActorGroup::logprobs(&mut **need(h.actor.as_mut(), "actor", env)?, &batch, micro)?,
            };
            ok(Response::Mat { mat })
        }
        Request::Values { batch, micro } => ok(Response::Mat { mat: need(h.critic.as_mut(), "critic", env)?.values(&batch, micro)? }),
        Request::ActorUpdate { batch, old_log_probs, advantages, ref_log_probs, norm, lr } => {
            let rows: Vec<usize> = (0..batch.len()).collect();
            let mini = ActorMiniBatch {
                rows: &rows,
                old_log_probs: old_log_probs.as_ref(),
                advantages: &advantages,
                ref_log_probs: ref_log_probs.as_ref(),
                norm: Some(norm),
            };
            let a = need(h.actor.as_mut(), "actor", env)?;
            a.swap_collective(h.collective.take());
            let m = a.update(&batch, &mini, lr);
            h.collective = a.swap_collective(None);
            let m = m?;
            ok(Response::Metrics { metrics: m.iter().map(|(k, v)| (k.to_string(), v)).collect() })
        }
        Request::CriticUpdate { batch, values, returns, norm, lr } => {
            let rows: Vec<usize> = (0..batch.len()).collect();
            let c = need(h.critic.as_mut(), "critic", env)?;
            c.swap_collective(h.collective.take());
            let m = c.update(&batch, &rows, &values, &returns, lr, Some(norm));
            h.collective = c.swap_collective(None);
            let m = m?;
            ok(Response::Metrics { metrics: m.iter().map(|(k, v)| (k.to_string(), v)).collect() })
        }
        Request::SyncLocal => {
            if let Some(a) = h.actor.as_mut() {
                a.sync_rollout()?;
            }
            ok(Response::Ok)
        }
        Request::GetWeights => {
            let (tensors, config_json) = need(h.actor.as_mut(), "actor", env)?.weights()?;
            let (names, bytes) = pack_tensors(&tensors);
            Ok((Response::Tensors { names, config_json, optimizer_len: 0, lora: None }, bytes))
        }
        Request::SetWeights { names } => {
            let (tensors, _) = unpack_tensors(&names, &payload)?;
            need(h.rollout.as_mut(), "rollout", env)?.set_weights(tensors)?;
            ok(Response::Ok)
        }
        Request::NcclId { make } => {
            let allowed = h.cfg.as_ref().is_some_and(|c| c.cluster.gpu_collectives == "nccl");
            let weights = policy_weights(h);
            let usable = weights.as_ref().filter(|w| allowed && reinforge_cuda::nccl::usable_on(&w.gpu));
            let id = match usable {
                Some(_) if make => match reinforge_cuda::nccl::unique_id() {
                    Ok(id) => Some(id.internal.to_vec()),
                    Err(e) => {
                        tracing::warn!("NCCL could not make a unique id ({e}): weights go through the controller");
                        None
                    }
                },
                _ => None,
            };
            ok(Response::NcclId { elems: if make && id.is_none() { None } else { usable.map(|w| w.elems) }, id })
        }
        Request::WeightCommJoin { id, rank, world, elems } => {
            let w = gpu_weights(h, env)?;
            if w.elems != elems {
                return Err(TrainError::Other(format!("this rank's weights are {} elements, actor rank 0's {elems}: the models differ", w.elems)));
            }
            let id = reinforge_cuda::nccl::UniqueId { internal: id.try_into().map_err(|_| TrainError::Other("an NCCL unique id is 128 bytes".into()))? };
            let cfg = h.cfg.as_ref().ok_or_else(|| TrainError::Other("weight-broadcast join before load".into()))?;
            let timeout = std::time::Duration::from_secs_f64(cfg.cluster.nccl_timeout_s);
            let comm = reinforge_cuda::nccl::Comm::init(&w.gpu, &id, rank, world, timeout)
                .map_err(|e| TrainError::Other(format!("{e}; cluster.gpu_collectives = \"host\" sends weights through the controller instead")))?;
            h.weight_comm = Some(comm);
            ok(Response::Ok)
        }
        Request::BroadcastWeights => {
            let w = gpu_weights(h, env)?;
            let comm = h.weight_comm.as_ref().ok_or_else(|| TrainError::Other("no weight-broadcast communicator (WeightCommJoin first)".into()))?;
            comm.broadcast(w.ptr, w.elems, w.dt, 0)?;
            // Errors of the broadcast surface here, within the weight-sync phase.
            w.gpu.sync()?;
            ok(Response::Ok)
        }
        Request::State { role } => {
            let st = match role {
                RoleKind::Critic => need(h.critic.as_mut(), "critic", env)?.state()?,
                _ => need(h.actor.as_mut(), "actor", env)?.state()?,
            };
            let (names, mut bytes) = pack_tensors(&st.tensors);
            let opt = st.optimizer.to_bytes(std::path::Path::new("<optimizer state>"))?;
            bytes.extend_from_slice(&opt);
            Ok((Response::Tensors { names, config_json: st.config_json, optimizer_len: opt.len(), lora: st.lora }, bytes))
        }
        Request::Score { inputs } => {
            let r = h.reward.as_ref().ok_or_else(|| TrainError::Other(format!("{} rank {} does not host the reward", env.group, env.rank)))?;
            ok(Response::Scores { outputs: r.score_batch(&inputs)? })
        }
        Request::Shutdown => ok(Response::Ok),
    }
}
