//! `reinforge cluster status`: the nodes of a Ray cluster and what runs where (live actors and
//! jobs), read from the dashboard's state API with the cluster token.

use crate::error::Result;
use crate::jobs::{Dashboard, JobInfo};
use serde::Serialize;
use serde_json::Value;

/// One node as the state API reports it.
#[derive(Debug, Clone, Serialize)]
pub struct NodeInfo {
    /// Ray's node id (hex).
    pub node_id: String,
    /// The node's IP.
    pub ip: String,
    /// ALIVE or DEAD.
    pub state: String,
    /// Whether this is the head.
    pub is_head: bool,
    /// Total CPUs Ray schedules on it.
    pub cpus: f64,
    /// Total GPUs Ray schedules on it.
    pub gpus: f64,
}

/// One live actor.
#[derive(Debug, Clone, Serialize)]
pub struct ActorInfo {
    /// Ray's actor id.
    pub actor_id: String,
    /// The actor's name (Reinforge ranks are `reinforge:<role>:<rank>`); empty if unnamed.
    pub name: String,
    /// Its Python class.
    pub class_name: String,
    /// ALIVE, PENDING_CREATION, RESTARTING…
    pub state: String,
    /// The node it runs on.
    pub node_id: String,
    /// That node's IP (empty if the node is unknown).
    pub node_ip: String,
    /// Its worker process id.
    pub pid: Option<u64>,
}

/// A snapshot of the cluster.
#[derive(Debug, Clone, Serialize)]
pub struct ClusterStatus {
    /// The dashboard asked.
    pub dashboard: String,
    /// Ray's version on the head.
    pub ray_version: Option<String>,
    /// "token", "disabled" or "unknown".
    pub auth: String,
    /// All nodes, head first.
    pub nodes: Vec<NodeInfo>,
    /// Actors that are not dead.
    pub actors: Vec<ActorInfo>,
    /// Jobs that are pending or running.
    pub jobs: Vec<JobInfo>,
    /// Live training runs among the jobs: what their controller and ranks are doing.
    pub runs: Vec<RunActivity>,
}

/// A running `reinforge train` job's `ranks.json` (written every second by its watchdog).
#[derive(Debug, Clone, Serialize)]
pub struct RunActivity {
    /// The job.
    pub job: String,
    /// Its run directory.
    pub run_dir: String,
    /// Seconds since the file was written.
    pub age_s: f64,
    /// The file: step, phase, phase_s, step_s, ranks [{rank, node, activity, activity_s}].
    pub ranks: Value,
}

fn s(v: &Value, k: &str) -> String {
    v.get(k).and_then(Value::as_str).unwrap_or("").to_string()
}

