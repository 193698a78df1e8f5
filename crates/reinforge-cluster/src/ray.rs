//! Finding the Ray installation: the `ray` executable, its version (checked against the range
//! Reinforge supports: from verl's floor to the pin in `python/requirements.txt`, the newest
//! tested) and the Python interpreter it runs on.

use crate::error::{ClusterError, Result};
use std::io::Read;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

/// `python/requirements.txt`, the single place where the Ray version is pinned.
const REQUIREMENTS: &str = include_str!("../../../python/requirements.txt");

/// How long `ray --version` may take before we call the installation broken (it takes ~1 s).
const VERSION_TIMEOUT: Duration = Duration::from_secs(60);

/// The oldest Ray Reinforge supports: the floor current verl releases declare
/// (`ray[default]>=2.41.0`), so a cluster set up for verl needs no reinstall. CI runs the Ray
/// tests on it and on the pin.
pub const OLDEST_SUPPORTED: &str = "2.41.0";

/// The first Ray with token auth (`RAY_AUTH_MODE=token`); older clusters run without it, which
/// Reinforge accepts only when told so (`--no-auth`, `--allow-no-auth`, REINFORGE_NO_AUTH=1).
pub const TOKEN_AUTH_SINCE: &str = "2.52.0";

/// `2.41.0` → (2, 41, 0); pre-release or build suffixes are ignored, missing parts are 0.
pub fn version_tuple(v: &str) -> (u64, u64, u64) {
    let mut parts = v.split('.').map(|p| p.chars().take_while(char::is_ascii_digit).collect::<String>().parse().unwrap_or(0));
    (parts.next().unwrap_or(0), parts.next().unwrap_or(0), parts.next().unwrap_or(0))
}

/// Whether Ray `version` is inside the supported range (oldest supported to the pin).
pub fn supported(version: &str) -> bool {
    let v = version_tuple(version);
    version_tuple(OLDEST_SUPPORTED) <= v && v <= version_tuple(pinned_version())
}

/// Whether Ray `version` has token auth.
pub fn has_token_auth(version: &str) -> bool {
    version_tuple(version) >= version_tuple(TOKEN_AUTH_SINCE)
}

/// The pinned Ray requirement line, e.g. `ray[default]==2.60.0`.
pub fn pinned_requirement() -> &'static str {
    parse_pin(REQUIREMENTS)
        .map(|(line, _)| line)
        .unwrap_or("ray[default]")
}

/// The pinned Ray version, e.g. `2.60.0`.
pub fn pinned_version() -> &'static str {
    parse_pin(REQUIREMENTS).map(|(_, v)| v).unwrap_or("unknown")
}

/// Finds the `ray` requirement line and its `==` version in a requirements file.
fn parse_pin(text: &str) -> Option<(&str, &str)> {
    text.lines()
        .map(|l| l.split('#').next().unwrap_or("").trim())
        .filter(|l| {
            let name_end = l
                .find(|c: char| !(c.is_ascii_alphanumeric() || c == '-' || c == '_'))
                .unwrap_or(l.len());
            l[..name_end].eq_ignore_ascii_case("ray")
        })
        .find_map(|l| {
            let (_, v) = l.split_once("==")?;
            let v = v
                .split(|c: char| c == ';' || c.is_whitespace())
                .next()?
                .trim();
            (!v.is_empty()).then_some((l, v))
        })
}

/// A located Ray installation.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RayInstall {
    /// The `ray` executable.
    pub ray: PathBuf,
    /// The Python interpreter that has this Ray installed (runs the launcher).
    pub python: PathBuf,
    /// Ray's version as reported by `ray --version`.
    pub version: String,
}

/// Locates Ray and checks its version; see [`RayInstall::locate`].
pub fn locate() -> Result<RayInstall> {
    RayInstall::locate()
}

impl RayInstall {
    /// `REINFORGE_RAY` (path to `ray`) else `ray` on PATH; runs `ray --version` once and warns
    /// when it is outside the supported range (the APIs Reinforge needs are checked where
    /// they are used: the launcher names a missing one); the Python is the `ray` script's interpreter (its shebang),
    /// else `REINFORGE_PYTHON`, else `python3`.
    pub fn locate() -> Result<RayInstall> {
        Self::locate_with(&|k| std::env::var(k).ok())
    }

