//! Imports a local llama GGUF into a Hugging Face directory and reports the time taken.
//!
//! `cargo run -p reinforge-assets --example import_gguf -- MODEL.gguf OUT_DIR`

use std::time::Instant;

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let [gguf, dest] = args.as_slice() else {
        eprintln!("usage: import_gguf MODEL.gguf OUT_DIR");
        std::process::exit(2);
    };
    let t = Instant::now();
    match reinforge_assets::import_gguf(gguf, dest) {
        Ok(s) => println!(
            "imported {} tensors ({} parameters) into {} in {:.2} s",
            s.tensors,
            s.parameters,
            s.dest.display(),
            t.elapsed().as_secs_f64()
        ),
        Err(e) => {
            eprintln!("error: {e}");
            std::process::exit(1);
        }
    }
}