/// Asks the dashboard for nodes, live actors and active jobs.
pub fn status(d: &Dashboard) -> Result<ClusterStatus> {
    let auth = match d.auth_mode()? {
        crate::jobs::AuthMode::Token => "token".to_string(),
        crate::jobs::AuthMode::Disabled => "disabled".to_string(),
        crate::jobs::AuthMode::Unavailable => "none (Ray < 2.52 has no token auth)".to_string(),
        crate::jobs::AuthMode::Unknown(_) => "unknown".to_string(),
    };
    let ray_version = d
        .version()?
        .get("ray_version")
        .and_then(Value::as_str)
        .map(str::to_string);
    let mut nodes: Vec<NodeInfo> = d
        .state_list("/api/v0/nodes?limit=10000")?
        .iter()
        .map(|n| {
            let res = n.get("resources_total");
            let r = |k: &str| {
                res.and_then(|r| r.get(k))
                    .and_then(Value::as_f64)
                    .unwrap_or(0.0)
            };
            NodeInfo {
                node_id: s(n, "node_id"),
                ip: s(n, "node_ip"),
                state: s(n, "state"),
                is_head: n
                    .get("is_head_node")
                    .and_then(Value::as_bool)
                    .unwrap_or(false),
                cpus: r("CPU"),
                gpus: r("GPU"),
            }
        })
        .collect();
    // Head first, then alive before dead, then by IP: a stable, readable order.
    nodes.sort_by(|a, b| {
        (!a.is_head, a.state != "ALIVE", &a.ip, &a.node_id).cmp(&(
            !b.is_head,
            b.state != "ALIVE",
            &b.ip,
            &b.node_id,
        ))
    });
    let mut actors: Vec<ActorInfo> = d
        .state_list("/api/v0/actors?limit=10000")?
        .iter()
        .filter(|a| s(a, "state") != "DEAD")
        .map(|a| {
            let node_id = s(a, "node_id");
            let node_ip = nodes
                .iter()
                .find(|n| n.node_id == node_id)
                .map(|n| n.ip.clone())
                .unwrap_or_default();
            ActorInfo {
                actor_id: s(a, "actor_id"),
                name: s(a, "name"),
                class_name: s(a, "class_name"),
                state: s(a, "state"),
                node_id,
                node_ip,
                pid: a.get("pid").and_then(Value::as_u64),
            }
        })
        .collect();
    actors.sort_by(|a, b| {
        (a.name.is_empty(), &a.name, &a.actor_id).cmp(&(b.name.is_empty(), &b.name, &b.actor_id))
    });
    let jobs = d
        .list_jobs()?
        .into_iter()
        .filter(|j| !j.is_terminal())
        .collect();
    Ok(ClusterStatus {
        dashboard: d.url().to_string(),
        ray_version,
        auth,
        nodes,
        actors,
        jobs,
        runs: Vec::new(),
    })
}

fn short(id: &str) -> &str {
    id.get(..8).unwrap_or(id)
}

fn num(x: f64) -> String {
    if x.fract() == 0.0 {
        format!("{x:.0}")
    } else {
        format!("{x:.2}")
    }
}

/// Renders a status as aligned text tables.
pub fn render(st: &ClusterStatus) -> String {
    let mut out = String::new();
    let alive = st
        .nodes
        .iter()
        .filter(|n| n.state == "ALIVE")
        .collect::<Vec<_>>();
    let cpus: f64 = alive.iter().map(|n| n.cpus).sum();
    let gpus: f64 = alive.iter().map(|n| n.gpus).sum();
    out.push_str(&format!(
        "Ray {} at {} (auth: {}): {} node(s) alive, {} CPU, {} GPU\n",
        st.ray_version.as_deref().unwrap_or("?"),
        st.dashboard,
        st.auth,
        alive.len(),
        num(cpus),
        num(gpus)
    ));
    let mut rows = vec![[
        "NODE".to_string(),
        "IP".into(),
        "STATE".into(),
        "CPU".into(),
        "GPU".into(),
        "".into(),
    ]];
    for n in &st.nodes {
        rows.push([
            short(&n.node_id).to_string(),
            n.ip.clone(),
            n.state.clone(),
            num(n.cpus),
            num(n.gpus),
            if n.is_head {
                "head".into()
            } else {
                String::new()
            },
        ]);
    }
    out.push_str(&table(&rows));
    if st.actors.is_empty() {
        out.push_str("no live actors\n");
    } else {
        let mut rows = vec![[
            "ACTOR".to_string(),
            "CLASS".into(),
            "STATE".into(),
            "NODE IP".into(),
            "PID".into(),
            "ID".into(),
        ]];
        for a in &st.actors {
            rows.push([
                if a.name.is_empty() {
                    "-".into()
                } else {
                    a.name.clone()
                },
                a.class_name.clone(),
                a.state.clone(),
                a.node_ip.clone(),
                a.pid.map(|p| p.to_string()).unwrap_or_default(),
                short(&a.actor_id).to_string(),
            ]);
        }
        out.push_str(&table(&rows));
    }
    if st.jobs.is_empty() {
        out.push_str("no running jobs\n");
    } else {
        let mut rows = vec![["JOB".to_string(), "STATUS".into(), "ENTRYPOINT".into()]];
        for j in &st.jobs {
            rows.push([
                j.id().to_string(),
                j.status.clone(),
                truncate(j.entrypoint.as_deref().unwrap_or(""), 60),
            ]);
        }
        out.push_str(&table(&rows));
    }
    for r in &st.runs {
        let f = |k: &str| r.ranks.get(k).and_then(Value::as_f64).unwrap_or(0.0);
        out.push_str(&format!(
            "job {} ({}): step {}, controller in {} for {:.1}s (step running {:.1}s; as of {:.1}s ago)\n",
            r.job,
            r.run_dir,
            r.ranks.get("step").and_then(Value::as_u64).unwrap_or(0),
            r.ranks.get("phase").and_then(Value::as_str).unwrap_or("?"),
            f("phase_s"),
            f("step_s"),
            r.age_s
        ));
        let mut rows = vec![["RANK".to_string(), "NODE".into(), "ACTIVITY".into(), "FOR".into()]];
        for k in r.ranks.get("ranks").and_then(Value::as_array).into_iter().flatten() {
            rows.push([s(k, "rank"), s(k, "node"), s(k, "activity"), format!("{:.1}s", k.get("activity_s").and_then(Value::as_f64).unwrap_or(0.0))]);
        }
        if rows.len() > 1 {
            out.push_str(&table(&rows));
        }
    }
    out
}

