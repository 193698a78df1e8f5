//! What one node knows about itself: `reinforge doctor --probe REQUEST` runs this on every node
//! (a Ray task pinned to the node starts it) and prints [`NodeFacts`] as JSON.
//!
//! Facts only; judging them against the run's needs is [`super::checks`]'s job, on the node
//! that runs `doctor`, so every node is judged by one set of rules.

use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream, ToSocketAddrs, UdpSocket};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

/// Directory (with the session appended), next to the checkpoint directory, where nodes leave
/// their tokens.
pub const TOKEN_DIR: &str = ".reinforge-doctor";

/// How long one TCP reachability test may take: a dropped port shows up as a timeout.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(3);

/// Which part of the shared-directory test a probe runs.
#[derive(Debug, Clone, Copy, Serialize, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "snake_case")]
pub enum Round {
    /// Gather facts and leave this node's token in the shared directory.
    Facts,
    /// List the tokens every node left (after every node ran `Facts`).
    Tokens,
    /// Remove this node's token (and the session directory once empty).
    Cleanup,
}

/// A TCP endpoint a node must reach.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct Target {
    /// What listens there (`Ray GCS`, `Ray dashboard`, `controller`).
    pub name: String,
    /// `HOST:PORT`.
    pub addr: String,
}

/// What `doctor` asks each node to look at.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct ProbeRequest {
    /// Round of the shared-directory test.
    pub round: Round,
    /// Names this doctor run's token directory, so concurrent runs do not mix.
    pub session: String,
    /// The run's checkpoint directory (free space, writable, shared between nodes).
    pub run_dir: Option<PathBuf>,
    /// The head's IP: the route to it names the interface NCCL and Gloo should use.
    pub head_ip: Option<String>,
    /// Endpoints to connect to.
    pub targets: Vec<Target>,
    /// The doctor's clock server (`HOST:PORT`), on the controller's port.
    pub clock: Option<String>,
    /// Whether to look for the CUDA engine's libraries (the run wants GPUs).
    #[serde(default)]
    pub cuda_libs: bool,
}

/// Size and free space of a filesystem.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct Space {
    /// Bytes in the filesystem.
    pub total: u64,
    /// Bytes an unprivileged writer may still use.
    pub free: u64,
}

/// The checkpoint directory as this node sees it.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct DirFacts {
    /// The directory asked about.
    pub path: PathBuf,
    /// The nearest existing ancestor (what was measured when the directory does not exist yet).
    pub existing: PathBuf,
    /// Space there.
    pub space: Option<Space>,
    /// Why this node cannot write there, if it cannot.
    pub write_error: Option<String>,
    /// Tokens seen (round `Tokens`): the node names that wrote one.
    pub tokens: Vec<String>,
}

/// The `reinforge` executable on this node.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct BinaryFacts {
    /// Its path.
    pub path: PathBuf,
    /// SHA-256 of its bytes.
    pub sha256: String,
    /// The crate version it was built from.
    pub version: String,
}

/// The interface the route to the head leaves through.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct RouteFacts {
    /// This node's address on that route.
    pub local_ip: String,
    /// The interface holding that address.
    pub interface: Option<String>,
}

/// One TCP reachability test.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct PortFacts {
    /// What listens there.
    pub name: String,
    /// `HOST:PORT`.
    pub addr: String,
    /// Why the connection failed, if it did.
    pub error: Option<String>,
    /// Milliseconds to connect (or to fail).
    pub ms: f64,
}

/// This node's clock against the doctor's (an NTP-style exchange on the controller's port).
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct ClockFacts {
    /// This node's clock minus the doctor's, in milliseconds.
    pub offset_ms: f64,
    /// The exchange's round trip (the offset's uncertainty is half of it).
    pub rtt_ms: f64,
}

/// GPUs as `nvidia-smi` and the NCCL library on this node report them.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Default)]
pub struct GpuFacts {
    /// GPU names, one per device.
    pub gpus: Vec<String>,
    /// NVIDIA driver version.
    pub driver: Option<String>,
    /// CUDA version the driver supports.
    pub cuda: Option<String>,
    /// NCCL library version found on this node.
    pub nccl: Option<String>,
    /// Why `nvidia-smi` gave nothing (absent, failed).
    pub error: Option<String>,
    /// The CUDA engine's libraries as this node finds them (`None`: not looked for).
    #[serde(default)]
    pub libs: Option<Vec<LibFact>>,
}

