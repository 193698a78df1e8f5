//! The cluster token of Ray's token auth (`RAY_AUTH_MODE=token`): where it is read from, in the
//! same order Ray reads it (after an explicit `--token`), and how a new one is made and stored.

use crate::error::{ClusterError, Result};
use std::fmt;
use std::io::Write;
use std::path::{Path, PathBuf};

/// Where a token came from (shown in messages so a rejected token can be traced).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum TokenSource {
    /// `--token` on the command line.
    Flag,
    /// The `RAY_AUTH_TOKEN` environment variable.
    Env,
    /// The file named by `RAY_AUTH_TOKEN_PATH`.
    EnvPath(PathBuf),
    /// `~/.ray/auth_token`.
    DefaultFile(PathBuf),
}

impl fmt::Display for TokenSource {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            TokenSource::Flag => write!(f, "--token"),
            TokenSource::Env => write!(f, "RAY_AUTH_TOKEN"),
            TokenSource::EnvPath(p) => write!(f, "RAY_AUTH_TOKEN_PATH={}", p.display()),
            TokenSource::DefaultFile(p) => write!(f, "{}", p.display()),
        }
    }
}

/// A token and where it came from.
#[derive(Clone, PartialEq, Eq)]
pub struct Token {
    /// The secret itself.
    pub value: String,
    /// Where it was found.
    pub source: TokenSource,
}

impl fmt::Debug for Token {
    // Never print the secret in logs or panics.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Token")
            .field("value", &"<redacted>")
            .field("source", &self.source)
            .finish()
    }
}

/// Loads the token: `explicit` (`--token`), then `RAY_AUTH_TOKEN`, then the file at
/// `RAY_AUTH_TOKEN_PATH`, then `~/.ray/auth_token`. `Ok(None)` when there is none; an error only
/// when `RAY_AUTH_TOKEN_PATH` names a file that cannot be read (the user asked for it).
pub fn load(explicit: Option<&str>) -> Result<Option<Token>> {
    load_with(explicit, &|k| std::env::var(k).ok())
}

/// [`load`] with the environment injected (for tests).
pub fn load_with(
    explicit: Option<&str>,
    env: &dyn Fn(&str) -> Option<String>,
) -> Result<Option<Token>> {
    if let Some(t) = explicit.map(str::trim).filter(|t| !t.is_empty()) {
        return Ok(Some(Token {
            value: t.to_string(),
            source: TokenSource::Flag,
        }));
    }
    if let Some(t) = env("RAY_AUTH_TOKEN")
        .map(|t| t.trim().to_string())
        .filter(|t| !t.is_empty())
    {
        return Ok(Some(Token {
            value: t,
            source: TokenSource::Env,
        }));
    }
    if let Some(p) = env("RAY_AUTH_TOKEN_PATH").filter(|p| !p.is_empty()) {
        let p = PathBuf::from(p);
        let text = std::fs::read_to_string(&p).map_err(|e| {
            ClusterError::io(
                "cannot read the token file named by RAY_AUTH_TOKEN_PATH (fix or unset it):",
                &p,
                e,
            )
        })?;
        let t = text.trim();
        if !t.is_empty() {
            return Ok(Some(Token {
                value: t.to_string(),
                source: TokenSource::EnvPath(p),
            }));
        }
    }
    if let Some(p) = default_token_path_with(env) {
        if let Ok(text) = std::fs::read_to_string(&p) {
            let t = text.trim();
            if !t.is_empty() {
                return Ok(Some(Token {
                    value: t.to_string(),
                    source: TokenSource::DefaultFile(p),
                }));
            }
        }
    }
    Ok(None)
}

/// `~/.ray/auth_token`, where Ray looks for the token by default.
pub fn default_token_path() -> Option<PathBuf> {
    default_token_path_with(&|k| std::env::var(k).ok())
}

fn default_token_path_with(env: &dyn Fn(&str) -> Option<String>) -> Option<PathBuf> {
    env("HOME")
        .filter(|h| !h.is_empty())
        .map(|h| PathBuf::from(h).join(".ray").join("auth_token"))
}

