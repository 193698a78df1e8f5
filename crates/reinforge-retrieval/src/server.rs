//! The HTTP server: `POST /retrieve` (Search-R1's API, [`crate::api`]) and `GET /health`.
//!
//! Searches run on the blocking pool, at most `threads` at a time (a semaphore): many
//! concurrent clients queue for the CPU instead of oversubscribing it, and the async workers
//! stay free to accept connections. Bad requests get a 4xx with `{"error": "…"}` saying what
//! is wrong; bodies over the limit get 413. Ctrl-C or SIGTERM stops accepting, lets the
//! requests in flight finish, and returns.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Instant;

use axum::body::Bytes;
use axum::extract::{DefaultBodyLimit, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use serde_json::json;

use crate::api::{ErrorBody, Hits, RetrieveRequest, RetrieveResponse, ScoredDoc};
use crate::index::Retriever;
use crate::{Result, RetrievalError};

/// How the server runs.
#[derive(Debug, Clone)]
pub struct ServeOptions {
    /// Address to bind (Search-R1's server binds 0.0.0.0).
    pub host: String,
    /// Port (Search-R1's: 8000; 0 picks a free one).
    pub port: u16,
    /// Passages per query when a request gives no `topk`.
    pub topk: usize,
    /// The largest `topk` a request may ask for.
    pub max_topk: usize,
    /// The most queries one request may carry.
    pub max_queries: usize,
    /// The largest request body, in bytes.
    pub max_body_bytes: usize,
    /// Searches running at once (and the runtime's worker threads).
    pub threads: usize,
}

impl Default for ServeOptions {
    fn default() -> Self {
        Self { host: "0.0.0.0".into(), port: 8000, topk: 3, max_topk: 1000, max_queries: 4096, max_body_bytes: 4 << 20, threads: 2 }
    }
}

struct AppState {
    retriever: Arc<Retriever>,
    opts: ServeOptions,
    permits: tokio::sync::Semaphore,
    started: Instant,
    /// Requests answered with results, and the queries they held (for `/health`).
    requests: AtomicU64,
    queries: AtomicU64,
}

fn error(status: StatusCode, msg: impl Into<String>) -> Response {
    (status, Json(ErrorBody { error: msg.into() })).into_response()
}

async fn retrieve(State(s): State<Arc<AppState>>, body: Bytes) -> Response {
    let req: RetrieveRequest = match serde_json::from_slice(&body) {
        Ok(r) => r,
        Err(e) => {
            return error(
                StatusCode::BAD_REQUEST,
                format!("the body is not a retrieval request ({e}); send {{\"queries\": [\"…\"], \"topk\": 3, \"return_scores\": true}}"),
            )
        }
    };
    let k = match req.topk {
        None | Some(0) => s.opts.topk,
        Some(k) if k < 0 => return error(StatusCode::BAD_REQUEST, format!("topk = {k}: use a positive number (or null for the server's {})", s.opts.topk)),
        Some(k) if k as u64 > s.opts.max_topk as u64 => {
            return error(StatusCode::BAD_REQUEST, format!("topk = {k} is over this server's limit of {} (--max-topk)", s.opts.max_topk))
        }
        Some(k) => k as usize,
    };
    if req.queries.len() > s.opts.max_queries {
        return error(
            StatusCode::BAD_REQUEST,
            format!("{} queries in one request, over this server's limit of {} (--max-queries): split the batch", req.queries.len(), s.opts.max_queries),
        );
    }
    if req.queries.is_empty() {
        return Json(RetrieveResponse { result: Vec::new() }).into_response();
    }
    let Ok(_permit) = s.permits.acquire().await else {
        return error(StatusCode::SERVICE_UNAVAILABLE, "the server is stopping");
    };
    let retriever = s.retriever.clone();
    let queries = req.queries;
    s.requests.fetch_add(1, Ordering::Relaxed);
    s.queries.fetch_add(queries.len() as u64, Ordering::Relaxed);
    let found = tokio::task::spawn_blocking(move || retriever.retrieve(&queries, k)).await;
    match found {
        Ok(Ok(hits)) => {
            let result = hits
                .into_iter()
                .map(|hs| {
                    if req.return_scores {
                        Hits::Scored(hs.into_iter().map(|(document, score)| ScoredDoc { document, score }).collect())
                    } else {
                        Hits::Plain(hs.into_iter().map(|(d, _)| d).collect())
                    }
                })
                .collect();
            Json(RetrieveResponse { result }).into_response()
        }
        Ok(Err(e)) => error(StatusCode::INTERNAL_SERVER_ERROR, e.to_string()),
        Err(e) => error(StatusCode::INTERNAL_SERVER_ERROR, format!("search failed: {e}")),
    }
}

async fn health(State(s): State<Arc<AppState>>) -> Response {
    Json(json!({
        "status": "ok",
        "retriever": s.retriever.kind().to_string(),
        "passages": s.retriever.len(),
        "index": s.retriever.dir().display().to_string(),
        "topk": s.opts.topk,
        "uptime_s": s.started.elapsed().as_secs_f64(),
        "requests": s.requests.load(Ordering::Relaxed),
        "queries": s.queries.load(Ordering::Relaxed),
    }))
    .into_response()
}

async fn not_found() -> Response {
    error(StatusCode::NOT_FOUND, "not found: the retrieval server answers POST /retrieve and GET /health")
}

/// Resolves when Ctrl-C or SIGTERM arrives.
async fn shutdown_signal() {
    let ctrl_c = async {
        let _ = tokio::signal::ctrl_c().await;
    };
    #[cfg(unix)]
    let term = async {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut s) => {
                s.recv().await;
            }
            Err(_) => std::future::pending::<()>().await,
        }
    };
    #[cfg(not(unix))]
    let term = std::future::pending::<()>();
    tokio::select! {
        _ = ctrl_c => {},
        _ = term => {},
    }
}