/// A CUDA library the engine loads, as a node finds it.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct LibFact {
    /// What it is (`cuBLASLt`, `NVRTC`, `NCCL`).
    pub lib: String,
    /// Whether the engine cannot run without it (without NCCL, GPU ranks sum gradients
    /// through the host).
    pub required: bool,
    /// The file it loaded from (`None` without an error: found by the dynamic loader).
    pub path: Option<String>,
    /// Why it could not be loaded, and where it was looked for.
    pub error: Option<String>,
    /// How to make it available.
    pub fix: Option<String>,
}

/// Looks for the CUDA engine's libraries on this node, for a driver that supports this CUDA
/// major version (0: unknown).
pub type CudaLibProbe = fn(u32) -> Vec<LibFact>;

static CUDA_LIB_PROBE: OnceLock<CudaLibProbe> = OnceLock::new();

/// Sets how probes look for the CUDA libraries: the CLI registers the CUDA engine's own search
/// at start, so the doctor finds them exactly as a training run would (this crate knows
/// nothing of the engine). Without it, probes report no library facts and the check is skipped.
pub fn register_cuda_lib_probe(f: CudaLibProbe) {
    let _ = CUDA_LIB_PROBE.set(f);
}

/// Everything one node reports.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct NodeFacts {
    /// Host name.
    pub hostname: String,
    /// The node's IP as Ray knows it (`REINFORGE_NODE_IP`), else the host name.
    pub node: String,
    /// This executable.
    pub binary: BinaryFacts,
    /// Logical CPUs.
    pub cpus: usize,
    /// `MemTotal` in bytes.
    pub mem_total: u64,
    /// `MemAvailable` in bytes.
    pub mem_available: u64,
    /// `/dev/shm`.
    pub shm: Option<Space>,
    /// The checkpoint directory.
    pub run_dir: Option<DirFacts>,
    /// The route to the head.
    pub route: Option<RouteFacts>,
    /// `NCCL_SOCKET_IFNAME` and `GLOO_SOCKET_IFNAME` as set on this node.
    pub ifname_env: Vec<(String, String)>,
    /// Reachability of the requested endpoints.
    pub ports: Vec<PortFacts>,
    /// Clock offset to the doctor.
    pub clock: Option<ClockFacts>,
    /// GPUs.
    pub gpu: GpuFacts,
    /// Unix time (seconds) when the facts were taken.
    pub unix_time: f64,
}

/// Runs one probe round on this node.
pub fn probe(req: &ProbeRequest) -> NodeFacts {
    let node = std::env::var("REINFORGE_NODE_IP").unwrap_or_else(|_| reinforge_lease::hostname());
    let run_dir = req.run_dir.as_deref().map(|d| dir_facts(d, req.round, &req.session, &node));
    if req.round != Round::Facts {
        // Later rounds only look at the shared directory; the rest was measured in round one.
        return NodeFacts { run_dir, ..NodeFacts::empty(node) };
    }
    let (mem_total, mem_available) = meminfo();
    NodeFacts {
        hostname: reinforge_lease::hostname(),
        binary: binary_facts(),
        cpus: std::thread::available_parallelism().map(|n| n.get()).unwrap_or(1),
        mem_total,
        mem_available,
        shm: space(Path::new("/dev/shm")),
        run_dir,
        route: req.head_ip.as_deref().and_then(route_to),
        ifname_env: ["NCCL_SOCKET_IFNAME", "GLOO_SOCKET_IFNAME"]
            .iter()
            .filter_map(|k| std::env::var(k).ok().map(|v| (k.to_string(), v)))
            .collect(),
        // In parallel: each dropped port costs a whole connect timeout.
        ports: std::thread::scope(|s| {
            let tries: Vec<_> = req.targets.iter().map(|t| s.spawn(move || connect(&t.name, &t.addr))).collect();
            tries.into_iter().zip(&req.targets).map(|(h, t)| h.join().unwrap_or_else(|_| PortFacts { name: t.name.clone(), addr: t.addr.clone(), error: Some("probe thread panicked".into()), ms: 0.0 })).collect()
        }),
        clock: req.clock.as_deref().and_then(|a| clock_offset(a).ok()),
        gpu: gpu_facts(req.cuda_libs),
        unix_time: unix_now(),
        node,
    }
}

impl NodeFacts {
    /// A node that reported nothing but its name.
    pub(crate) fn empty(node: String) -> Self {
        NodeFacts {
            hostname: String::new(),
            node,
            binary: BinaryFacts { path: PathBuf::new(), sha256: String::new(), version: String::new() },
            cpus: 0,
            mem_total: 0,
            mem_available: 0,
            shm: None,
            run_dir: None,
            route: None,
            ifname_env: Vec::new(),
            ports: Vec::new(),
            clock: None,
            gpu: GpuFacts::default(),
            unix_time: unix_now(),
        }
    }
}

