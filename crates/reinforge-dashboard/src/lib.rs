//! Seeing a run. Its live page: the training controller serves it while it trains
//! (`trainer.dashboard`), and `reinforge dashboard RUN_DIR...` serves finished or remote runs,
//! several overlaid. And [`plot`]: the same curves as a PNG or SVG figure for reports.
//!
//! One page (`assets/`, compiled into the binary: no CDN, works offline) polls a small JSON
//! API and draws every metric of `metrics.jsonl` with [uPlot](https://github.com/leeoniya/uPlot)
//! (vendored at 1.6.32 with its MIT licence, `assets/vendor/`), grouped like verl's names, with
//! smoothing, a step or time axis and runs overlaid; beside them the resolved config, where
//! every rank runs and what it is doing, the checkpoints, the last validation, the last log
//! lines and the logged samples, searchable.
//!
//! ```text
//! GET /                               the page
//! GET /assets/NAME                    its scripts and styles (a fixed list: nothing else is read)
//! GET /api/runs                       [{"id", "name", "dir"}]
//! GET /api/runs/ID/metrics?since=N&file=F   {"rows": [...], "next": M, "reset": false, "file": F}
//! GET /api/runs/ID/samples?since=N    the same for samples.jsonl
//! GET /api/runs/ID/status             config, placement, ranks, checkpoints, log tail
//! ```
//!
//! It binds 127.0.0.1 by default; bound anywhere else it requires a token (the cluster's, as
//! Ray's own dashboard does) on every API request (`Authorization: Bearer T`, or `?token=T`
//! in the page's URL, which the page passes on). It only reads the run directory.
//!
//! Dependencies: tokio + axum (HTTP), serde_json, plotters (figures) with an embedded font.
//! Nothing of the trainer: the page reads the files a run writes, so it works the same for a
//! running, finished or remote run.

#![warn(missing_docs)]

pub mod plot;
pub mod rundir;

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;

