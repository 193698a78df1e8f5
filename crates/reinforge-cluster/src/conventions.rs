//! "Who am I, where is the head": resolves this node's role from `--head` / `--address` or from
//! the environment conventions launchers already set (torchrun, RunPod Global Networking,
//! Slurm, dstack). Pure: the environment is passed in, so every case is unit-tested.

use crate::error::{ClusterError, Result};
use std::fmt;

/// Ray's default GCS port.
///
/// Used for the head even when torchrun's `MASTER_PORT` is set: that port belongs to
/// torch.distributed's rendezvous (TCPStore), which the training processes bind later on the
/// head; if Ray's GCS took it, the job's own `init_process_group` would fail with "address in
/// use". Only `--port` (or the port in `--address`) changes the Ray port.
pub const DEFAULT_RAY_PORT: u16 = 6379;

/// Which convention decided the role.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Convention {
    /// `--head` / `--address` on the command line.
    Flags,
    /// torchrun-style `MASTER_ADDR`, `NODE_RANK`, `NNODES`.
    Torchrun,
    /// RunPod Global Networking: `USE_GLOBAL_NETWORKING=1`, `HEAD_POD_ID`, `RAY_WORKER`.
    RunPod,
    /// Slurm: `SLURM_JOB_NODELIST`, `SLURM_NODEID`.
    Slurm,
    /// dstack: `DSTACK_NODE_RANK`, `DSTACK_MASTER_NODE_IP`.
    Dstack,
}

impl fmt::Display for Convention {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Convention::Flags => "command-line flags",
            Convention::Torchrun => "torchrun-style MASTER_ADDR/NODE_RANK",
            Convention::RunPod => {
                "RunPod Global Networking (USE_GLOBAL_NETWORKING/HEAD_POD_ID/RAY_WORKER)"
            }
            Convention::Slurm => "Slurm (SLURM_JOB_NODELIST/SLURM_NODEID)",
            Convention::Dstack => "dstack (DSTACK_NODE_RANK/DSTACK_MASTER_NODE_IP)",
        })
    }
}

/// This node's role.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Role {
    /// Start the Ray head on `port`.
    Head {
        /// The GCS port to listen on.
        port: u16,
    },
    /// Join the head at `host:port`.
    Worker {
        /// The head's host name or IP.
        host: String,
        /// The head's GCS port.
        port: u16,
    },
}

/// The outcome of resolution.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Resolved {
    /// Head or worker, and where.
    pub role: Role,
    /// Which convention decided it.
    pub convention: Convention,
    /// This node's rank, when the convention gives one.
    pub node_rank: Option<u32>,
    /// The number of nodes, when the convention gives it.
    pub nnodes: Option<u32>,
    /// An address for this node's `--node-ip-address`, when the convention names one (dstack's
    /// master IP on the head; RunPod's own `<pod id>.runpod.internal` name, resolved later).
    pub node_ip_hint: Option<String>,
}

/// The flags that bear on the role.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct RoleFlags {
    /// `--head`.
    pub head: bool,
    /// `--address HOST[:PORT]`.
    pub address: Option<String>,
    /// `--port`.
    pub port: Option<u16>,
}