fn unix_now() -> f64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map(|d| d.as_secs_f64()).unwrap_or(0.0)
}

/// `MemTotal` and `MemAvailable` from `/proc/meminfo`, in bytes.
pub fn meminfo() -> (u64, u64) {
    let text = std::fs::read_to_string("/proc/meminfo").unwrap_or_default();
    let field = |name: &str| -> u64 {
        text.lines()
            .find_map(|l| l.strip_prefix(name)?.strip_prefix(':'))
            .and_then(|v| v.split_whitespace().next()?.parse::<u64>().ok())
            .map_or(0, |kb| kb * 1024)
    };
    (field("MemTotal"), field("MemAvailable"))
}

/// Size and free space of the filesystem holding `path`.
pub fn space(path: &Path) -> Option<Space> {
    use std::os::unix::ffi::OsStrExt;
    let c = std::ffi::CString::new(path.as_os_str().as_bytes()).ok()?;
    let mut st: libc::statvfs = unsafe { std::mem::zeroed() };
    // SAFETY: `c` is a valid NUL-terminated path and `st` a properly sized out-parameter.
    if unsafe { libc::statvfs(c.as_ptr(), &mut st) } != 0 {
        return None;
    }
    let frsize = st.f_frsize as u64;
    Some(Space { total: st.f_blocks as u64 * frsize, free: st.f_bavail as u64 * frsize })
}

fn nearest_existing(path: &Path) -> PathBuf {
    let mut p = path.to_path_buf();
    while !p.exists() {
        match p.parent() {
            Some(parent) if parent != p => p = parent.to_path_buf(),
            _ => break,
        }
    }
    p
}

/// The shared-directory test writes in the nearest existing ancestor of the run directory, so
/// it creates nothing a run would find later: a directory that does not exist yet is shared when
/// the parent it will be created in is.
fn dir_facts(dir: &Path, round: Round, session: &str, node: &str) -> DirFacts {
    let existing = nearest_existing(dir);
    let tokens_dir = existing.join(format!("{TOKEN_DIR}-{session}"));
    let token = tokens_dir.join(sanitize(node));
    let mut facts = DirFacts { path: dir.into(), existing: existing.clone(), space: space(&existing), write_error: None, tokens: Vec::new() };
    match round {
        Round::Facts => {
            let written = std::fs::create_dir_all(&tokens_dir).and_then(|_| std::fs::write(&token, node));
            facts.write_error = written.err().map(|e| format!("{}: {e}", tokens_dir.display()));
        }
        Round::Tokens => {
            if let Ok(rd) = std::fs::read_dir(&tokens_dir) {
                facts.tokens = rd.filter_map(|e| std::fs::read_to_string(e.ok()?.path()).ok()).collect();
                facts.tokens.sort();
            }
        }
        Round::Cleanup => {
            let _ = std::fs::remove_file(&token);
            // Succeeds for whichever node removes the last token; the others find it non-empty.
            let _ = std::fs::remove_dir(&tokens_dir);
        }
    }
    facts
}

fn sanitize(s: &str) -> String {
    s.chars().map(|c| if c.is_ascii_alphanumeric() || c == '.' || c == '-' { c } else { '_' }).collect()
}

fn binary_facts() -> BinaryFacts {
    let path = std::env::current_exe().unwrap_or_default();
    let sha256 = std::fs::File::open(&path)
        .and_then(|mut f| {
            let mut h = Sha256::new();
            let mut buf = vec![0u8; 1 << 20];
            loop {
                let n = f.read(&mut buf)?;
                if n == 0 {
                    break;
                }
                h.update(&buf[..n]);
            }
            Ok(format!("{:x}", h.finalize()))
        })
        .unwrap_or_else(|e| format!("unreadable: {e}"));
    BinaryFacts { path, sha256, version: env!("CARGO_PKG_VERSION").to_string() }
}

/// The local address and interface of the route to `ip` (a UDP "connect" sends nothing; the
/// kernel picks the source address it would route from).
fn route_to(ip: &str) -> Option<RouteFacts> {
    let sock = UdpSocket::bind("0.0.0.0:0").ok()?;
    sock.connect((ip, 9)).ok()?;
    let local = sock.local_addr().ok()?.ip();
    Some(RouteFacts { local_ip: local.to_string(), interface: interface_of(&local) })
}

