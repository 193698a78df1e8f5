//! Framed messages between the controller and its workers over TCP.
//!
//! A frame is a small JSON header (easy to debug, versioned by serde) followed by an optional raw
//! byte payload, so weights and gradients never go through JSON. Every connection starts with a
//! [`Hello`] carrying the run's secret: the control plane of a run accepts only its own workers.

use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};
use std::io::{Read, Write};
use std::net::TcpStream;
use std::time::Duration;

const MAGIC: &[u8; 4] = b"RFW1";
/// Headers are control data; anything larger is a bug or a stranger on the port.
const MAX_HEADER: u32 = 256 << 20;
/// Payloads carry weights; 64 GiB bounds a corrupt length without limiting real models.
const MAX_PAYLOAD: u64 = 64 << 30;

/// What can go wrong on a connection.
#[derive(Debug, thiserror::Error)]
pub enum WireError {
    /// The peer went away or the socket failed.
    #[error("connection to {peer}: {source}")]
    Io {
        /// Who we were talking to.
        peer: String,
        /// The socket error.
        source: std::io::Error,
    },
    /// Bytes that are not a Reinforge frame.
    #[error("connection to {peer}: {msg}")]
    Protocol {
        /// Who we were talking to.
        peer: String,
        /// What was wrong.
        msg: String,
    },
}

/// The first frame a worker sends.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Hello {
    /// The run's secret, from the launcher's environment.
    pub secret: String,
    /// Worker-group name.
    pub group: String,
    /// Rank within the group.
    pub rank: usize,
    /// Process id on its node.
    pub pid: u32,
    /// Host name of its node.
    pub host: String,
    /// This connection carries only [`Beat`]s (each worker opens one beside its request
    /// connection), so the controller notices a silent worker within seconds.
    #[serde(default)]
    pub heartbeat: bool,
}

/// A worker's periodic "still here", on its heartbeat connection, with what it is doing.
#[derive(Debug, Clone, Serialize, Deserialize, Default)]
pub struct Beat {
    /// Counts up from 0.
    pub seq: u64,
    /// What the worker is doing ([`crate::activity`]).
    #[serde(default)]
    pub activity: String,
    /// Seconds it has been doing it.
    #[serde(default)]
    pub activity_s: f64,
    /// Its threads' stacks, once after a [`StackRequest`].
    #[serde(default)]
    pub stacks: Option<String>,
    /// Sent right before taking its stacks: gdb will stop the worker, this heartbeat thread
    /// included, for up to this many seconds, and the controller waits that much longer before
    /// calling it lost (until the beat that carries the stacks).
    #[serde(default)]
    pub pause_s: Option<f64>,
}

/// The controller asks a worker for its threads' stacks (on the heartbeat connection).
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct StackRequest {
    /// Why (printed at the top of the dump).
    pub reason: String,
}

/// One end of a framed connection.
pub struct Conn {
    stream: TcpStream,
    peer: String,
}

impl Conn {
    /// Wraps a connected stream (Nagle off: requests are latency-bound).
    pub fn new(stream: TcpStream) -> Self {
        let _ = stream.set_nodelay(true);
        let peer = stream.peer_addr().map(|a| a.to_string()).unwrap_or_else(|_| "?".into());
        Self { stream, peer }
    }

    /// Connects to `addr`, giving up after `timeout`.
    pub fn connect(addr: &str, timeout: Duration) -> Result<Self, WireError> {
        use std::net::ToSocketAddrs;
        let io = |source| WireError::Io { peer: addr.to_string(), source };
        let sa = addr
            .to_socket_addrs()
            .map_err(io)?
            .next()
            .ok_or_else(|| WireError::Protocol { peer: addr.into(), msg: "address does not resolve".into() })?;
        Ok(Self::new(TcpStream::connect_timeout(&sa, timeout).map_err(io)?))
    }

    /// The peer's address, for messages.
    pub fn peer(&self) -> &str {
        &self.peer
    }

    /// A second handle on the same socket (to shut it down from another thread).
    pub fn try_clone_stream(&self) -> std::io::Result<TcpStream> {
        self.stream.try_clone()
    }