/// Resolves the role from the flags, else from the environment (conventions are tried in the
/// order torchrun, RunPod, dstack, Slurm: variables a user sets by hand win over ones a
/// scheduler sets).
pub fn resolve(flags: &RoleFlags, env: &dyn Fn(&str) -> Option<String>) -> Result<Resolved> {
    let get = |k: &str| {
        env(k)
            .map(|v| v.trim().to_string())
            .filter(|v| !v.is_empty())
    };
    let default_port = flags.port.unwrap_or(DEFAULT_RAY_PORT);
    let base = |role, convention| Resolved {
        role,
        convention,
        node_rank: None,
        nnodes: None,
        node_ip_hint: None,
    };

    if flags.head && flags.address.is_some() {
        return Err(ClusterError::usage(
            "--head and --address contradict each other: use --head on the head node and --address HEAD:PORT on the others",
        ));
    }
    if flags.head {
        return Ok(base(Role::Head { port: default_port }, Convention::Flags));
    }
    if let Some(a) = &flags.address {
        let (host, port) = split_host_port(a, flags.port)?;
        return Ok(base(Role::Worker { host, port }, Convention::Flags));
    }

    // torchrun-style.
    let master = get("MASTER_ADDR");
    let node_rank = get("NODE_RANK");
    if master.is_some() || node_rank.is_some() {
        let rank = match &node_rank {
            Some(r) => parse_num::<u32>("NODE_RANK", r)?,
            None => {
                return Err(ClusterError::usage(
                    "MASTER_ADDR is set but NODE_RANK is not (torchrun style); set NODE_RANK=0 on the head and 1..N-1 on the others, or pass --head / --address HOST:PORT",
                ))
            }
        };
        let nnodes = get("NNODES")
            .map(|n| parse_num::<u32>("NNODES", &n))
            .transpose()?;
        let role = if rank == 0 {
            Role::Head { port: default_port }
        } else {
            let host = master.ok_or_else(|| {
                ClusterError::usage(format!(
                    "NODE_RANK={rank} but MASTER_ADDR is not set (torchrun style); set MASTER_ADDR to the head's address, or pass --address HOST:PORT"
                ))
            })?;
            Role::Worker {
                host,
                port: default_port,
            }
        };
        return Ok(Resolved {
            node_rank: Some(rank),
            nnodes,
            ..base(role, Convention::Torchrun)
        });
    }

    // RunPod Global Networking.
    if let Some(g) = get("USE_GLOBAL_NETWORKING") {
        if matches!(g.as_str(), "1" | "true" | "True" | "TRUE") {
            let worker = match get("RAY_WORKER").as_deref() {
                Some("0") => false,
                Some("1") => true,
                Some(other) => {
                    return Err(ClusterError::usage(format!(
                        "RAY_WORKER={other} (RunPod Global Networking) must be 0 on the head or 1 on workers"
                    )))
                }
                None => {
                    return Err(ClusterError::usage(
                        "USE_GLOBAL_NETWORKING=1 but RAY_WORKER is not set (RunPod); set RAY_WORKER=0 on the head pod and RAY_WORKER=1 with HEAD_POD_ID=<head pod id> on the others",
                    ))
                }
            };
            let own = get("RUNPOD_POD_ID").map(|id| format!("{id}.runpod.internal"));
            let role = if worker {
                let id = get("HEAD_POD_ID").ok_or_else(|| {
                    ClusterError::usage(
                        "RAY_WORKER=1 but HEAD_POD_ID is not set (RunPod Global Networking); set HEAD_POD_ID to the head pod's id (its <id>.runpod.internal name is used)",
                    )
                })?;
                Role::Worker {
                    host: format!("{id}.runpod.internal"),
                    port: default_port,
                }
            } else {
                Role::Head { port: default_port }
            };
            return Ok(Resolved {
                node_ip_hint: own,
                ..base(role, Convention::RunPod)
            });
        }
    }

    // dstack.
    let d_rank = get("DSTACK_NODE_RANK");
    let d_master = get("DSTACK_MASTER_NODE_IP");
    if d_rank.is_some() || d_master.is_some() {
        let (Some(rank), Some(master)) = (d_rank, d_master) else {
            return Err(ClusterError::usage(
                "dstack environment is incomplete: both DSTACK_NODE_RANK and DSTACK_MASTER_NODE_IP are needed (run inside a dstack multi-node task), or pass --head / --address HOST:PORT",
            ));
        };
        let rank = parse_num::<u32>("DSTACK_NODE_RANK", &rank)?;
        let nnodes = get("DSTACK_NODES_NUM")
            .map(|n| parse_num::<u32>("DSTACK_NODES_NUM", &n))
            .transpose()?;
        let (role, hint) = if rank == 0 {
            (Role::Head { port: default_port }, Some(master))
        } else {
            (
                Role::Worker {
                    host: master,
                    port: default_port,
                },
                None,
            )
        };
        return Ok(Resolved {
            node_rank: Some(rank),
            nnodes,
            node_ip_hint: hint,
            ..base(role, Convention::Dstack)
        });
    }

    // Slurm.
    let nodelist = get("SLURM_JOB_NODELIST").or_else(|| get("SLURM_NODELIST"));
    if let Some(list) = nodelist {
        let node_id = get("SLURM_NODEID").ok_or_else(|| {
            ClusterError::usage(
                "SLURM_JOB_NODELIST is set but SLURM_NODEID is not; run `reinforge cluster start` under `srun` (one task per node), or pass --head / --address HOST:PORT",
            )
        })?;
        let rank = parse_num::<u32>("SLURM_NODEID", &node_id)?;
        let head = first_host(&list)?;
        let nnodes = get("SLURM_JOB_NUM_NODES")
            .or_else(|| get("SLURM_NNODES"))
            .map(|n| parse_num::<u32>("SLURM_JOB_NUM_NODES", &n))
            .transpose()?;
        let role = if rank == 0 {
            Role::Head { port: default_port }
        } else {
            Role::Worker {
                host: head,
                port: default_port,
            }
        };
        return Ok(Resolved {
            node_rank: Some(rank),
            nnodes,
            ..base(role, Convention::Slurm)
        });
    }

    Err(ClusterError::usage(
        "cannot tell whether this node is the head: pass --head (on the head) or --address HEAD:PORT (on the others), or run under torchrun-style MASTER_ADDR/NODE_RANK, RunPod (USE_GLOBAL_NETWORKING=1, RAY_WORKER, HEAD_POD_ID), Slurm (srun) or dstack",
    ))
}

