//! The retrieval server over a real socket: Search-R1's request/response shapes, BM25 scores
//! against an independent computation, bad requests, many concurrent clients, the client's
//! retries, and a clean stop.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use reinforge_retrieval::index::{self, IndexOptions};
use reinforge_retrieval::server::{self, ServeOptions};
use reinforge_retrieval::{Passage, RetrievalClient, Retriever, RetrieverKind};
use serde_json::{json, Value};

/// A server on a free port over `corpus`, stopped (and joined) when dropped.
struct Running {
    addr: SocketAddr,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
    thread: Option<std::thread::JoinHandle<reinforge_retrieval::Result<()>>>,
    _dir: tempfile::TempDir,
}

impl Drop for Running {
    fn drop(&mut self) {
        if let Some(s) = self.stop.take() {
            let _ = s.send(());
        }
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

fn write_corpus(path: &Path, rows: &[Passage]) {
    let text: String = rows.iter().map(|r| serde_json::to_string(r).unwrap() + "\n").collect();
    std::fs::write(path, text).unwrap();
}

fn start(rows: &[Passage], opts: ServeOptions) -> Running {
    let dir = tempfile::tempdir().unwrap();
    write_corpus(&dir.path().join("corpus.jsonl"), rows);
    index::build(&dir.path().join("corpus.jsonl"), &dir.path().join("idx"), &IndexOptions { threads: 1, ..Default::default() }, &|_| {}).unwrap();
    let retriever = Arc::new(Retriever::open(&dir.path().join("idx"), RetrieverKind::Bm25).unwrap());
    let (tx, rx) = tokio::sync::oneshot::channel();
    let (atx, arx) = std::sync::mpsc::channel();
    let thread = std::thread::spawn(move || server::serve(retriever, ServeOptions { host: "127.0.0.1".into(), port: 0, ..opts }, move |a| atx.send(a).unwrap(), Some(rx)));
    let addr = arx.recv_timeout(Duration::from_secs(30)).expect("the server did not start");
    Running { addr, stop: Some(tx), thread: Some(thread), _dir: dir }
}

fn agent() -> ureq::Agent {
    ureq::Agent::config_builder().http_status_as_error(false).timeout_global(Some(Duration::from_secs(30))).build().into()
}

/// POSTs `body` (raw) to `path`; returns (status, JSON body).
fn post(addr: SocketAddr, path: &str, body: &str) -> (u16, Value) {
    let mut r = agent().post(&format!("http://{addr}{path}")).header("content-type", "application/json").send(body).unwrap();
    let status = r.status().as_u16();
    let text = r.body_mut().read_to_string().unwrap();
    (status, serde_json::from_str(&text).unwrap_or(Value::String(text)))
}

fn passages(v: &Value) -> Vec<Passage> {
    v.as_array().unwrap().iter().map(|r| serde_json::from_value(r.clone()).unwrap()).collect()
}

#[test]
fn answers_search_r1s_request_with_search_r1s_response() {
    let doc: Value = serde_json::from_str(include_str!("data/search_r1_api.json")).unwrap();
    let s = start(&passages(&doc["corpus"]), ServeOptions::default());
    let (status, got) = post(s.addr, "/retrieve", &doc["request"].to_string());
    assert_eq!(status, 200, "{got}");
    let want = &doc["response"]["result"];
    let got = &got["result"];
    assert_eq!(got.as_array().unwrap().len(), want.as_array().unwrap().len(), "{got}");
    for (g, w) in got.as_array().unwrap().iter().zip(want.as_array().unwrap()) {
        let strip = |v: &Value| v.as_array().unwrap().iter().map(|h| h["document"].clone()).collect::<Vec<_>>();
        assert_eq!(strip(g), strip(w), "{got}");
        let scores: Vec<f64> = g.as_array().unwrap().iter().map(|h| h["score"].as_f64().expect("a number")).collect();
        assert!(scores.iter().all(|s| *s > 0.0) && scores.windows(2).all(|p| p[0] >= p[1]), "{scores:?}");
        // Exactly the two keys Search-R1's client reads.
        for h in g.as_array().unwrap() {
            assert_eq!(h.as_object().unwrap().keys().collect::<Vec<_>>(), ["document", "score"]);
        }
    }
    // Without scores: the corpus rows themselves.
    let mut req = doc["request"].clone();
    req["return_scores"] = json!(false);
    let (status, plain) = post(s.addr, "/retrieve", &req.to_string());
    assert_eq!(status, 200);
    assert_eq!(plain["result"][0][0], doc["corpus"][0], "{plain}");
    // topk null: the server's default (3); the health endpoint says what is served.
    let (_, v) = post(s.addr, "/retrieve", &json!({"queries": ["Roche Genentech Washington"], "topk": null}).to_string());
    assert_eq!(v["result"][0].as_array().unwrap().len(), 3, "{v}");
    let mut r = agent().get(&format!("http://{}/health", s.addr)).call().unwrap();
    let h: Value = serde_json::from_str(&r.body_mut().read_to_string().unwrap()).unwrap();
    assert_eq!((h["status"].as_str(), h["retriever"].as_str(), h["passages"].as_u64()), (Some("ok"), Some("bm25"), Some(4)));
}

/// BM25 by its definition (Robertson/Lucene: k1 = 1.2, b = 0.75, idf = ln(1 + (N − df + 0.5) /
/// (df + 0.5))), over words the analyser leaves as they are.
fn bm25_by_hand(docs: &[&str], query: &str) -> Vec<f64> {
    let (k1, b) = (1.2, 0.75);
    let toks: Vec<Vec<&str>> = docs.iter().map(|d| d.split_whitespace().collect()).collect();
    let n = docs.len() as f64;
    let avgdl = toks.iter().map(Vec::len).sum::<usize>() as f64 / n;
    toks.iter()
        .map(|d| {
            query
                .split_whitespace()
                .map(|q| {
                    let df = toks.iter().filter(|t| t.contains(&q)).count() as f64;
                    let tf = d.iter().filter(|w| **w == q).count() as f64;
                    if tf == 0.0 {
                        return 0.0;
                    }
                    let idf = (1.0 + (n - df + 0.5) / (df + 0.5)).ln();
                    idf * tf * (k1 + 1.0) / (tf + k1 * (1.0 - b + b * d.len() as f64 / avgdl))
                })
                .sum()
        })
        .collect()
}

#[test]
fn bm25_scores_equal_the_formula() {
    let texts = ["kiwi mango kiwi", "mango papaya", "kiwi kiwi kiwi papaya guava lime", "lime", "guava mango lime plum"];
    let rows: Vec<Passage> = texts.iter().enumerate().map(|(i, t)| Passage { id: format!("d{i}"), contents: t.to_string() }).collect();
    let s = start(&rows, ServeOptions::default());
    // Hand-checked: "kiwi" in d0 (tf 2, len 3, avg len 3.2, df 2 of 5):
    // ln(1 + 3.5/2.5) = 0.875469, × 2·2.2 / (2 + 1.2·(0.25 + 0.75·3/3.2)) = × 4.4 / 3.14375 → 1.225308.
    assert!((bm25_by_hand(&texts, "kiwi")[0] - 1.225308).abs() < 1e-5);
    for q in ["kiwi", "mango lime", "papaya guava kiwi", "plum"] {
        let want = bm25_by_hand(&texts, q);
        let (status, v) = post(s.addr, "/retrieve", &json!({"queries": [q], "topk": 5, "return_scores": true}).to_string());
        assert_eq!(status, 200);
        let got: BTreeMap<String, f64> =
            v["result"][0].as_array().unwrap().iter().map(|h| (h["document"]["id"].as_str().unwrap().to_string(), h["score"].as_f64().unwrap())).collect();
        for (i, w) in want.iter().enumerate() {
            let g = got.get(&format!("d{i}")).copied().unwrap_or(0.0);
            assert!((g - w).abs() <= 1e-4 * w.max(1.0), "{q}: d{i}: server {g}, formula {w}");
        }
    }
}

fn corpus_small() -> Vec<Passage> {
    vec![
        Passage { id: "0".into(), contents: "\"Zürich\"\nZürich is the largest city in Switzerland.".into() },
        Passage { id: "1".into(), contents: "\"Kyoto\"\n京都市 Kyoto was the capital of Japan.".into() },
        Passage { id: "2".into(), contents: "\"Lima\"\nLima is the capital of Peru.".into() },
    ]
}

#[test]
fn bad_requests_get_a_4xx_that_says_why() {
    let s = start(&corpus_small(), ServeOptions { max_queries: 8, max_topk: 50, max_body_bytes: 2048, ..ServeOptions::default() });
    let bad = |body: &str, status: u16, says: &str| {
        let (st, v) = post(s.addr, "/retrieve", body);
        assert_eq!(st, status, "{body}: {v}");
        assert!(v["error"].as_str().unwrap_or_default().contains(says), "{body}: {v}");
    };
    bad("{not json", 400, "not a retrieval request");
    bad(r#"{"topk": 3}"#, 400, "missing field `queries`");
    bad(r#"{"queries": "one string"}"#, 400, "not a retrieval request");
    bad(r#"{"queries": ["x"], "topk": -2}"#, 400, "topk = -2");
    bad(r#"{"queries": ["x"], "topk": 100000000000}"#, 400, "over this server's limit of 50");
    bad(&json!({"queries": vec!["x"; 9]}).to_string(), 400, "9 queries in one request");
    let (st, _) = post(s.addr, "/retrieve", &json!({"queries": ["x".repeat(4096)]}).to_string());
    assert_eq!(st, 413, "a body over --max-body-bytes");
    let (st, v) = post(s.addr, "/search", "{}");
    assert_eq!(st, 404, "{v}");
    let r = agent().get(&format!("http://{}/retrieve", s.addr)).call().unwrap();
    assert_eq!(r.status().as_u16(), 405);

    // Empty batches, empty and stop-word-only queries, unicode.
    let (st, v) = post(s.addr, "/retrieve", r#"{"queries": []}"#);
    assert_eq!((st, v), (200, json!({"result": []})));
    let (_, v) = post(s.addr, "/retrieve", r#"{"queries": ["", "the of", "ZÜRICH", "京都市"], "return_scores": true}"#);
    assert_eq!(v["result"][0], json!([]));
    assert_eq!(v["result"][1], json!([]));
    assert_eq!(v["result"][2][0]["document"]["id"], "0", "{v}");
    assert_eq!(v["result"][3][0]["document"]["id"], "1", "{v}");
    // A huge topk within the limit returns what there is.
    let (_, v) = post(s.addr, "/retrieve", r#"{"queries": ["capital"], "topk": 50}"#);
    assert_eq!(v["result"][0].as_array().unwrap().len(), 2, "{v}");
}

#[test]
fn many_concurrent_clients_each_get_their_own_answer() {
    let rows: Vec<Passage> = (0..200).map(|i| Passage { id: format!("{i}"), contents: format!("\"Entity {i}\"\nentity{i} lives in town{}", i % 7) }).collect();
    let s = start(&rows, ServeOptions::default());
    let addr = s.addr;
    let threads: Vec<_> = (0..48)
        .map(|t| {
            std::thread::spawn(move || {
                for r in 0..15 {
                    let (i, j) = ((t * 15 + r) % 200, (t * 7 + r * 3) % 200);
                    let (st, v) = post(addr, "/retrieve", &json!({"queries": [format!("entity{i}"), format!("entity{j}")], "topk": 1, "return_scores": true}).to_string());
                    assert_eq!(st, 200);
                    assert_eq!(v["result"][0][0]["document"]["id"], json!(i.to_string()), "thread {t} request {r}: {v}");
                    assert_eq!(v["result"][1][0]["document"]["id"], json!(j.to_string()), "thread {t} request {r}: {v}");
                }
            })
        })
        .collect();
    for t in threads {
        t.join().expect("a client thread failed");
    }
}

#[test]
fn the_client_retries_and_then_names_the_url() {
    let closed = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap();
    let url = format!("http://{closed}/retrieve");
    let c = RetrievalClient::new(&url, 3, Duration::from_secs(2), 2, Duration::from_millis(20)).unwrap();
    let e = c.retrieve(&["x".to_string()]).unwrap_err().to_string();
    assert!(e.contains(&url) && e.contains("did not answer after 3 attempt(s)") && e.contains("reinforge retrieval serve"), "{e}");
    assert!(RetrievalClient::new("ftp://x/retrieve", 3, Duration::from_secs(1), 0, Duration::ZERO).is_err());

    // A server that answers: hits in Search-R1's shape; an empty batch asks nothing.
    let s = start(&corpus_small(), ServeOptions::default());
    let c = RetrievalClient::new(&format!("http://{}/retrieve", s.addr), 2, Duration::from_secs(5), 0, Duration::ZERO).unwrap();
    let (hits, _) = c.retrieve(&["capital of Peru".to_string(), "zzz".to_string()]).unwrap();
    assert_eq!(hits[0][0].document.id, "2");
    assert!(hits[1].is_empty());
    assert!(c.retrieve(&[]).unwrap().0.is_empty());
}

#[test]
fn a_second_server_on_a_taken_port_is_one_line() {
    let s = start(&corpus_small(), ServeOptions::default());
    let dir = tempfile::tempdir().unwrap();
    write_corpus(&dir.path().join("c.jsonl"), &corpus_small());
    index::build(&dir.path().join("c.jsonl"), &dir.path().join("i"), &IndexOptions { threads: 1, ..Default::default() }, &|_| {}).unwrap();
    let r = Arc::new(Retriever::open(&dir.path().join("i"), RetrieverKind::Bm25).unwrap());
    let e = server::serve(r, ServeOptions { host: "127.0.0.1".into(), port: s.addr.port(), ..ServeOptions::default() }, |_| {}, None)
        .unwrap_err()
        .to_string();
    assert!(e.contains(&format!("port {} is already in use", s.addr.port())) && e.contains("--port"), "{e}");
}

#[test]
fn an_index_is_all_or_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let corpus = dir.path().join("c.jsonl");
    std::fs::write(&corpus, "{\"id\": \"0\", \"contents\": \"a\"}\n{\"id\": \"1\", \"contents\": \"b\"}\nnot json\n").unwrap();
    let out = dir.path().join("idx");
    let e = index::build(&corpus, &out, &IndexOptions { threads: 1, ..Default::default() }, &|_| {}).unwrap_err().to_string();
    assert!(e.contains("c.jsonl: line 3"), "{e}");
    assert!(!out.exists(), "a failed build leaves no index");
    assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 1, "and no temporary directory");
    write_corpus(&corpus, &corpus_small());
    index::build(&corpus, &out, &IndexOptions { threads: 1, ..Default::default() }, &|_| {}).unwrap();
    let e = index::build(&corpus, &out, &IndexOptions { threads: 1, ..Default::default() }, &|_| {}).unwrap_err().to_string();
    assert!(e.contains("already exists") && e.contains("--force"), "{e}");
    let e = Retriever::open(&out, RetrieverKind::Dense).err().unwrap().to_string();
    assert!(e.contains("has no dense index") && e.contains("--dense-model"), "{e}");
}

#[test]
fn a_stop_lets_the_server_finish_and_return() {
    let mut s = start(&corpus_small(), ServeOptions::default());
    let (st, _) = post(s.addr, "/retrieve", r#"{"queries": ["capital"]}"#);
    assert_eq!(st, 200);
    s.stop.take().unwrap().send(()).unwrap();
    let served = s.thread.take().unwrap().join().unwrap();
    assert!(served.is_ok(), "{served:?}");
    assert!(std::net::TcpStream::connect(s.addr).is_err(), "still listening after the stop");
}