/// The name of the interface that holds `ip` (getifaddrs).
fn interface_of(ip: &std::net::IpAddr) -> Option<String> {
    let mut head: *mut libc::ifaddrs = std::ptr::null_mut();
    // SAFETY: getifaddrs fills `head` with a list we free below with freeifaddrs.
    if unsafe { libc::getifaddrs(&mut head) } != 0 {
        return None;
    }
    let mut found = None;
    let mut cur = head;
    while !cur.is_null() {
        // SAFETY: `cur` walks the list getifaddrs returned, which stays valid until freed.
        let ifa = unsafe { &*cur };
        if !ifa.ifa_addr.is_null() && unsafe { (*ifa.ifa_addr).sa_family } as i32 == libc::AF_INET {
            // SAFETY: an AF_INET address is a sockaddr_in.
            let sin = unsafe { &*(ifa.ifa_addr as *const libc::sockaddr_in) };
            let addr = std::net::IpAddr::V4(std::net::Ipv4Addr::from(u32::from_be(sin.sin_addr.s_addr)));
            if &addr == ip {
                // SAFETY: ifa_name is a NUL-terminated C string owned by the list.
                found = Some(unsafe { std::ffi::CStr::from_ptr(ifa.ifa_name) }.to_string_lossy().into_owned());
                break;
            }
        }
        cur = ifa.ifa_next;
    }
    // SAFETY: `head` came from getifaddrs and is freed once.
    unsafe { libc::freeifaddrs(head) };
    found
}

pub(crate) fn connect(name: &str, addr: &str) -> PortFacts {
    let t = Instant::now();
    let error = match addr.to_socket_addrs().map(|mut a| a.next()) {
        Ok(Some(sa)) => TcpStream::connect_timeout(&sa, CONNECT_TIMEOUT).err().map(|e| {
            if e.kind() == std::io::ErrorKind::TimedOut || e.kind() == std::io::ErrorKind::WouldBlock {
                format!("no answer within {}s (a firewall dropping packets?)", CONNECT_TIMEOUT.as_secs())
            } else {
                e.to_string()
            }
        }),
        Ok(None) => Some("does not resolve".into()),
        Err(e) => Some(format!("does not resolve: {e}")),
    };
    PortFacts { name: name.into(), addr: addr.into(), error, ms: t.elapsed().as_secs_f64() * 1e3 }
}

/// This node's clock minus the server's: the server's time against the midpoint of the round
/// trip that fetched it.
fn clock_offset(addr: &str) -> std::io::Result<ClockFacts> {
    let sa: SocketAddr = addr
        .to_socket_addrs()?
        .next()
        .ok_or_else(|| std::io::Error::new(std::io::ErrorKind::NotFound, "does not resolve"))?;
    let mut s = TcpStream::connect_timeout(&sa, CONNECT_TIMEOUT)?;
    s.set_read_timeout(Some(CONNECT_TIMEOUT))?;
    let mut best: Option<ClockFacts> = None;
    // The exchange with the shortest round trip bounds the offset most tightly.
    for _ in 0..5 {
        let t1 = unix_now();
        s.write_all(b"t")?;
        let mut buf = [0u8; 8];
        s.read_exact(&mut buf)?;
        let t3 = unix_now();
        let server = f64::from_bits(u64::from_be_bytes(buf));
        let c = ClockFacts { offset_ms: ((t1 + t3) / 2.0 - server) * 1e3, rtt_ms: (t3 - t1) * 1e3 };
        if best.as_ref().is_none_or(|b| c.rtt_ms < b.rtt_ms) {
            best = Some(c);
        }
    }
    best.ok_or_else(|| std::io::Error::other("no exchange"))
}

