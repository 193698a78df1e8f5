//! `reinforge bench retrieval`: queries per second and latency percentiles of a retrieval
//! server at several client concurrencies, over a synthetic corpus (or yours). It starts its
//! own server, or loads any server speaking Search-R1's API (`--url`), which is how
//! `bench/compare_retrieval.py` measures a Python BM25 server with the same load.

use anyhow::{bail, Context, Result};
use clap::Args;
use rand::{Rng, SeedableRng};
use reinforge_retrieval::index::{self, IndexOptions};
use reinforge_retrieval::server::{self, ServeOptions};
use reinforge_retrieval::{Retriever, RetrieverKind};
use serde_json::json;
use std::io::Write;
use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;
use std::time::{Duration, Instant};

#[derive(Args)]
pub struct RetrievalArgs {
    /// Passages of the synthetic corpus (ignored with --corpus or --url).
    #[arg(long, default_value_t = 100_000)]
    passages: usize,
    /// A corpus to index and serve instead of the synthetic one.
    #[arg(long)]
    corpus: Option<PathBuf>,
    /// Write the synthetic corpus here and stop (to serve it with another server).
    #[arg(long)]
    write_corpus: Option<PathBuf>,
    /// Load this server instead of starting one (Search-R1's POST /retrieve).
    #[arg(long)]
    url: Option<String>,
    /// Client concurrencies to measure, comma-separated.
    #[arg(long, default_value = "1,16,256", value_delimiter = ',')]
    clients: Vec<usize>,
    /// Seconds of load per concurrency.
    #[arg(long, default_value_t = 10.0)]
    seconds: f64,
    /// Passages per query.
    #[arg(long, default_value_t = 3)]
    topk: usize,
    /// Queries per request (Search-R1's trainer batches a turn's searches into one).
    #[arg(long, default_value_t = 1)]
    batch: usize,
    /// Search threads of the server started here (default: the CPUs).
    #[arg(long)]
    threads: Option<usize>,
    /// Where the synthetic corpus and its index go (default: a temporary directory).
    #[arg(long)]
    work_dir: Option<PathBuf>,
}

/// Words of the synthetic corpus: a Zipf-like draw over this many distinct words.
const VOCAB: usize = 30_000;

fn word(i: usize) -> String {
    // Pronounceable, distinct, never a stop word: base-20 digits as consonant-vowel pairs.
    const C: &[u8] = b"bdfgklmnprstvz";
    const V: &[u8] = b"aeiou";
    let mut s = String::new();
    let mut n = i + 1;
    while n > 0 {
        s.push(C[n % C.len()] as char);
        n /= C.len();
        s.push(V[n % V.len()] as char);
        n /= V.len();
    }
    s
}

fn zipf(rng: &mut impl Rng) -> usize {
    // Inverse-CDF of a 1/x law over 1..=VOCAB: frequent words dominate as in real text.
    let u: f64 = rng.random();
    ((VOCAB as f64).powf(u) as usize).clamp(1, VOCAB) - 1
}

/// The synthetic corpus: Search-R1's JSONL, `"Title"\ntext` of 40–120 words, seeded.
fn synthetic_corpus(passages: usize) -> String {
    let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(7);
    let mut corpus = String::new();
    for i in 0..passages {
        let len = rng.random_range(40..=120);
        let text: Vec<String> = (0..len).map(|_| word(zipf(&mut rng))).collect();
        let title = format!("{} {}", word(zipf(&mut rng)), word(zipf(&mut rng)));
        corpus.push_str(&json!({"id": i.to_string(), "contents": format!("\"{title}\"\n{}", text.join(" "))}).to_string());
        corpus.push('\n');
    }
    corpus
}

/// Queries of 2–5 words of the synthetic corpus's vocabulary (the same whatever its size).
fn synthetic_queries(n: usize) -> Vec<String> {
    let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(11);
    (0..n).map(|_| (0..rng.random_range(2..=5)).map(|_| word(zipf(&mut rng))).collect::<Vec<_>>().join(" ")).collect()
}

/// One load level's figures.
fn load(url: &str, queries: &[String], clients: usize, seconds: f64, topk: usize, batch: usize) -> Result<serde_json::Value> {
    let start = Instant::now();
    let deadline = start + Duration::from_secs_f64(seconds);
    let queries = Arc::new(queries.to_vec());
    let threads: Vec<_> = (0..clients)
        .map(|c| {
            let (url, queries) = (url.to_string(), queries.clone());
            std::thread::Builder::new().stack_size(256 << 10).spawn(move || -> Result<Vec<f64>, String> {
                let agent: ureq::Agent = ureq::Agent::config_builder().timeout_global(Some(Duration::from_secs(60))).build().into();
                let mut lat = Vec::new();
                let mut i = c * 7919;
                while Instant::now() < deadline {
                    let qs: Vec<&String> = (0..batch).map(|k| &queries[(i + k) % queries.len()]).collect();
                    i += batch;
                    let body = json!({"queries": qs, "topk": topk, "return_scores": true}).to_string();
                    let t = Instant::now();
                    let mut r = agent.post(&url).header("content-type", "application/json").send(&body).map_err(|e| format!("{url}: {e}"))?;
                    let text = r.body_mut().read_to_string().map_err(|e| e.to_string())?;
                    if !text.starts_with("{\"result\"") {
                        return Err(format!("{url} answered {}", text.chars().take(200).collect::<String>()));
                    }
                    lat.push(t.elapsed().as_secs_f64());
                }
                Ok(lat)
            })
        })
        .collect::<std::io::Result<_>>()
        .context("starting client threads")?;
    let mut all = Vec::new();
    for t in threads {
        all.extend(t.join().map_err(|_| anyhow::anyhow!("a client thread panicked"))?.map_err(anyhow::Error::msg)?);
    }
    // Requests sent before the deadline finish after it: throughput is over the whole wall time.
    let wall = start.elapsed().as_secs_f64();
    if all.is_empty() {
        bail!("no request finished in {seconds}s");
    }
    all.sort_by(f64::total_cmp);
    let pct = |p: f64| all[((all.len() as f64 * p) as usize).min(all.len() - 1)] * 1e3;
    let requests = all.len();
    Ok(json!({
        "clients": clients,
        "requests": requests,
        "queries_per_s": (requests * batch) as f64 / wall,
        "wall_s": wall,
        "p50_ms": pct(0.50),
        "p99_ms": pct(0.99),
        "max_ms": all[requests - 1] * 1e3,
    }))
}

