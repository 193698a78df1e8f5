//! Errors of cluster bring-up, the jobs client and status. Every message is one line that says
//! what went wrong, where, and how to fix it, because the CLI prints it as is.

use std::path::PathBuf;

/// Everything that can go wrong while driving Ray.
#[derive(Debug, thiserror::Error)]
pub enum ClusterError {
    /// No `ray` executable was found.
    #[error("Ray is not installed ({tried}); install it with `pip install -r python/requirements.txt` (i.e. `pip install '{requirement}'`) or point REINFORGE_RAY at the `ray` executable")]
    RayMissing { tried: String, requirement: String },

    /// This node's Ray is older than token auth and the user did not opt out.
    #[error("Ray {version} has no token auth (Ray ≥ 2.52 has it): run this cluster without auth with --no-auth (or REINFORGE_NO_AUTH=1; anyone who reaches its ports can run code), or install Ray {pinned} (`pip install -r python/requirements.txt`) on every node")]
    NoTokenAuth { version: String, pinned: String },

    /// A `ray` subcommand failed.
    #[error("`{command}` failed: {detail}")]
    RayCommand { command: String, detail: String },

    /// A port this node needs is already taken.
    #[error("port {port} ({what}) is already in use on this machine; see who holds it with `ss -ltnp 'sport = :{port}'`, stop it (`reinforge cluster stop` if it is an old Ray), or pick another port with {flag}")]
    PortInUse {
        port: u16,
        what: String,
        flag: String,
    },

    /// Flags or launcher environment variables are contradictory or incomplete.
    #[error("{0}")]
    Usage(String),

    /// The head never answered within the wait.
    #[error("no Ray head answered at {address} within {waited_s} s ({last_error}); start it with `reinforge cluster start --head` there, check the address and that the port is reachable from this node, or wait longer with --wait SECS")]
    HeadUnreachable {
        address: String,
        waited_s: u64,
        last_error: String,
    },

    /// Something answers at the address but it is not a Ray head.
    #[error("{address} answers but is not a Ray head ({detail}); pass the head's Ray port (`--port` of `cluster start --head`, default 6379), not the dashboard's")]
    NotRayHead { address: String, detail: String },

    /// The head's Ray port answers but its dashboard does not.
    #[error("the Ray head at {address} answers but its dashboard at {url} does not ({detail}); pass the head's dashboard port with --dashboard-port (default 8265)")]
    DashboardMissing {
        address: String,
        url: String,
        detail: String,
    },

    /// The cluster runs without token auth and the user did not opt out explicitly.
    #[error("{what} at {url} runs without token auth (anyone who reaches it can run code); restart it with token auth (`reinforge cluster start --head` without --no-auth) or accept this explicitly with {flag}")]
    AuthDisabled {
        what: String,
        url: String,
        flag: String,
    },

    /// The cluster requires a token and none is available here.
    #[error("the Ray cluster at {url} requires a token and none was found (--token, RAY_AUTH_TOKEN, RAY_AUTH_TOKEN_PATH, ~/.ray/auth_token); `reinforge cluster start --head` prints it on the head (it is in ~/.ray/auth_token there): pass RAY_AUTH_TOKEN=<token>")]
    NoToken { url: String },

    /// The cluster requires a token and the request had none (HTTP 401).
    #[error("the Ray cluster at {url} needs a token (HTTP 401) and none was sent; set RAY_AUTH_TOKEN=<token> (printed by `reinforge cluster start --head`, stored in ~/.ray/auth_token on the head) or pass --token")]
    Unauthorized { url: String },

    /// The token was rejected (HTTP 403).
    #[error("the Ray cluster at {url} rejected the token from {source_desc} (HTTP 403); use the head's token (printed by `reinforge cluster start --head`, stored in ~/.ray/auth_token on the head)")]
    TokenRejected { url: String, source_desc: String },

    /// The head requires a token but `--no-auth` was given.
    #[error("the Ray head at {url} requires token auth but --no-auth was given; drop --no-auth and pass the head's token (RAY_AUTH_TOKEN=<token>)")]
    AuthRequired { url: String },

    /// Nothing answers at the dashboard URL.
    #[error("no Ray dashboard at {url} ({detail}); is the head up? (`reinforge cluster status`), pass --address http://HEAD:8265")]
    NoDashboard { url: String, detail: String },

    /// A job id the dashboard does not know.
    #[error("no job {id} on {url}; see the jobs with `reinforge job list --address {url}`")]
    JobNotFound { id: String, url: String },

    /// The dashboard answered with an unexpected status or body.
    #[error("{method} {url} failed: {detail}")]
    Http {
        method: String,
        url: String,
        detail: String,
    },

    /// A local file operation failed.
    #[error("{what} {}: {source}", path.display())]
    Io {
        what: String,
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },

    /// Waited for something that did not happen in time.
    #[error("{0}")]
    Timeout(String),
}

/// Shorthand for results of this crate.
pub type Result<T, E = ClusterError> = std::result::Result<T, E>;

impl ClusterError {
    /// A usage error (flags, environment) with its one-line message.
    pub fn usage(msg: impl Into<String>) -> Self {
        ClusterError::Usage(msg.into())
    }

    /// An I/O error with what was being done and on which path.
    pub fn io(what: impl Into<String>, path: impl Into<PathBuf>, source: std::io::Error) -> Self {
        ClusterError::Io {
            what: what.into(),
            path: path.into(),
            source,
        }
    }
}