fn parse_num<T: std::str::FromStr>(name: &str, v: &str) -> Result<T> {
    v.parse().map_err(|_| {
        ClusterError::usage(format!(
            "{name}={v} is not a non-negative integer; fix the variable"
        ))
    })
}

/// Splits `HOST[:PORT]` (IPv6 as `[::1]:6379`); the port defaults to `--port`, then 6379.
pub fn split_host_port(address: &str, port_flag: Option<u16>) -> Result<(String, u16)> {
    let a = address.trim();
    let bad = || {
        ClusterError::usage(format!(
            "--address {address:?} is not HOST:PORT (e.g. 10.0.0.1:6379); pass the head's Ray address printed by `reinforge cluster start --head`"
        ))
    };
    if a.is_empty() || a.contains("://") || a.contains('/') {
        return Err(bad());
    }
    let (host, port) = if let Some(rest) = a.strip_prefix('[') {
        let (h, after) = rest.split_once(']').ok_or_else(bad)?;
        match after.strip_prefix(':') {
            Some(p) => (h.to_string(), Some(p)),
            None if after.is_empty() => (h.to_string(), None),
            None => return Err(bad()),
        }
    } else {
        match a.rsplit_once(':') {
            Some((h, _)) if h.contains(':') => (a.to_string(), None), // bare IPv6
            Some((h, p)) => (h.to_string(), Some(p)),
            None => (a.to_string(), None),
        }
    };
    if host.is_empty() {
        return Err(bad());
    }
    let port = match port {
        Some(p) => {
            let p: u16 = p.parse().map_err(|_| bad())?;
            if p == 0 {
                return Err(bad());
            }
            if let Some(f) = port_flag.filter(|f| *f != p) {
                return Err(ClusterError::usage(format!(
                    "--address {address} and --port {f} name different ports; give the port once"
                )));
            }
            p
        }
        None => port_flag.unwrap_or(DEFAULT_RAY_PORT),
    };
    Ok((host, port))
}