/// Serves `retriever` until Ctrl-C/SIGTERM (or until `stop` resolves, for tests). `ready` is
/// called with the bound address once the server accepts connections.
pub fn serve(
    retriever: Arc<Retriever>,
    opts: ServeOptions,
    ready: impl FnOnce(SocketAddr),
    stop: Option<tokio::sync::oneshot::Receiver<()>>,
) -> Result<()> {
    let threads = opts.threads.max(1);
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(threads)
        .max_blocking_threads(threads * 4)
        .enable_io()
        .enable_time()
        .build()
        .map_err(|e| RetrievalError::Server(format!("cannot start the server's runtime: {e}")))?;
    rt.block_on(async move {
        let addr = format!("{}:{}", opts.host, opts.port);
        let listener = tokio::net::TcpListener::bind(&addr).await.map_err(|e| {
            RetrievalError::Server(if e.kind() == std::io::ErrorKind::AddrInUse {
                format!("port {} is already in use on {}: stop what runs there, or pick another with --port", opts.port, opts.host)
            } else {
                format!("cannot listen on {addr}: {e}")
            })
        })?;
        let local = listener.local_addr().map_err(|e| RetrievalError::Server(e.to_string()))?;
        let state = Arc::new(AppState {
            retriever,
            permits: tokio::sync::Semaphore::new(threads),
            started: Instant::now(),
            opts: opts.clone(),
            requests: AtomicU64::new(0),
            queries: AtomicU64::new(0),
        });
        let app = Router::new()
            .route("/retrieve", post(retrieve))
            .route("/health", get(health))
            .fallback(not_found)
            .layer(DefaultBodyLimit::max(opts.max_body_bytes))
            .with_state(state);
        ready(local);
        let shutdown = async move {
            match stop {
                Some(rx) => {
                    tokio::select! {
                        _ = rx => {},
                        _ = shutdown_signal() => {},
                    }
                }
                None => shutdown_signal().await,
            }
        };
        axum::serve(listener, app)
            .with_graceful_shutdown(shutdown)
            .await
            .map_err(|e| RetrievalError::Server(format!("the server stopped: {e}")))
    })
}
