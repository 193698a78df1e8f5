//! What this process is doing now and since when (`generate`, `update`, `all-reduce`, ...), and
//! its threads' stacks on request: a worker sends both with its heartbeats, and the controller's
//! stall watchdog names them when a step takes too long.

use std::sync::Mutex;
use std::time::{Duration, Instant};

static CURRENT: Mutex<Option<(String, Instant)>> = Mutex::new(None);

/// Marks the start of `activity` (replacing the current one).
pub fn set(activity: &str) {
    if let Ok(mut c) = CURRENT.lock() {
        *c = Some((activity.to_string(), Instant::now()));
    }
}

/// The current activity and how long it has run (`idle` before the first).
pub fn current() -> (String, Duration) {
    match CURRENT.lock().ok().and_then(|c| c.clone()) {
        Some((a, since)) => (a, since.elapsed()),
        None => ("idle".into(), Duration::ZERO),
    }
}

/// Runs `activity` inside the current one (an all-reduce inside an update), then returns to
/// the outer activity with its original start time.
pub fn within<T>(activity: &str, f: impl FnOnce() -> T) -> T {
    let outer = CURRENT.lock().ok().and_then(|c| c.clone());
    set(activity);
    let out = f();
    if let Ok(mut c) = CURRENT.lock() {
        *c = outer;
    }
    out
}

/// Lets a helper process read this one's stacks (Yama's `ptrace_scope = 1` otherwise allows
/// only ancestors to attach, and the helper is our child).
pub fn allow_stack_dumps() {
    // SAFETY: prctl with PR_SET_PTRACER takes a pid (or ANY) and touches no memory of ours.
    unsafe {
        libc::prctl(libc::PR_SET_PTRACER, libc::PR_SET_PTRACER_ANY, 0, 0, 0);
    }
}

/// The longest gdb may read this process's stacks before `timeout` stops it.
pub const STACKS_LIMIT: Duration = Duration::from_secs(60);

/// How much longer than its limit a stack dump may keep this process stopped: `timeout`'s 5 s
/// grace before KILL, and gdb's start.
pub const STACKS_SLACK: Duration = Duration::from_secs(10);

/// Every thread's stack of this process: `gdb` when the machine has it (symbolised frames),
/// else what `/proc` tells about each thread (name, state, the kernel function it waits in).
///
/// gdb stops every thread of this process while it reads them, heartbeats included, for up to
/// `limit` + [`STACKS_SLACK`]; a `limit` under a second skips gdb.
pub fn stacks(limit: Duration) -> String {
    let pid = std::process::id();
    let mut out = format!("# threads of pid {pid} ({})\n", reinforge_lease::hostname());
    let why_not_gdb = if limit >= Duration::from_secs(1) {
        // `-k`: a gdb stuck attaching ignores timeout's SIGTERM (seen in CI: the run stayed
        // stopped under ptrace for 12 minutes); KILL ends it, and the process goes on.
        let secs = limit.as_secs().to_string();
        // One gdb at a time: a second one attaching to a process under ptrace is refused.
        static ONE_GDB: Mutex<()> = Mutex::new(());
        let _one = ONE_GDB.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
        match run_to_files(std::process::Command::new("timeout").args([
            "-k",
            "5",
            &secs,
            "gdb",
            "-p",
            &pid.to_string(),
            "-batch",
            "-nx",
            "-ex",
            "set pagination off",
            "-ex",
            "thread apply all bt",
        ])) {
            Ok((status, stdout, stderr)) => {
                let text = String::from_utf8_lossy(&stdout);
                if status.success() && text.contains("Thread ") {
                    out += "# from gdb\n";
                    out += &text;
                    return out;
                }
                // Say why, so a dump from /proc on a machine with gdb can be understood.
                // The cause (ptrace refused, attach failed, gdb missing) rather than gdb's last
                // words; the last line when none of those is said.
                let err = String::from_utf8_lossy(&stderr);
                let lines: Vec<&str> = err.lines().map(str::trim).filter(|l| !l.is_empty()).collect();
                let cause = lines
                    .iter()
                    .find(|l| ["ptrace", "Could not attach", "not permitted", "failed to run"].iter().any(|k| l.contains(k)))
                    .or(lines.last())
                    .copied()
                    .unwrap_or("no message");
                // `timeout -k` ends by sending KILL to its own process group, itself included.
                use std::os::unix::process::ExitStatusExt;
                match (status.code(), status.signal()) {
                    (Some(124 | 137), _) | (_, Some(libc::SIGKILL)) => format!("gdb timed out after {secs}s: {cause}"),
                    _ => format!("gdb gave no stacks ({status}): {cause}"),
                }
            }
            Err(e) => format!("`timeout` (which runs gdb) could not start: {e}"),
        }
    } else {
        format!("gdb not used: its limit here, {:.1}s, is too short", limit.as_secs_f64())
    };
    out += &format!("# from /proc ({why_not_gdb})\n");
    let Ok(tasks) = std::fs::read_dir("/proc/self/task") else { return out };
    let mut tids: Vec<u32> = tasks.filter_map(|e| e.ok()?.file_name().to_str()?.parse().ok()).collect();
    tids.sort_unstable();
    for tid in tids {
        let read = |f: &str| std::fs::read_to_string(format!("/proc/self/task/{tid}/{f}")).unwrap_or_default();
        let stat = read("stat");
        // The state letter follows the parenthesised name, which may itself hold spaces.
        let state = stat.rsplit_once(')').and_then(|(_, r)| r.split_whitespace().next()).unwrap_or("?").to_string();
        out += &format!("thread {tid} {:?} state {state} waiting in {}\n", read("comm").trim(), read("wchan").trim());
    }
    out
}