/// Upper bound on an expanded Slurm node list (a typo like `n[1-99999999]` must not eat memory).
const MAX_HOSTS: usize = 1 << 20;

/// Expands a Slurm compressed host list, e.g. `gpu[01-03,07],login1` → `gpu01 gpu02 gpu03 gpu07
/// login1`; several bracket groups in one name (`r[1-2]n[1-2]`) expand in order.
pub fn expand_nodelist(list: &str) -> Result<Vec<String>> {
    let bad = |why: &str| {
        ClusterError::usage(format!("SLURM_JOB_NODELIST={list:?} cannot be parsed ({why}); pass --address HEAD:PORT instead"))
    };
    let mut out = Vec::new();
    for item in split_top_level(list).map_err(&bad)? {
        let item = item.trim();
        if item.is_empty() {
            continue;
        }
        let mut names = vec![String::new()];
        let mut rest = item;
        while !rest.is_empty() {
            match rest.find('[') {
                None => {
                    names.iter_mut().for_each(|n| n.push_str(rest));
                    rest = "";
                }
                Some(open) => {
                    let prefix = &rest[..open];
                    let close = rest[open..]
                        .find(']')
                        .map(|c| c + open)
                        .ok_or_else(|| bad("unclosed '['"))?;
                    let suffixes = expand_ranges(&rest[open + 1..close]).map_err(&bad)?;
                    let mut next = Vec::with_capacity(names.len() * suffixes.len());
                    for n in &names {
                        for s in &suffixes {
                            next.push(format!("{n}{prefix}{s}"));
                        }
                        if next.len() > MAX_HOSTS {
                            return Err(bad("too many hosts"));
                        }
                    }
                    names = next;
                    rest = &rest[close + 1..];
                }
            }
        }
        out.extend(names);
        if out.len() > MAX_HOSTS {
            return Err(bad("too many hosts"));
        }
    }
    if out.is_empty() {
        return Err(bad("no hosts"));
    }
    Ok(out)
}

/// The head of a Slurm allocation: the first host of the node list (`SLURM_NODEID` 0 is that node).
pub fn first_host(list: &str) -> Result<String> {
    let hosts = expand_nodelist(list)?;
    Ok(hosts.into_iter().next().unwrap_or_default())
}

fn split_top_level(s: &str) -> std::result::Result<Vec<&str>, &'static str> {
    let mut parts = Vec::new();
    let mut depth = 0i32;
    let mut start = 0;
    for (i, c) in s.char_indices() {
        match c {
            '[' => depth += 1,
            ']' => {
                depth -= 1;
                if depth < 0 {
                    return Err("unmatched ']'");
                }
            }
            ',' if depth == 0 => {
                parts.push(&s[start..i]);
                start = i + 1;
            }
            _ => {}
        }
    }
    if depth != 0 {
        return Err("unclosed '['");
    }
    parts.push(&s[start..]);
    Ok(parts)
}