    /// [`RayInstall::locate`] with the environment injected (for tests).
    pub fn locate_with(env: &dyn Fn(&str) -> Option<String>) -> Result<RayInstall> {
        let missing = |tried: String| ClusterError::RayMissing {
            tried,
            requirement: pinned_requirement().to_string(),
        };
        let ray = match env("REINFORGE_RAY").filter(|s| !s.is_empty()) {
            Some(p) => {
                let p = PathBuf::from(p);
                if !is_executable(&p) {
                    return Err(missing(format!(
                        "REINFORGE_RAY={} is not an executable file",
                        p.display()
                    )));
                }
                p
            }
            None => find_on_path("ray", env("PATH").as_deref()).ok_or_else(|| {
                missing("no `ray` on PATH and REINFORGE_RAY is not set".to_string())
            })?,
        };
        let version = ray_version(&ray)?;
        if !supported(&version) {
            tracing::warn!(
                "{} is Ray {version}; Reinforge is tested with Ray {OLDEST_SUPPORTED} to {} (`pip install -r python/requirements.txt` installs {})",
                ray.display(),
                pinned_version(),
                pinned_version()
            );
        }
        let python = python_of(&ray, env);
        tracing::debug!(ray = %ray.display(), python = %python.display(), %version, "located Ray");
        Ok(RayInstall {
            ray,
            python,
            version,
        })
    }

    /// Whether this Ray has token auth (Ray ≥ 2.52).
    pub fn has_token_auth(&self) -> bool {
        has_token_auth(&self.version)
    }

    /// A `Command` running this `ray` with the given arguments.
    pub fn command<I, S>(&self, args: I) -> Command
    where
        I: IntoIterator<Item = S>,
        S: AsRef<std::ffi::OsStr>,
    {
        let mut c = Command::new(&self.ray);
        c.args(args);
        c
    }
}

/// Runs `ray --version` (bounded) and extracts the version from "ray, version X".
fn ray_version(ray: &Path) -> Result<String> {
    let cmd = format!("{} --version", ray.display());
    let fail = |detail: String| ClusterError::RayCommand {
        command: cmd.clone(),
        detail,
    };
    let mut child = Command::new(ray)
        .arg("--version")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .map_err(|e| {
            fail(format!(
                "{e}; reinstall Ray with `pip install '{}'`",
                pinned_requirement()
            ))
        })?;
    let status = wait_bounded(&mut child, VERSION_TIMEOUT)
        .map_err(|e| fail(e.to_string()))?
        .ok_or_else(|| {
            fail(format!(
                "no answer within {} s; the installation looks broken",
                VERSION_TIMEOUT.as_secs()
            ))
        })?;
    let mut out = String::new();
    let mut err = String::new();
    if let Some(mut s) = child.stdout.take() {
        let _ = s.read_to_string(&mut out);
    }
    if let Some(mut s) = child.stderr.take() {
        let _ = s.read_to_string(&mut err);
    }
    if !status.success() {
        return Err(fail(format!(
            "{}; reinstall Ray with `pip install '{}'`",
            last_line(&err).unwrap_or("exited with an error"),
            pinned_requirement()
        )));
    }
    parse_version_output(&out).ok_or_else(|| fail(format!("unexpected output {:?}", out.trim())))
}

/// "ray, version 2.60.0" → "2.60.0".
pub(crate) fn parse_version_output(out: &str) -> Option<String> {
    out.lines().find_map(|l| {
        let rest = l.trim().strip_prefix("ray, version ")?;
        rest.split_whitespace().next().map(str::to_string)
    })
}