/// Runs `cmd` with its output in unnamed temporary files rather than pipes: gdb stops every
/// thread of this process, the one that would drain a pipe included, so more stack text than a
/// pipe holds would leave gdb blocked writing until `timeout` killed it.
fn run_to_files(cmd: &mut std::process::Command) -> std::io::Result<(std::process::ExitStatus, Vec<u8>, Vec<u8>)> {
    use std::io::{Read, Seek};
    let (mut out, mut err) = (tempfile::tempfile()?, tempfile::tempfile()?);
    let status = cmd.stdin(std::process::Stdio::null()).stdout(out.try_clone()?).stderr(err.try_clone()?).status()?;
    let read = |f: &mut std::fs::File| -> std::io::Result<Vec<u8>> {
        let mut bytes = Vec::new();
        f.rewind()?;
        f.read_to_end(&mut bytes)?;
        Ok(bytes)
    };
    Ok((status, read(&mut out)?, read(&mut err)?))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn activities_nest_and_stacks_list_threads() {
        set("update");
        std::thread::sleep(Duration::from_millis(20));
        let inner = within("all-reduce", current);
        assert_eq!(inner.0, "all-reduce");
        let (a, d) = current();
        assert_eq!(a, "update");
        assert!(d >= Duration::from_millis(20), "the outer activity keeps its start time");
        allow_stack_dumps();
        let s = stacks(STACKS_LIMIT);
        assert!(s.contains(&format!("pid {}", std::process::id())), "{s}");
        assert!(s.contains("thread") || s.contains("Thread"), "{s}");
    }

    /// gdb stops every thread of this process, the one reading its output included: more
    /// stack text than a pipe holds (64 KiB; a rank with many threads in deep frames) must not
    /// leave gdb blocked on a full pipe until `timeout` kills it (CI at 21d0719).
    #[test]
    fn stacks_larger_than_a_pipe_come_from_gdb() {
        if std::process::Command::new("gdb").arg("--version").output().is_err() {
            eprintln!("skipped: no gdb on this machine (`apt-get install gdb`)");
            return;
        }
        fn deep(n: u32, rx: &std::sync::mpsc::Receiver<()>) -> u32 {
            if n == 0 {
                let _ = rx.recv();
                return 0;
            }
            1 + deep(std::hint::black_box(n - 1), rx)
        }
        let threads: Vec<_> = (0..64)
            .map(|_| {
                let (tx, rx) = std::sync::mpsc::channel::<()>();
                (tx, std::thread::spawn(move || deep(40, &rx)))
            })
            .collect();
        allow_stack_dumps();
        let started = Instant::now();
        let s = stacks(STACKS_LIMIT);
        let took = started.elapsed();
        for (tx, t) in threads {
            drop(tx);
            let _ = t.join();
        }
        assert!(s.len() > 100_000, "{} bytes of stacks: more threads or deeper frames needed: {}", s.len(), &s[..s.len().min(1500)]);
        assert!(s.contains("# from gdb"), "{}", &s[..s.len().min(2000)]);
        assert!(took < Duration::from_secs(30), "gdb took {took:?}");
    }
}
