//! Who a process is, in terms another process can check: host name, pid, the pid's start time,
//! and the kernel boot and pid namespace that give the pid its meaning.
//!
//! A pid names a process only on one boot of one machine and inside one pid namespace
//! (containers on one host reuse pids and often share the host name). Two identities whose
//! boot id and pid namespace agree can be checked against `/proc` directly; any others can only
//! be judged by their heartbeat.

use serde::{Deserialize, Serialize};
use std::fs;
use std::time::{SystemTime, UNIX_EPOCH};

/// The process that holds (or held) a lease.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Identity {
    /// Host name.
    pub host: String,
    /// Process id (meaningful with `boot_id` and `pid_ns`).
    pub pid: u32,
    /// The process's start time in clock ticks since boot (`/proc/<pid>/stat` field 22), which
    /// tells a live process from a later one that reused its pid.
    #[serde(default)]
    pub pid_start_ticks: Option<u64>,
    /// The kernel's boot id (`/proc/sys/kernel/random/boot_id`).
    #[serde(default)]
    pub boot_id: Option<String>,
    /// The pid namespace (`readlink /proc/self/ns/pid`, e.g. `pid:[4026531836]`).
    #[serde(default)]
    pub pid_ns: Option<String>,
    /// When the process took the lease (Unix seconds).
    pub started_unix: f64,
    /// The Ray job it runs as, when it runs as one.
    #[serde(default)]
    pub job_id: Option<String>,
    /// Its command line, for people reading the lease file.
    #[serde(default)]
    pub command: String,
}

impl Identity {
    /// This process, optionally running as Ray job `job_id`.
    pub fn current(job_id: Option<String>) -> Identity {
        let pid = std::process::id();
        Identity {
            host: hostname(),
            pid,
            pid_start_ticks: process_state(pid).and_then(|s| s.start_ticks),
            boot_id: fs::read_to_string("/proc/sys/kernel/random/boot_id").ok().map(|s| s.trim().to_string()),
            pid_ns: fs::read_link("/proc/self/ns/pid").ok().map(|p| p.display().to_string()),
            started_unix: unix_now(),
            job_id,
            command: std::env::args().collect::<Vec<_>>().join(" "),
        }
    }

    /// Whether `/proc` on this machine can say if `other` is alive: same boot, same pid namespace.
    pub fn can_check(&self, other: &Identity) -> bool {
        self.boot_id.is_some() && self.boot_id == other.boot_id && self.pid_ns.is_some() && self.pid_ns == other.pid_ns
    }

    /// `Some(false)` when the process is certainly gone (checked through `/proc`, which needs
    /// [`can_check`](Self::can_check) from `observer`), `Some(true)` when it runs, `None` when
    /// this machine cannot tell.
    pub fn is_alive_seen_from(&self, observer: &Identity) -> Option<bool> {
        if !observer.can_check(self) {
            return None;
        }
        Some(match process_state(self.pid) {
            None => false,
            Some(s) if s.zombie => false,
            // A different start time: the pid now belongs to another process.
            Some(s) => self.pid_start_ticks.is_none() || s.start_ticks.is_none() || s.start_ticks == self.pid_start_ticks,
        })
    }

    /// "pid 123 on host h, Ray job j, started 5m ago".
    pub fn describe(&self) -> String {
        let mut s = format!("pid {} on host {}", self.pid, self.host);
        if let Some(j) = &self.job_id {
            s.push_str(&format!(", Ray job {j}"));
        }
        s.push_str(&format!(", started {} ago", fmt_age(unix_now() - self.started_unix)));
        s
    }

    /// How to stop that run, for an error message.
    pub fn stop_hint(&self) -> String {
        match &self.job_id {
            Some(j) => format!("`reinforge job stop {j}`"),
            None => format!("`kill {}` on {}", self.pid, self.host),
        }
    }
}

/// What `/proc/<pid>/stat` says about a process.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ProcessState {
    /// Killed but not yet reaped (state `Z` or `X`).
    pub zombie: bool,
    /// Start time in clock ticks since boot (field 22).
    pub start_ticks: Option<u64>,
}

/// The state of process `pid` on this machine, `None` if there is no such process (or no `/proc`).
pub fn process_state(pid: u32) -> Option<ProcessState> {
    let stat = fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // Fields after the command name, which is in parentheses and may itself hold spaces.
    let Some(after_comm) = stat.rfind(')').map(|i| &stat[i + 1..]) else {
        return Some(ProcessState { zombie: false, start_ticks: None });
    };
    let fields: Vec<&str> = after_comm.split_whitespace().collect();
    // fields[0] is field 3 of proc(5), the state; fields[19] is field 22, the start time.
    Some(ProcessState {
        zombie: matches!(fields.first(), Some(&"Z") | Some(&"X")),
        start_ticks: fields.get(19).and_then(|s| s.parse().ok()),
    })
}

/// Boot time in Unix seconds, from `/proc/stat`'s `btime` line.
pub fn boot_time_secs() -> Option<u64> {
    let stat = fs::read_to_string("/proc/stat").ok()?;
    stat.lines().find_map(|l| l.strip_prefix("btime ")).and_then(|v| v.trim().parse().ok())
}

/// This machine's host name, reduced to characters safe in a file name.
pub fn hostname() -> String {
    let raw = fs::read_to_string("/proc/sys/kernel/hostname")
        .or_else(|_| fs::read_to_string("/etc/hostname"))
        .ok()
        .or_else(|| std::env::var("HOSTNAME").ok())
        .or_else(|| std::env::var("COMPUTERNAME").ok())
        .unwrap_or_default();
    let clean: String = raw
        .trim()
        .chars()
        .map(|c| if c.is_ascii_alphanumeric() || c == '-' || c == '_' || c == '.' { c } else { '_' })
        .collect();
    if clean.is_empty() {
        "localhost".to_string()
    } else {
        clean
    }
}

/// Seconds since the Unix epoch (0 if the clock is before 1970).
pub fn unix_now() -> f64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map(|d| d.as_secs_f64()).unwrap_or(0.0)
}

/// `42s`, `5m07s`, `3h12m`.
pub fn fmt_age(secs: f64) -> String {
    let s = secs.max(0.0).round() as u64;
    match s {
        0..=59 => format!("{s}s"),
        60..=3599 => format!("{}m{:02}s", s / 60, s % 60),
        _ => format!("{}h{:02}m", s / 3600, (s % 3600) / 60),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn this_process_is_alive_and_checkable() {
        let me = Identity::current(None);
        if cfg!(target_os = "linux") {
            assert!(me.can_check(&me));
            assert_eq!(me.is_alive_seen_from(&me), Some(true));
            // Same pid, another start time: a reused pid, so the holder is gone.
            let reused = Identity { pid_start_ticks: me.pid_start_ticks.map(|t| t + 1), ..me.clone() };
            assert_eq!(reused.is_alive_seen_from(&me), Some(false));
            let other_machine = Identity { boot_id: Some("another-boot".into()), ..me.clone() };
            assert_eq!(other_machine.is_alive_seen_from(&me), None);
        }
    }

    #[test]
    fn ages() {
        assert_eq!(fmt_age(0.4), "0s");
        assert_eq!(fmt_age(59.0), "59s");
        assert_eq!(fmt_age(307.0), "5m07s");
        assert_eq!(fmt_age(3600.0 * 3.0 + 720.0), "3h12m");
        assert_eq!(fmt_age(-5.0), "0s");
    }
}