/// `01-03,07` → `01 02 03 07` (zero padding kept from the lower bound, as Slurm does).
fn expand_ranges(spec: &str) -> std::result::Result<Vec<String>, &'static str> {
    let mut out = Vec::new();
    for r in spec.split(',') {
        let r = r.trim();
        if r.is_empty() {
            return Err("empty range");
        }
        match r.split_once('-') {
            None => {
                if !r.chars().all(|c| c.is_ascii_digit()) {
                    return Err("non-numeric range");
                }
                out.push(r.to_string());
            }
            Some((lo, hi)) => {
                if lo.is_empty()
                    || hi.is_empty()
                    || !(lo.chars().chain(hi.chars()).all(|c| c.is_ascii_digit()))
                {
                    return Err("non-numeric range");
                }
                let width = lo.len();
                let (a, b): (u64, u64) = (
                    lo.parse().map_err(|_| "range too large")?,
                    hi.parse().map_err(|_| "range too large")?,
                );
                if b < a {
                    return Err("descending range");
                }
                if b - a >= MAX_HOSTS as u64 {
                    return Err("too many hosts");
                }
                out.extend((a..=b).map(|n| format!("{n:0width$}")));
            }
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;

    fn env(pairs: &[(&str, &str)]) -> impl Fn(&str) -> Option<String> {
        let m: HashMap<String, String> = pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        move |k| m.get(k).cloned()
    }
    fn none() -> RoleFlags {
        RoleFlags::default()
    }
    fn worker(h: &str, p: u16) -> Role {
        Role::Worker {
            host: h.into(),
            port: p,
        }
    }

    #[test]
    fn flags() {
        let r = resolve(
            &RoleFlags {
                head: true,
                ..none()
            },
            &env(&[("MASTER_ADDR", "x"), ("NODE_RANK", "3")]),
        )
        .unwrap();
        assert_eq!(
            (r.role, r.convention),
            (Role::Head { port: 6379 }, Convention::Flags)
        );
        let r = resolve(
            &RoleFlags {
                head: true,
                port: Some(7000),
                ..none()
            },
            &env(&[]),
        )
        .unwrap();
        assert_eq!(r.role, Role::Head { port: 7000 });
        let r = resolve(
            &RoleFlags {
                address: Some("10.0.0.1:7001".into()),
                ..none()
            },
            &env(&[]),
        )
        .unwrap();
        assert_eq!(r.role, worker("10.0.0.1", 7001));
        let r = resolve(
            &RoleFlags {
                address: Some("head".into()),
                ..none()
            },
            &env(&[]),
        )
        .unwrap();
        assert_eq!(r.role, worker("head", 6379));
        let r = resolve(
            &RoleFlags {
                address: Some("head".into()),
                port: Some(7002),
                ..none()
            },
            &env(&[]),
        )
        .unwrap();
        assert_eq!(r.role, worker("head", 7002));
        let r = resolve(
            &RoleFlags {
                address: Some("[fd00::1]:7003".into()),
                ..none()
            },
            &env(&[]),
        )
        .unwrap();
        assert_eq!(r.role, worker("fd00::1", 7003));
        let r = resolve(
            &RoleFlags {
                address: Some("fd00::1".into()),
                ..none()
            },
            &env(&[]),
        )
        .unwrap();
        assert_eq!(r.role, worker("fd00::1", 6379));
    }

    #[test]
    fn flag_conflicts_and_bad_addresses() {
        let e = resolve(
            &RoleFlags {
                head: true,
                address: Some("h:1".into()),
                port: None,
            },
            &env(&[]),
        )
        .unwrap_err()
        .to_string();
        assert!(e.contains("--head and --address"), "{e}");
        let e = resolve(
            &RoleFlags {
                address: Some("h:1".into()),
                port: Some(2),
                ..none()
            },
            &env(&[]),
        )
        .unwrap_err()
        .to_string();
        assert!(e.contains("different ports"), "{e}");
        for bad in [
            "http://h:8265",
            "h:notaport",
            "h:0",
            ":6379",
            "",
            "h:70000",
            "[::1",
        ] {
            let e = resolve(
                &RoleFlags {
                    address: Some(bad.into()),
                    ..none()
                },
                &env(&[]),
            )
            .unwrap_err()
            .to_string();
            assert!(e.contains("is not HOST:PORT"), "{bad}: {e}");
        }
        let e = resolve(&none(), &env(&[])).unwrap_err().to_string();
        assert!(e.contains("pass --head"), "{e}");
    }

    #[test]
    fn torchrun() {
        let r = resolve(
            &none(),
            &env(&[
                ("MASTER_ADDR", "10.1.1.1"),
                ("MASTER_PORT", "29500"),
                ("NODE_RANK", "0"),
                ("NNODES", "4"),
            ]),
        )
        .unwrap();
        assert_eq!(
            r.role,
            Role::Head { port: 6379 },
            "MASTER_PORT is torch's, not Ray's"
        );
        assert_eq!(
            (r.convention, r.node_rank, r.nnodes),
            (Convention::Torchrun, Some(0), Some(4))
        );
        let r = resolve(
            &none(),
            &env(&[
                ("MASTER_ADDR", "10.1.1.1"),
                ("MASTER_PORT", "29500"),
                ("NODE_RANK", "2"),
            ]),
        )
        .unwrap();
        assert_eq!(r.role, worker("10.1.1.1", 6379));
        let r = resolve(
            &RoleFlags {
                port: Some(6400),
                ..none()
            },
            &env(&[("MASTER_ADDR", "m"), ("NODE_RANK", "1")]),
        )
        .unwrap();
        assert_eq!(r.role, worker("m", 6400));
        let r = resolve(&none(), &env(&[("NODE_RANK", "0")])).unwrap();
        assert_eq!(r.role, Role::Head { port: 6379 });
        let e = resolve(&none(), &env(&[("MASTER_ADDR", "m")]))
            .unwrap_err()
            .to_string();
        assert!(e.contains("NODE_RANK is not"), "{e}");
        let e = resolve(&none(), &env(&[("NODE_RANK", "1")]))
            .unwrap_err()
            .to_string();
        assert!(e.contains("MASTER_ADDR is not set"), "{e}");
        let e = resolve(&none(), &env(&[("MASTER_ADDR", "m"), ("NODE_RANK", "one")]))
            .unwrap_err()
            .to_string();
        assert!(e.contains("NODE_RANK=one"), "{e}");
        // torchrun wins over a scheduler's variables.
        let r = resolve(
            &none(),
            &env(&[
                ("MASTER_ADDR", "m"),
                ("NODE_RANK", "1"),
                ("SLURM_JOB_NODELIST", "a[1-2]"),
                ("SLURM_NODEID", "0"),
            ]),
        )
        .unwrap();
        assert_eq!(
            (r.role, r.convention),
            (worker("m", 6379), Convention::Torchrun)
        );
    }

    #[test]
    fn runpod() {
        let r = resolve(
            &none(),
            &env(&[
                ("USE_GLOBAL_NETWORKING", "1"),
                ("RAY_WORKER", "0"),
                ("RUNPOD_POD_ID", "abc123"),
            ]),
        )
        .unwrap();
        assert_eq!(
            (r.role, r.convention),
            (Role::Head { port: 6379 }, Convention::RunPod)
        );
        assert_eq!(r.node_ip_hint.as_deref(), Some("abc123.runpod.internal"));
        let r = resolve(
            &none(),
            &env(&[
                ("USE_GLOBAL_NETWORKING", "1"),
                ("RAY_WORKER", "1"),
                ("HEAD_POD_ID", "h9"),
            ]),
        )
        .unwrap();
        assert_eq!(r.role, worker("h9.runpod.internal", 6379));
        let e = resolve(
            &none(),
            &env(&[("USE_GLOBAL_NETWORKING", "1"), ("RAY_WORKER", "1")]),
        )
        .unwrap_err()
        .to_string();
        assert!(e.contains("HEAD_POD_ID is not set"), "{e}");
        let e = resolve(&none(), &env(&[("USE_GLOBAL_NETWORKING", "1")]))
            .unwrap_err()
            .to_string();
        assert!(e.contains("RAY_WORKER is not set"), "{e}");
        let e = resolve(
            &none(),
            &env(&[("USE_GLOBAL_NETWORKING", "1"), ("RAY_WORKER", "yes")]),
        )
        .unwrap_err()
        .to_string();
        assert!(e.contains("RAY_WORKER=yes"), "{e}");
        // Global networking off: RAY_WORKER alone means nothing.
        assert!(resolve(
            &none(),
            &env(&[("USE_GLOBAL_NETWORKING", "0"), ("RAY_WORKER", "1")])
        )
        .is_err());
    }

    #[test]
    fn dstack() {
        let r = resolve(
            &none(),
            &env(&[
                ("DSTACK_NODE_RANK", "0"),
                ("DSTACK_MASTER_NODE_IP", "10.2.0.1"),
                ("DSTACK_NODES_NUM", "2"),
            ]),
        )
        .unwrap();
        assert_eq!(
            (r.role.clone(), r.convention, r.nnodes),
            (Role::Head { port: 6379 }, Convention::Dstack, Some(2))
        );
        assert_eq!(r.node_ip_hint.as_deref(), Some("10.2.0.1"));
        let r = resolve(
            &none(),
            &env(&[
                ("DSTACK_NODE_RANK", "1"),
                ("DSTACK_MASTER_NODE_IP", "10.2.0.1"),
            ]),
        )
        .unwrap();
        assert_eq!(r.role, worker("10.2.0.1", 6379));
        let e = resolve(&none(), &env(&[("DSTACK_NODE_RANK", "1")]))
            .unwrap_err()
            .to_string();
        assert!(e.contains("dstack environment is incomplete"), "{e}");
    }

    #[test]
    fn slurm() {
        let r = resolve(
            &none(),
            &env(&[
                ("SLURM_JOB_NODELIST", "gpu[01-03,07],login1"),
                ("SLURM_NODEID", "0"),
                ("SLURM_JOB_NUM_NODES", "5"),
            ]),
        )
        .unwrap();
        assert_eq!(
            (r.role, r.convention, r.nnodes),
            (Role::Head { port: 6379 }, Convention::Slurm, Some(5))
        );
        let r = resolve(
            &none(),
            &env(&[
                ("SLURM_JOB_NODELIST", "gpu[01-03,07],login1"),
                ("SLURM_NODEID", "3"),
            ]),
        )
        .unwrap();
        assert_eq!(r.role, worker("gpu01", 6379));
        let r = resolve(
            &none(),
            &env(&[("SLURM_NODELIST", "node7"), ("SLURM_NODEID", "1")]),
        )
        .unwrap();
        assert_eq!(r.role, worker("node7", 6379));
        let e = resolve(&none(), &env(&[("SLURM_JOB_NODELIST", "a[1-2]")]))
            .unwrap_err()
            .to_string();
        assert!(e.contains("srun"), "{e}");
        let e = resolve(
            &none(),
            &env(&[("SLURM_JOB_NODELIST", "a[1-"), ("SLURM_NODEID", "1")]),
        )
        .unwrap_err()
        .to_string();
        assert!(e.contains("cannot be parsed"), "{e}");
    }

    #[test]
    fn nodelists() {
        let x = |s: &str| expand_nodelist(s).unwrap();
        assert_eq!(
            x("gpu[01-03,07],login1"),
            ["gpu01", "gpu02", "gpu03", "gpu07", "login1"]
        );
        assert_eq!(x("node1"), ["node1"]);
        assert_eq!(x("a1,b2"), ["a1", "b2"]);
        assert_eq!(x("n[8-11]"), ["n8", "n9", "n10", "n11"]);
        assert_eq!(x("n[098-101]"), ["n098", "n099", "n100", "n101"]);
        assert_eq!(
            x("rack[1-2]-node[01-02]"),
            [
                "rack1-node01",
                "rack1-node02",
                "rack2-node01",
                "rack2-node02"
            ]
        );
        assert_eq!(x("gpu-[3]-ib,cpu[5,1]"), ["gpu-3-ib", "cpu5", "cpu1"]);
        assert_eq!(
            x("h[1-2].cluster.local"),
            ["h1.cluster.local", "h2.cluster.local"]
        );
        assert_eq!(first_host("dgx[002-004,010]").unwrap(), "dgx002");
        for bad in [
            "",
            "n[1-",
            "n]1",
            "n[a-b]",
            "n[3-1]",
            "n[1-99999999]",
            "n[,]",
        ] {
            assert!(expand_nodelist(bad).is_err(), "{bad}");
        }
    }
}
