//! CPU collectives for data-parallel ranks: all-reduce (sum) and broadcast over TCP.
//!
//! A star through rank 0: every rank sends its buffer to rank 0, which adds them in rank order
//! and sends the result back. That is `2 × (world − 1)` transfers through one node — slower than
//! a ring for many ranks, but simple, obviously correct, and deterministic (the sum order is
//! fixed), which is what CPU ranks are for: tests and small runs. GPU ranks would use NCCL, with
//! its unique id exchanged through the controller the same way this root address is.

use crate::wire::{bytes_f32, f32_bytes, Conn, WireError};
use serde::{Deserialize, Serialize};
use std::net::TcpListener;
use std::time::{Duration, Instant};

#[derive(Serialize, Deserialize)]
struct Join {
    secret: String,
    rank: usize,
}

/// One rank's handle on its group.
pub struct StarGroup {
    rank: usize,
    world: usize,
    /// On rank 0: connections to ranks 1.., in rank order. Elsewhere: empty.
    peers: Vec<Conn>,
    /// Elsewhere: the connection to rank 0.
    root: Option<Conn>,
}

/// Rank 0's listening socket, bound before the other ranks are told where to connect.
pub struct RootListener {
    listener: TcpListener,
    /// The address the other ranks dial (`advertise_ip:port`).
    pub addr: String,
}

impl RootListener {
    /// Binds on all interfaces; `advertise_ip` is the node's address as the cluster sees it.
    pub fn bind(advertise_ip: &str) -> Result<Self, WireError> {
        let listener = TcpListener::bind("0.0.0.0:0").map_err(|source| WireError::Io { peer: "0.0.0.0:0".into(), source })?;
        let port = listener.local_addr().map_err(|source| WireError::Io { peer: "listener".into(), source })?.port();
        Ok(Self { listener, addr: format!("{advertise_ip}:{port}") })
    }

    /// Accepts ranks `1..world` (any order), checking the secret; gives up after `timeout`.
    pub fn accept(self, world: usize, secret: &str, timeout: Duration) -> Result<StarGroup, WireError> {
        let deadline = Instant::now() + timeout;
        let proto = |msg: String| WireError::Protocol { peer: self.addr.clone(), msg };
        self.listener.set_nonblocking(true).map_err(|source| WireError::Io { peer: self.addr.clone(), source })?;
        let mut slots: Vec<Option<Conn>> = (1..world).map(|_| None).collect();
        let mut joined = 0;
        while joined + 1 < world {
            match self.listener.accept() {
                Ok((s, _)) => {
                    s.set_nonblocking(false).map_err(|source| WireError::Io { peer: self.addr.clone(), source })?;
                    let mut c = Conn::new(s);
                    let (j, _): (Join, _) = c.recv()?;
                    if j.secret != secret {
                        tracing::warn!(peer = c.peer(), "collective: connection with a wrong secret refused");
                        continue;
                    }
                    if j.rank == 0 || j.rank >= world || slots[j.rank - 1].is_some() {
                        return Err(proto(format!("collective: unexpected rank {} joined a group of {world}", j.rank)));
                    }
                    slots[j.rank - 1] = Some(c);
                    joined += 1;
                }
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                    if Instant::now() > deadline {
                        return Err(proto(format!(
                            "collective: only {}/{} ranks joined within {}s",
                            joined + 1,
                            world,
                            timeout.as_secs()
                        )));
                    }
                    std::thread::sleep(Duration::from_millis(20));
                }
                Err(source) => return Err(WireError::Io { peer: self.addr.clone(), source }),
            }
        }
        Ok(StarGroup { rank: 0, world, peers: slots.into_iter().flatten().collect(), root: None })
    }
}

impl StarGroup {
    /// A group of one: every collective is a no-op.
    pub fn single() -> Self {
        Self { rank: 0, world: 1, peers: Vec::new(), root: None }
    }

    /// Joins rank 0 at `addr` as `rank`.
    pub fn connect(addr: &str, rank: usize, world: usize, secret: &str, timeout: Duration) -> Result<Self, WireError> {
        let mut c = Conn::connect(addr, timeout)?;
        c.send(&Join { secret: secret.into(), rank }, &[])?;
        Ok(Self { rank, world, peers: Vec::new(), root: Some(c) })
    }

    /// This rank.
    pub fn rank(&self) -> usize {
        self.rank
    }

    /// Ranks in the group.
    pub fn world(&self) -> usize {
        self.world
    }

    /// Replaces `buf` on every rank with the element-wise sum over ranks, added in rank order.
    pub fn all_reduce_sum(&mut self, buf: &mut [f32]) -> Result<(), WireError> {
        if self.world == 1 {
            return Ok(());
        }
        // A rank waiting here for a slow or stuck peer shows as `all-reduce` to the watchdog.
        crate::activity::within("all-reduce", || self.all_reduce_ranks(buf))
    }

    fn all_reduce_ranks(&mut self, buf: &mut [f32]) -> Result<(), WireError> {
        let n = buf.len();
        let bad = |peer: &str, msg: String| WireError::Protocol { peer: peer.into(), msg };
        if let Some(root) = self.root.as_mut() {
            root.send(&n, &f32_bytes(buf))?;
            let (m, bytes): (usize, _) = root.recv()?;
            let v = bytes_f32(&bytes).map_err(|e| bad(root.peer(), e))?;
            if m != n || v.len() != n {
                return Err(bad(root.peer(), format!("all-reduce: sent {n} values, got {}", v.len())));
            }
            buf.copy_from_slice(&v);
            return Ok(());
        }
        for p in &mut self.peers {
            let (m, bytes): (usize, _) = p.recv()?;
            let v = bytes_f32(&bytes).map_err(|e| bad(p.peer(), e))?;
            if m != n || v.len() != n {
                return Err(bad(p.peer(), format!("all-reduce: rank sent {} values, expected {n} (ranks disagree on the model)", v.len())));
            }
            for (a, b) in buf.iter_mut().zip(&v) {
                *a += b;
            }
        }
        let out = f32_bytes(buf);
        for p in &mut self.peers {
            p.send(&n, &out)?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn all_reduce_sums_in_rank_order_on_every_rank() {
        let world = 3;
        let root = RootListener::bind("127.0.0.1").unwrap();
        let addr = root.addr.clone();
        let handles: Vec<_> = (1..world)
            .map(|r| {
                let addr = addr.clone();
                std::thread::spawn(move || {
                    let mut g = StarGroup::connect(&addr, r, world, "s3cret", Duration::from_secs(5)).unwrap();
                    let mut v = vec![r as f32, 10.0 * r as f32];
                    g.all_reduce_sum(&mut v).unwrap();
                    v
                })
            })
            .collect();
        let mut g = root.accept(world, "s3cret", Duration::from_secs(5)).unwrap();
        let mut v = vec![0.5, 0.25];
        g.all_reduce_sum(&mut v).unwrap();
        assert_eq!(v, vec![3.5, 30.25]);
        for h in handles {
            assert_eq!(h.join().unwrap(), vec![3.5, 30.25]);
        }
    }

    #[test]
    fn wrong_secret_is_refused_and_missing_ranks_time_out() {
        let root = RootListener::bind("127.0.0.1").unwrap();
        let addr = root.addr.clone();
        let t = std::thread::spawn(move || {
            let _ = StarGroup::connect(&addr, 1, 2, "wrong", Duration::from_secs(5));
        });
        let err = root.accept(2, "right", Duration::from_millis(800)).err().unwrap().to_string();
        assert!(err.contains("only 1/2 ranks joined"), "{err}");
        t.join().unwrap();
    }
}