pub fn run(a: RetrievalArgs) -> Result<ExitCode> {
    let tmp;
    let work = match &a.work_dir {
        Some(d) => d.clone(),
        None => {
            tmp = tempfile::tempdir().context("a temporary directory")?;
            tmp.path().to_path_buf()
        }
    };
    std::fs::create_dir_all(&work).with_context(|| format!("creating {}", work.display()))?;
    if let Some(path) = &a.write_corpus {
        std::fs::write(path, synthetic_corpus(a.passages)).with_context(|| format!("writing {}", path.display()))?;
        eprintln!("wrote a synthetic corpus of {} passages to {}", a.passages, path.display());
        return Ok(ExitCode::SUCCESS);
    }
    // Queries from a given corpus's titles; over the synthetic corpus (or another server,
    // loaded over it), words of its vocabulary.
    let queries = match &a.corpus {
        Some(c) => {
            let rows = reinforge_retrieval::corpus::read_corpus(c)?;
            rows.iter().step_by((rows.len() / 5000).max(1)).map(|p| p.title().trim_matches('"').to_string()).collect()
        }
        None => synthetic_queries(5000),
    };
    let corpus_path = match (&a.corpus, &a.url) {
        (Some(c), _) => c.clone(),
        (None, Some(_)) => PathBuf::from("(the server's)"),
        (None, None) => {
            let t = Instant::now();
            let path = work.join("corpus.jsonl");
            std::fs::write(&path, synthetic_corpus(a.passages)).with_context(|| format!("writing {}", path.display()))?;
            eprintln!("synthetic corpus: {} passages in {} ({:.1}s)", a.passages, path.display(), t.elapsed().as_secs_f64());
            path
        }
    };
    let threads = a.threads.unwrap_or_else(|| std::thread::available_parallelism().map_or(2, |n| n.get()));
    let mut index_s = None;
    let (url, stop, server) = match &a.url {
        Some(u) => (u.clone(), None, None),
        None => {
            let dir = work.join("index");
            let t = Instant::now();
            index::build(&corpus_path, &dir, &IndexOptions { threads, force: true, ..Default::default() }, &|l| eprintln!("{l}"))?;
            index_s = Some(t.elapsed().as_secs_f64());
            let retriever = Arc::new(Retriever::open(&dir, RetrieverKind::Bm25)?);
            let (tx, rx) = tokio::sync::oneshot::channel();
            let (atx, arx) = std::sync::mpsc::channel();
            let opts = ServeOptions { host: "127.0.0.1".into(), port: 0, threads, ..ServeOptions::default() };
            let h = std::thread::spawn(move || server::serve(retriever, opts, move |addr| { let _ = atx.send(addr); }, Some(rx)));
            let addr = arx.recv_timeout(Duration::from_secs(60)).context("the server did not start")?;
            (format!("http://{addr}/retrieve"), Some(tx), Some(h))
        }
    };
    let mut levels = Vec::new();
    for &c in &a.clients {
        let r = load(&url, &queries, c.max(1), a.seconds, a.topk, a.batch.max(1))?;
        eprintln!("{c:>4} clients: {:.0} queries/s, p50 {:.1} ms, p99 {:.1} ms", r["queries_per_s"].as_f64().unwrap_or(0.0), r["p50_ms"].as_f64().unwrap_or(0.0), r["p99_ms"].as_f64().unwrap_or(0.0));
        levels.push(r);
    }
    if let (Some(tx), Some(h)) = (stop, server) {
        let _ = tx.send(());
        let _ = h.join();
    }
    let out = json!({
        "bench": "retrieval",
        "server": if a.url.is_some() { url.clone() } else { format!("reinforge (bm25, {threads} search threads)") },
        "corpus": corpus_path.display().to_string(),
        "index_seconds": index_s,
        "topk": a.topk,
        "queries_per_request": a.batch,
        "cpu": super::bench::cpu_model(),
        "levels": levels,
    });
    println!("{}", serde_json::to_string(&out)?);
    std::io::stdout().flush().ok();
    Ok(ExitCode::SUCCESS)
}