/// A new random token: 32 random bytes as 64 hex digits (what Ray's `secrets.token_hex(32)` makes).
pub fn generate() -> String {
    let bytes: [u8; 32] = rand::random();
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// Writes `token` to `path` atomically (temporary file + rename) with mode 0600, creating the
/// directory; a crash leaves either the old file or the new one, never half a token.
pub fn save(token: &str, path: &Path) -> Result<()> {
    let dir = path.parent().unwrap_or(Path::new("."));
    std::fs::create_dir_all(dir)
        .map_err(|e| ClusterError::io("cannot create the token directory", dir, e))?;
    let tmp = dir.join(format!(".auth_token.tmp.{}", std::process::id()));
    let write = || -> std::io::Result<()> {
        let mut opts = std::fs::OpenOptions::new();
        opts.write(true).create(true).truncate(true);
        #[cfg(unix)]
        {
            use std::os::unix::fs::OpenOptionsExt;
            opts.mode(0o600);
        }
        let mut f = opts.open(&tmp)?;
        f.write_all(token.as_bytes())?;
        f.sync_all()?;
        std::fs::rename(&tmp, path)?;
        Ok(())
    };
    write().map_err(|e| {
        let _ = std::fs::remove_file(&tmp);
        ClusterError::io("cannot write the cluster token to", path, e)
    })
}

/// The token for a new head: an existing one (same order as [`load`]) or a new one saved at
/// `~/.ray/auth_token`. Returns the token and whether it was created.
pub fn load_or_create(explicit: Option<&str>) -> Result<(Token, bool)> {
    if let Some(t) = load(explicit)? {
        return Ok((t, false));
    }
    let path = default_token_path()
        .ok_or_else(|| ClusterError::usage("cannot store a new cluster token: HOME is not set; set HOME or pass RAY_AUTH_TOKEN=<token>"))?;
    let value = generate();
    save(&value, &path)?;
    tracing::debug!(path = %path.display(), "generated a new cluster token");
    Ok((
        Token {
            value,
            source: TokenSource::DefaultFile(path),
        },
        true,
    ))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;

    fn env_of(pairs: &[(&str, String)]) -> impl Fn(&str) -> Option<String> {
        let m: HashMap<String, String> = pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.clone()))
            .collect();
        move |k| m.get(k).cloned()
    }

    #[test]
    fn load_order() {
        let dir = tempfile::tempdir().unwrap();
        let home = dir.path().join("home");
        std::fs::create_dir_all(home.join(".ray")).unwrap();
        std::fs::write(home.join(".ray/auth_token"), "from-home\n").unwrap();
        let path_file = dir.path().join("tok");
        std::fs::write(&path_file, "  from-path  \n").unwrap();
        let h = home.to_string_lossy().to_string();
        let p = path_file.to_string_lossy().to_string();

        let all = env_of(&[
            ("HOME", h.clone()),
            ("RAY_AUTH_TOKEN_PATH", p.clone()),
            ("RAY_AUTH_TOKEN", "from-env".into()),
        ]);
        let t = load_with(Some("from-flag"), &all).unwrap().unwrap();
        assert_eq!(
            (t.value.as_str(), &t.source),
            ("from-flag", &TokenSource::Flag)
        );
        let t = load_with(None, &all).unwrap().unwrap();
        assert_eq!(
            (t.value.as_str(), &t.source),
            ("from-env", &TokenSource::Env)
        );
        let t = load_with(Some("  "), &all).unwrap().unwrap();
        assert_eq!(t.source, TokenSource::Env, "a blank --token does not count");

        let no_env = env_of(&[
            ("HOME", h.clone()),
            ("RAY_AUTH_TOKEN_PATH", p.clone()),
            ("RAY_AUTH_TOKEN", "".into()),
        ]);
        let t = load_with(None, &no_env).unwrap().unwrap();
        assert_eq!(
            (t.value.as_str(), &t.source),
            ("from-path", &TokenSource::EnvPath(path_file.clone()))
        );

        let home_only = env_of(&[("HOME", h.clone())]);
        let t = load_with(None, &home_only).unwrap().unwrap();
        assert_eq!(t.value, "from-home");
        assert!(matches!(t.source, TokenSource::DefaultFile(_)));

        let nothing = env_of(&[(
            "HOME",
            dir.path().join("empty").to_string_lossy().to_string(),
        )]);
        assert!(load_with(None, &nothing).unwrap().is_none());

        let bad_path = env_of(&[("RAY_AUTH_TOKEN_PATH", "/nonexistent/tok".into())]);
        let e = load_with(None, &bad_path).unwrap_err().to_string();
        assert!(
            e.contains("RAY_AUTH_TOKEN_PATH") && e.contains("/nonexistent/tok"),
            "{e}"
        );
    }

    #[test]
    fn generate_and_save() {
        let a = generate();
        assert_eq!(a.len(), 64);
        assert!(a.chars().all(|c| c.is_ascii_hexdigit()));
        assert_ne!(a, generate());
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("sub/.ray/auth_token");
        save(&a, &p).unwrap();
        assert_eq!(std::fs::read_to_string(&p).unwrap(), a);
        #[cfg(unix)]
        {
            use std::os::unix::fs::PermissionsExt;
            assert_eq!(
                std::fs::metadata(&p).unwrap().permissions().mode() & 0o777,
                0o600
            );
        }
        save("second", &p).unwrap();
        assert_eq!(std::fs::read_to_string(&p).unwrap(), "second");
        assert_eq!(
            std::fs::read_dir(p.parent().unwrap()).unwrap().count(),
            1,
            "no temporary file left"
        );
        assert!(!format!(
            "{:?}",
            Token {
                value: a.clone(),
                source: TokenSource::Env
            }
        )
        .contains(&a));
    }
}