use axum::extract::{Path as UrlPath, Query, State};
use axum::http::{header, HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::{Json, Router};
use serde::Deserialize;
use serde_json::json;

pub use rundir::Run;

/// Dashboard errors, each one line: what, where, how to fix.
#[derive(Debug, thiserror::Error)]
pub enum DashboardError {
    /// The address cannot be bound.
    #[error("{0}")]
    Bind(String),
    /// Not served without a token.
    #[error("{0}")]
    Token(String),
    /// The runtime or server failed.
    #[error("{0}")]
    Server(String),
    /// A figure could not be drawn.
    #[error("{0}")]
    Plot(String),
}

/// Result type of this crate.
pub type Result<T, E = DashboardError> = std::result::Result<T, E>;

/// How the page is served.
#[derive(Debug, Clone)]
pub struct DashboardOptions {
    /// Address to bind; anything but loopback needs `token`.
    pub host: String,
    /// Port (0: any free one).
    pub port: u16,
    /// When the port is taken, take a free one instead of failing (the trainer's page).
    pub any_port_if_taken: bool,
    /// Required on every API request when set.
    pub token: Option<String>,
}

impl Default for DashboardOptions {
    fn default() -> Self {
        Self { host: "127.0.0.1".into(), port: DEFAULT_PORT, any_port_if_taken: false, token: None }
    }
}

/// The page's default port (Ray's dashboard is 8265).
pub const DEFAULT_PORT: u16 = 8266;

/// One asset: its path under `/assets/`, content type, bytes.
const ASSETS: &[(&str, &str, &[u8])] = &[
    ("app.js", "text/javascript; charset=utf-8", include_bytes!("../assets/app.js")),
    ("app.css", "text/css; charset=utf-8", include_bytes!("../assets/app.css")),
    ("uPlot.iife.min.js", "text/javascript; charset=utf-8", include_bytes!("../assets/vendor/uplot-1.6.32/uPlot.iife.min.js")),
    ("uPlot.min.css", "text/css; charset=utf-8", include_bytes!("../assets/vendor/uplot-1.6.32/uPlot.min.css")),
    ("uPlot-LICENSE.txt", "text/plain; charset=utf-8", include_bytes!("../assets/vendor/uplot-1.6.32/LICENSE")),
];

const INDEX: &str = include_str!("../assets/index.html");

struct App {
    runs: Vec<Run>,
    token: Option<String>,
    index: rundir::RowIndex,
}

fn not_found() -> Response {
    (StatusCode::NOT_FOUND, Json(json!({"error": "not found: the page is at /, its data under /api/runs"}))).into_response()
}

/// Whether a request carries the token (when one is required).
fn authorized(app: &App, headers: &HeaderMap, query: &Option<String>) -> bool {
    let Some(want) = &app.token else { return true };
    let bearer = headers.get(header::AUTHORIZATION).and_then(|v| v.to_str().ok()).and_then(|v| v.strip_prefix("Bearer "));
    // Compared in full either way, so a wrong token's length or prefix says nothing.
    let same = |got: &str| got.len() == want.len() && got.bytes().zip(want.bytes()).fold(0u8, |acc, (a, b)| acc | (a ^ b)) == 0;
    bearer.is_some_and(same) || query.as_deref().is_some_and(same)
}

#[derive(Deserialize)]
struct Since {
    since: Option<usize>,
    file: Option<String>,
    token: Option<String>,
}

#[derive(Deserialize)]
struct TokenOnly {
    token: Option<String>,
}

fn unauthorized() -> Response {
    (StatusCode::UNAUTHORIZED, Json(json!({"error": "this page needs the cluster token: open the URL with ?token=TOKEN (printed where the page was started)"}))).into_response()
}

async fn index() -> Response {
    ([(header::CONTENT_TYPE, "text/html; charset=utf-8"), (header::CACHE_CONTROL, "no-cache")], INDEX).into_response()
}

async fn asset(UrlPath(name): UrlPath<String>) -> Response {
    match ASSETS.iter().find(|(n, _, _)| *n == name) {
        Some((_, ty, bytes)) => ([(header::CONTENT_TYPE, *ty), (header::CACHE_CONTROL, "max-age=3600")], *bytes).into_response(),
        None => not_found(),
    }
}

async fn list_runs(State(app): State<Arc<App>>, headers: HeaderMap, Query(q): Query<TokenOnly>) -> Response {
    if !authorized(&app, &headers, &q.token) {
        return unauthorized();
    }
    let list: Vec<_> = app.runs.iter().enumerate().map(|(i, r)| json!({"id": i, "name": r.name, "dir": r.dir.display().to_string()})).collect();
    Json(list).into_response()
}

async fn run_data(State(app): State<Arc<App>>, UrlPath((id, what)): UrlPath<(usize, String)>, headers: HeaderMap, Query(q): Query<Since>) -> Response {
    if !authorized(&app, &headers, &q.token) {
        return unauthorized();
    }
    let Some(run) = app.runs.get(id) else { return not_found() };
    let dir = run.dir.clone();
    let since = q.since.unwrap_or(0);
    // Reading the files is blocking I/O: off the async workers.
    let body = match what.as_str() {
        "metrics" | "samples" => {
            let app = app.clone();
            tokio::task::spawn_blocking(move || app.index.rows(&dir.join(format!("{what}.jsonl")), since, q.file.as_deref())).await
        }
        "status" => tokio::task::spawn_blocking(move || rundir::status(&dir)).await,
        _ => return not_found(),
    };
    match body {
        Ok(v) => ([(header::CACHE_CONTROL, "no-store")], Json(v)).into_response(),
        Err(e) => (StatusCode::INTERNAL_SERVER_ERROR, Json(json!({"error": e.to_string()}))).into_response(),
    }
}

fn is_loopback(host: &str) -> bool {
    host == "localhost" || host.parse::<std::net::IpAddr>().is_ok_and(|a| a.is_loopback())
}

/// Binds the listener (checking the token rule first).
async fn bind(opts: &DashboardOptions) -> Result<tokio::net::TcpListener> {
    if !is_loopback(&opts.host) && opts.token.is_none() {
        return Err(DashboardError::Token(format!(
            "the page bound to {} would show the run to anyone who reaches it: give it the cluster token (--token, RAY_AUTH_TOKEN or ~/.ray/auth_token), or bind 127.0.0.1 and tunnel (ssh -L {}:127.0.0.1:{} HOST)",
            opts.host, opts.port, opts.port
        )));
    }
    match tokio::net::TcpListener::bind((opts.host.as_str(), opts.port)).await {
        Ok(l) => Ok(l),
        Err(e) if e.kind() == std::io::ErrorKind::AddrInUse && opts.any_port_if_taken => tokio::net::TcpListener::bind((opts.host.as_str(), 0))
            .await
            .map_err(|e| DashboardError::Bind(format!("cannot listen on {}: {e}", opts.host))),
        Err(e) if e.kind() == std::io::ErrorKind::AddrInUse => Err(DashboardError::Bind(format!(
            "port {} is already in use on {} (another dashboard or run?): pick another with --port",
            opts.port, opts.host
        ))),
        Err(e) => Err(DashboardError::Bind(format!("cannot listen on {}:{}: {e}", opts.host, opts.port))),
    }
}

fn router(runs: Vec<Run>, token: Option<String>) -> Router {
    let app = Arc::new(App { runs, token, index: rundir::RowIndex::default() });
    Router::new()
        .route("/", get(index))
        .route("/assets/{name}", get(asset))
        .route("/api/runs", get(list_runs))
        .route("/api/runs/{id}/{what}", get(run_data))
        .fallback(|| async { not_found() })
        .with_state(app)
}

/// The page's URL for an address (with the token, when one is needed).
pub fn url(addr: SocketAddr, token: Option<&str>) -> String {
    let host = if addr.ip().is_unspecified() { "127.0.0.1".to_string() } else { addr.ip().to_string() };
    match token {
        Some(t) => format!("http://{host}:{}/?token={t}", addr.port()),
        None => format!("http://{host}:{}/", addr.port()),
    }
}

/// Serves `runs` until Ctrl-C/SIGTERM, or `stop`; `ready` gets the bound address.
pub fn serve(runs: Vec<Run>, opts: DashboardOptions, ready: impl FnOnce(SocketAddr), stop: Option<tokio::sync::oneshot::Receiver<()>>) -> Result<()> {
    let rt = runtime()?;
    rt.block_on(async move {
        let listener = bind(&opts).await?;
        let addr = listener.local_addr().map_err(|e| DashboardError::Server(e.to_string()))?;
        ready(addr);
        let shutdown = async move {
            match stop {
                Some(rx) => {
                    let _ = rx.await;
                }
                None => stop_signal().await,
            }
        };
        axum::serve(listener, router(runs, opts.token))
            .with_graceful_shutdown(shutdown)
            .await
            .map_err(|e| DashboardError::Server(format!("the page's server stopped: {e}")))
    })
}

/// Ctrl-C, or SIGTERM (a service manager's stop).
async fn stop_signal() {
    #[cfg(unix)]
    {
        use tokio::signal::unix::{signal, SignalKind};
        if let Ok(mut term) = signal(SignalKind::terminate()) {
            tokio::select! {
                _ = tokio::signal::ctrl_c() => {}
                _ = term.recv() => {}
            }
            return;
        }
    }
    let _ = tokio::signal::ctrl_c().await;
}

fn runtime() -> Result<tokio::runtime::Runtime> {
    // Two workers: the page is a few small JSON reads; the run it shows needs the CPUs.
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .max_blocking_threads(4)
        .thread_name("dashboard")
        .enable_io()
        .enable_time()
        .build()
        .map_err(|e| DashboardError::Server(format!("cannot start the page's runtime: {e}")))
}

/// A page served from a thread of its own (the trainer's); dropping it stops the server.
pub struct Background {
    /// Where it listens.
    pub addr: SocketAddr,
    /// Its URL.
    pub url: String,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
    thread: Option<std::thread::JoinHandle<Result<()>>>,
}

impl Background {
    /// Starts serving `dirs` and returns once the page listens.
    pub fn start(dirs: Vec<PathBuf>, opts: DashboardOptions) -> Result<Self> {
        let token = opts.token.clone();
        let (tx, rx) = tokio::sync::oneshot::channel();
        let (atx, arx) = std::sync::mpsc::channel();
        let runs = Run::from_dirs(&dirs);
        let thread = std::thread::Builder::new()
            .name("dashboard".into())
            .spawn(move || {
                serve(runs, opts, move |a| {
                    let _ = atx.send(a);
                }, Some(rx))
            })
            .map_err(|e| DashboardError::Server(format!("cannot start the page's thread: {e}")))?;
        match arx.recv() {
            Ok(addr) => Ok(Self { addr, url: url(addr, token.as_deref()), stop: Some(tx), thread: Some(thread) }),
            // It failed before listening: its error says why.
            Err(_) => Err(thread.join().map_err(|_| DashboardError::Server("the page's thread panicked".into()))?.err().unwrap_or_else(|| DashboardError::Server("the page did not start".into()))),
        }
    }
}

impl Drop for Background {
    fn drop(&mut self) {
        if let Some(s) = self.stop.take() {
            let _ = s.send(());
        }
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}