    /// Sends one frame.
    pub fn send<T: Serialize>(&mut self, header: &T, payload: &[u8]) -> Result<(), WireError> {
        let h = serde_json::to_vec(header).map_err(|e| WireError::Protocol { peer: self.peer.clone(), msg: e.to_string() })?;
        let mut head = Vec::with_capacity(16 + h.len());
        head.extend_from_slice(MAGIC);
        head.extend_from_slice(&(h.len() as u32).to_le_bytes());
        head.extend_from_slice(&(payload.len() as u64).to_le_bytes());
        head.extend_from_slice(&h);
        let peer = self.peer.clone();
        let io = |source| WireError::Io { peer: peer.clone(), source };
        self.stream.write_all(&head).map_err(io)?;
        self.stream.write_all(payload).map_err(io)?;
        self.stream.flush().map_err(io)
    }

    /// Receives one frame: the header and the payload bytes.
    pub fn recv<T: DeserializeOwned>(&mut self) -> Result<(T, Vec<u8>), WireError> {
        let peer = self.peer.clone();
        let io = |source: std::io::Error| match source.kind() {
            // The usual way a peer dies: say so instead of "failed to fill whole buffer".
            std::io::ErrorKind::UnexpectedEof => WireError::Protocol { peer: peer.clone(), msg: "connection closed by the other side".into() },
            _ => WireError::Io { peer: peer.clone(), source },
        };
        let mut fixed = [0u8; 16];
        self.stream.read_exact(&mut fixed).map_err(io)?;
        let bad = |msg: String| WireError::Protocol { peer: self.peer.clone(), msg };
        if &fixed[..4] != MAGIC {
            return Err(bad("not a Reinforge worker frame (wrong magic)".into()));
        }
        let hlen = u32::from_le_bytes([fixed[4], fixed[5], fixed[6], fixed[7]]);
        let plen = u64::from_le_bytes(fixed[8..16].try_into().unwrap_or([0; 8]));
        if hlen > MAX_HEADER || plen > MAX_PAYLOAD {
            return Err(bad(format!("frame too large (header {hlen} B, payload {plen} B)")));
        }
        let mut h = vec![0u8; hlen as usize];
        self.stream.read_exact(&mut h).map_err(io)?;
        let mut p = vec![0u8; plen as usize];
        self.stream.read_exact(&mut p).map_err(io)?;
        let header = serde_json::from_slice(&h).map_err(|e| bad(format!("bad header: {e}")))?;
        Ok((header, p))
    }
}

/// `f32`s as little-endian bytes (the payload format for gradients and weights).
pub fn f32_bytes(v: &[f32]) -> Vec<u8> {
    let mut out = Vec::with_capacity(v.len() * 4);
    for x in v {
        out.extend_from_slice(&x.to_le_bytes());
    }
    out
}

/// The inverse of [`f32_bytes`].
pub fn bytes_f32(b: &[u8]) -> Result<Vec<f32>, String> {
    if !b.len().is_multiple_of(4) {
        return Err(format!("{} bytes is not a whole number of f32s", b.len()));
    }
    Ok(b.chunks_exact(4).map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]])).collect())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::net::TcpListener;

    #[test]
    fn frames_round_trip_and_reject_strangers() {
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = l.local_addr().unwrap().to_string();
        let t = std::thread::spawn(move || {
            let mut c = Conn::connect(&addr, Duration::from_secs(5)).unwrap();
            c.send(&serde_json::json!({"op": "hi", "n": 3}), &f32_bytes(&[1.5, -2.0])).unwrap();
            let (h, p): (serde_json::Value, _) = c.recv().unwrap();
            assert_eq!(h["ok"], true);
            assert!(p.is_empty());
        });
        let mut s = Conn::new(l.accept().unwrap().0);
        let (h, p): (serde_json::Value, _) = s.recv().unwrap();
        assert_eq!(h["n"], 3);
        assert_eq!(bytes_f32(&p).unwrap(), vec![1.5, -2.0]);
        s.send(&serde_json::json!({"ok": true}), &[]).unwrap();
        t.join().unwrap();

        let addr = l.local_addr().unwrap().to_string();
        let t = std::thread::spawn(move || {
            let mut raw = TcpStream::connect(addr).unwrap();
            raw.write_all(b"GET / HTTP/1.1\r\n\r\n").unwrap();
        });
        let mut s = Conn::new(l.accept().unwrap().0);
        let err = s.recv::<serde_json::Value>().err().unwrap().to_string();
        assert!(err.contains("wrong magic"), "{err}");
        t.join().unwrap();
        assert!(bytes_f32(&[0, 1, 2]).is_err());
    }
}