/// Answers clock probes on a listener (the controller's port) until dropped.
pub struct ClockServer {
    stop: Arc<AtomicBool>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl ClockServer {
    /// Serves on `listener` (a clone of it: the caller keeps its own).
    pub fn start(listener: &TcpListener) -> std::io::Result<Self> {
        let l = listener.try_clone()?;
        l.set_nonblocking(true)?;
        let stop = Arc::new(AtomicBool::new(false));
        let flag = stop.clone();
        let thread = std::thread::spawn(move || {
            while !flag.load(Ordering::Relaxed) {
                match l.accept() {
                    Ok((conn, _)) => {
                        std::thread::spawn(move || serve_clock(conn));
                    }
                    Err(_) => std::thread::sleep(Duration::from_millis(20)),
                }
            }
        });
        Ok(Self { stop, thread: Some(thread) })
    }
}

fn serve_clock(mut conn: TcpStream) {
    let _ = conn.set_nonblocking(false);
    let _ = conn.set_read_timeout(Some(Duration::from_secs(10)));
    let mut b = [0u8; 1];
    while conn.read_exact(&mut b).is_ok() && b[0] == b't' {
        if conn.write_all(&unix_now().to_bits().to_be_bytes()).is_err() {
            break;
        }
    }
}

impl Drop for ClockServer {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

fn gpu_facts(libs: bool) -> GpuFacts {
    let mut g = GpuFacts { nccl: nccl_version(), ..GpuFacts::default() };
    let out = std::process::Command::new("nvidia-smi").args(["--query-gpu=name,driver_version", "--format=csv,noheader"]).output();
    match out {
        Ok(o) if o.status.success() => {
            for line in String::from_utf8_lossy(&o.stdout).lines().filter(|l| !l.trim().is_empty()) {
                let mut parts = line.split(',').map(str::trim);
                g.gpus.push(parts.next().unwrap_or("?").to_string());
                g.driver = parts.next().map(str::to_string);
            }
            // The CUDA version the driver supports is only in the banner.
            if let Ok(o) = std::process::Command::new("nvidia-smi").output() {
                let text = String::from_utf8_lossy(&o.stdout);
                g.cuda = text.split("CUDA Version:").nth(1).and_then(|r| r.split_whitespace().next()).map(str::to_string);
            }
        }
        Ok(o) => g.error = Some(format!("nvidia-smi failed: {}", String::from_utf8_lossy(&o.stderr).trim())),
        Err(e) => g.error = Some(format!("no nvidia-smi ({e})")),
    }
    if libs {
        let major = g.cuda.as_deref().and_then(|v| v.split('.').next()?.parse().ok()).unwrap_or(0);
        g.libs = CUDA_LIB_PROBE.get().map(|f| f(major));
    }
    g
}

/// The NCCL version from the library's file name (`libnccl.so.2.21.5`), looked for where the
/// CUDA pip wheels and distributions put it.
fn nccl_version() -> Option<String> {
    let mut dirs: Vec<PathBuf> = ["/usr/lib/x86_64-linux-gnu", "/usr/local/cuda/lib64", "/usr/lib64", "/usr/local/lib"].iter().map(PathBuf::from).collect();
    if let Ok(p) = std::env::var("LD_LIBRARY_PATH") {
        dirs.extend(p.split(':').filter(|s| !s.is_empty()).map(PathBuf::from));
    }
    for d in dirs {
        let Ok(rd) = std::fs::read_dir(&d) else { continue };
        for e in rd.flatten() {
            let name = e.file_name().to_string_lossy().into_owned();
            if let Some(v) = name.strip_prefix("libnccl.so.") {
                if v.matches('.').count() >= 2 {
                    return Some(v.to_string());
                }
            }
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn facts_of_this_machine() {
        let dir = tempfile::tempdir().unwrap();
        let run = dir.path().join("runs/x");
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap().to_string();
        let _clock = ClockServer::start(&listener).unwrap();
        let req = |round| ProbeRequest {
            round,
            session: "s1".into(),
            run_dir: Some(run.clone()),
            head_ip: Some("127.0.0.1".into()),
            targets: vec![Target { name: "controller".into(), addr: addr.clone() }, Target { name: "closed".into(), addr: "127.0.0.1:1".into() }],
            clock: Some(addr.clone()),
            cuda_libs: false,
        };
        let f = probe(&req(Round::Facts));
        assert!(f.mem_total > 0 && f.mem_available > 0 && f.mem_available <= f.mem_total);
        assert!(f.cpus >= 1);
        assert_eq!(f.binary.sha256.len(), 64);
        assert_eq!(f.route.as_ref().unwrap().local_ip, "127.0.0.1");
        assert_eq!(f.route.as_ref().unwrap().interface.as_deref(), Some("lo"));
        assert!(f.ports[0].error.is_none(), "{:?}", f.ports[0]);
        assert!(f.ports[1].error.is_some());
        let c = f.clock.unwrap();
        assert!(c.offset_ms.abs() < 1000.0 && c.rtt_ms >= 0.0, "{c:?}");
        let d = f.run_dir.unwrap();
        assert!(d.write_error.is_none() && d.existing == dir.path() && d.space.unwrap().total > 0);
        let t = probe(&req(Round::Tokens));
        assert_eq!(t.run_dir.unwrap().tokens, vec![t.node.clone()]);
        probe(&req(Round::Cleanup));
        assert!(!run.exists(), "the probe creates no run directory");
        assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 0, "the probe leaves nothing behind");
    }
}