/// Shortens a string to `n` characters with an ellipsis.
pub fn truncate(s: &str, n: usize) -> String {
    let s = s.replace('\n', " ");
    if s.chars().count() <= n {
        s
    } else {
        let mut t: String = s.chars().take(n.saturating_sub(1)).collect();
        t.push('…');
        t
    }
}

/// Left-aligned columns separated by two spaces.
pub fn table<const N: usize>(rows: &[[String; N]]) -> String {
    let mut w = [0usize; N];
    for r in rows {
        for (i, c) in r.iter().enumerate() {
            w[i] = w[i].max(c.chars().count());
        }
    }
    let mut out = String::new();
    for r in rows {
        let mut line = String::new();
        for (i, c) in r.iter().enumerate() {
            line.push_str(c);
            if i + 1 < N {
                line.push_str(&" ".repeat(w[i] - c.chars().count() + 2));
            }
        }
        out.push_str(line.trim_end());
        out.push('\n');
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn renders() {
        let st = ClusterStatus {
            dashboard: "http://h:8265".into(),
            ray_version: Some("2.60.0".into()),
            auth: "token".into(),
            nodes: vec![
                NodeInfo {
                    node_id: "944997be728637b5".into(),
                    ip: "10.0.0.1".into(),
                    state: "ALIVE".into(),
                    is_head: true,
                    cpus: 2.0,
                    gpus: 0.0,
                },
                NodeInfo {
                    node_id: "32e67202aa".into(),
                    ip: "10.0.0.2".into(),
                    state: "ALIVE".into(),
                    is_head: false,
                    cpus: 8.0,
                    gpus: 1.0,
                },
            ],
            actors: vec![ActorInfo {
                actor_id: "0708529d7322057e".into(),
                name: "reinforge:actor:0".into(),
                class_name: "Rank".into(),
                state: "ALIVE".into(),
                node_id: "32e67202aa".into(),
                node_ip: "10.0.0.2".into(),
                pid: Some(77),
            }],
            jobs: vec![],
            runs: vec![],
        };
        let t = render(&st);
        assert!(
            t.starts_with(
                "Ray 2.60.0 at http://h:8265 (auth: token): 2 node(s) alive, 10 CPU, 1 GPU\n"
            ),
            "{t}"
        );
        assert!(
            t.contains("944997be  10.0.0.1  ALIVE  2    0    head\n"),
            "{t}"
        );
        assert!(
            t.contains("reinforge:actor:0  Rank   ALIVE  10.0.0.2  77   0708529d\n"),
            "{t}"
        );
        assert!(t.contains("no running jobs"));
        assert_eq!(truncate("abcdef", 4), "abc…");
        assert_eq!(num(0.5), "0.50");
    }
}