/// Waits for a child at most `limit`; `None` means it was killed for taking too long.
pub(crate) fn wait_bounded(
    child: &mut std::process::Child,
    limit: Duration,
) -> std::io::Result<Option<std::process::ExitStatus>> {
    let start = Instant::now();
    loop {
        if let Some(s) = child.try_wait()? {
            return Ok(Some(s));
        }
        if start.elapsed() >= limit {
            let _ = child.kill();
            let _ = child.wait();
            return Ok(None);
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// The last non-empty line of a text, trimmed.
pub(crate) fn last_line(s: &str) -> Option<&str> {
    s.lines().rev().map(str::trim).find(|l| !l.is_empty())
}

fn is_executable(p: &Path) -> bool {
    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt;
        p.metadata()
            .map(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
            .unwrap_or(false)
    }
    #[cfg(not(unix))]
    {
        p.is_file()
    }
}

fn find_on_path(name: &str, path: Option<&str>) -> Option<PathBuf> {
    std::env::split_paths(path?)
        .map(|d| d.join(name))
        .find(|p| is_executable(p))
}

/// The interpreter of the `ray` entry-point script: its shebang, or pip's `/bin/sh` trampoline
/// for long interpreter paths; else `REINFORGE_PYTHON`, else `python3`.
fn python_of(ray: &Path, env: &dyn Fn(&str) -> Option<String>) -> PathBuf {
    let head = std::fs::File::open(ray).ok().and_then(|f| {
        let mut buf = Vec::new();
        f.take(4096).read_to_end(&mut buf).ok()?;
        Some(String::from_utf8_lossy(&buf).into_owned())
    });
    if let Some(p) = head
        .as_deref()
        .and_then(|h| interpreter_from_script(h, env("PATH").as_deref()))
    {
        return p;
    }
    match env("REINFORGE_PYTHON").filter(|s| !s.is_empty()) {
        Some(p) => PathBuf::from(p),
        None => PathBuf::from("python3"),
    }
}

/// Parses the interpreter out of a script's first lines (`#!/x/python3`, `#!/usr/bin/env
/// python3`, or pip's `#!/bin/sh` + `'''exec' "/x/python3" "$0" "$@"`).
pub(crate) fn interpreter_from_script(head: &str, path_var: Option<&str>) -> Option<PathBuf> {
    let mut lines = head.lines();
    let first = lines.next()?.strip_prefix("#!")?.trim();
    let mut parts = first.split_whitespace();
    let prog = parts.next()?;
    if prog.ends_with("/env") {
        let name = parts.find(|a| !a.starts_with('-'))?;
        return find_on_path(name, path_var).or_else(|| Some(PathBuf::from(name)));
    }
    if prog.ends_with("/sh") {
        let line = lines.next()?;
        let rest = line.trim().strip_prefix("'''exec' ")?;
        let rest = rest.trim_start();
        let quoted = rest.strip_prefix('"')?;
        let end = quoted.find('"')?;
        return Some(PathBuf::from(&quoted[..end]));
    }
    if prog.contains("python") {
        return Some(PathBuf::from(prog));
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pin_is_parsed_from_requirements() {
        assert!(pinned_requirement().starts_with("ray"));
        assert!(pinned_requirement().contains("=="));
        assert!(
            pinned_version()
                .chars()
                .next()
                .is_some_and(|c| c.is_ascii_digit()),
            "{}",
            pinned_version()
        );
        assert_eq!(
            parse_pin("numpy==1\nray[default]==2.60.0  # pinned\n"),
            Some(("ray[default]==2.60.0", "2.60.0"))
        );
        assert_eq!(parse_pin("raydium==1.0\n"), None);
        assert_eq!(
            parse_pin("ray==2.1.0; python_version>'3'\n").map(|p| p.1),
            Some("2.1.0")
        );
    }

    #[test]
    fn version_output() {
        assert_eq!(
            parse_version_output("ray, version 2.60.0\n").as_deref(),
            Some("2.60.0")
        );
        assert_eq!(
            parse_version_output("warning\nray, version 2.9.3 \n").as_deref(),
            Some("2.9.3")
        );
        assert_eq!(parse_version_output("nonsense"), None);
    }

    #[test]
    fn shebangs() {
        assert_eq!(
            interpreter_from_script("#!/opt/venv/bin/python3\nimport x", None),
            Some("/opt/venv/bin/python3".into())
        );
        assert_eq!(
            interpreter_from_script(
                "#!/bin/sh\n'''exec' \"/very/long/bin/python3.11\" \"$0\" \"$@\"\n' '''\n",
                None
            ),
            Some("/very/long/bin/python3.11".into())
        );
        assert_eq!(
            interpreter_from_script("#!/usr/bin/env python3\n", Some("/nonexistent")),
            Some("python3".into())
        );
        assert_eq!(interpreter_from_script("\x7fELF", None), None);
    }

    #[test]
    fn missing_ray_is_one_line() {
        let env = |k: &str| (k == "REINFORGE_RAY").then(|| "/nonexistent/ray".to_string());
        let e = RayInstall::locate_with(&env).unwrap_err().to_string();
        assert!(e.contains("pip install -r python/requirements.txt"), "{e}");
        assert!(e.contains(pinned_requirement()), "{e}");
        assert!(!e.contains('\n'));
        let env = |k: &str| (k == "PATH").then(|| "/nonexistent".to_string());
        let e = RayInstall::locate_with(&env).unwrap_err().to_string();
        assert!(e.contains("no `ray` on PATH"), "{e}");
    }
}
