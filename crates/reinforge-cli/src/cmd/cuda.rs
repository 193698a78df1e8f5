//! `reinforge selftest` (the CUDA engine against the CPU engine) and `reinforge cuda info|compile`
//! (which GPU and libraries this node has; every kernel compiled to PTX, the check CI runs).

use anyhow::{bail, Context, Result};
use clap::{Args, Subcommand};
use reinforge_cluster::doctor::probe::LibFact;
use reinforge_cuda::{DType, GpuKind};
use reinforge_engine::DeviceSpec;
use std::path::PathBuf;
use std::process::ExitCode;

/// `reinforge selftest`.
#[derive(Args)]
pub struct SelftestArgs {
    /// `cuda`, `cuda:N`, or `cuda-emu` (the kernels emulated on the CPU: slow, tiny models only).
    #[arg(long, default_value = "cuda")]
    device: String,
    /// A model directory to test (repeatable). A directory with only `config.json` is tested
    /// with random weights. Default: the tiny fixtures (`--fixtures`), and on a GPU also
    /// SmolLM2-135M-Instruct when it has been fetched.
    #[arg(long = "model")]
    models: Vec<String>,
    /// Where the tiny fixture models are (`models/tiny-llama`, `models/tiny-qwen2`). Default:
    /// `$REINFORGE_FIXTURES`, else `shared/fixtures` or `../shared/fixtures` from here.
    #[arg(long)]
    fixtures: Option<PathBuf>,
    /// Storage types to test, comma-separated.
    #[arg(long, default_value = "f32,bf16", value_delimiter = ',')]
    dtype: Vec<String>,
    /// Tokens in the longest test sequence.
    #[arg(long, default_value_t = 48)]
    seq_len: usize,
    /// New tokens in the greedy and paged-decode checks.
    #[arg(long, default_value_t = 24)]
    new_tokens: usize,
    /// Also write every check as JSON to this file.
    #[arg(long)]
    json: Option<PathBuf>,
    /// Leave out the NCCL check (a world of one rank), e.g. on a machine where it was already
    /// run: NCCL that cannot set up waits out its 60 s deadline.
    #[arg(long)]
    no_nccl: bool,
}

/// `reinforge cuda ...`.
#[derive(Subcommand)]
pub enum CudaCmd {
    /// The GPU and the CUDA libraries this node would use, and where they were found.
    Info(InfoArgs),
    /// Compile every kernel source with NVRTC (no GPU needed) and check each kernel is in it;
    /// non-zero exit if one does not compile. To PTX for virtual architectures (compute_XY:
    /// CI runs this); to cubins in the kernel cache for real ones (sm_XY: fills
    /// $REINFORGE_HOME/cuda-kernels before a GPU node starts).
    Compile(CompileArgs),
}

/// `reinforge cuda info`.
#[derive(Args)]
pub struct InfoArgs {
    /// `cuda` or `cuda:N`.
    #[arg(long, default_value = "cuda")]
    device: String,
}

/// `reinforge cuda compile`.
#[derive(Args)]
pub struct CompileArgs {
    /// Architectures to compile for, comma-separated: virtual (compute_90: PTX, checked and
    /// discarded) or real (sm_90: cubins, into the kernel cache).
    #[arg(long, default_value = "compute_80,compute_90", value_delimiter = ',')]
    arch: Vec<String>,
    /// Also print each kernel's registers, stack, spills and static shared memory, as ptxas
    /// reports them (real architectures only: --arch sm_90).
    #[arg(long)]
    resources: bool,
    /// With --resources: a kernel whose registers spill to local memory is an error (CI's
    /// check that no change makes a kernel spill).
    #[arg(long, requires = "resources")]
    deny_spills: bool,
}

/// The CUDA engine's device for a `--device` value.
pub fn gpu_kind(device: &str) -> Result<GpuKind> {
    match device.parse::<DeviceSpec>()? {
        DeviceSpec::Cuda(i) => Ok(GpuKind::Cuda(i)),
        DeviceSpec::CudaEmulated => Ok(GpuKind::Emulated),
        DeviceSpec::Cpu => bail!("--device {device}: the self-test compares the CUDA engine with the CPU engine; use `cuda`, `cuda:N` or `cuda-emu`"),
    }
}

fn fixtures_dir(explicit: Option<PathBuf>) -> Option<PathBuf> {
    let candidates = explicit
        .into_iter()
        .chain(std::env::var_os("REINFORGE_FIXTURES").map(PathBuf::from))
        .chain(["shared/fixtures", "../shared/fixtures"].map(PathBuf::from));
    candidates.into_iter().find(|d| d.join("models").is_dir())
}

/// `reinforge selftest`: prints one line per check and `N passed, M failed`; exits non-zero on
/// any failure.
pub fn selftest(a: SelftestArgs) -> Result<ExitCode> {
    let kind = gpu_kind(&a.device)?;
    let dtypes = a.dtype.iter().map(|d| d.parse::<DType>().map_err(|e| anyhow::anyhow!("--dtype {d}: {e}"))).collect::<Result<Vec<_>>>()?;
    let mut models = Vec::new();
    for m in &a.models {
        models.push(reinforge_assets::resolve_model(m).with_context(|| format!("--model {m}"))?);
    }
    if models.is_empty() {
        let fixtures = fixtures_dir(a.fixtures.clone())
            .context("no models to test: the tiny fixtures were not found (pass --fixtures DIR or set REINFORGE_FIXTURES), or name models with --model")?;
        models.extend(["tiny-llama", "tiny-qwen2"].map(|m| fixtures.join("models").join(m)));
        if kind != GpuKind::Emulated {
            if let Ok(dir) = reinforge_assets::resolve_model("smollm2-135m-instruct") {
                models.push(dir);
            }
        }
    }
    let plan = reinforge_cuda::selftest::Plan { models, dtypes, seq_len: a.seq_len, new_tokens: a.new_tokens, nccl: !a.no_nccl };
    let started = std::time::Instant::now();
    let gpu = reinforge_cuda::Gpu::open(kind)?;
    let gpu_line = describe(&gpu.info);
    println!("selftest on {gpu_line}");
    let checks = reinforge_cuda::selftest::run(&gpu, &plan, &mut |c| {
        println!("{} {}: {}", if c.passed { "PASS" } else { "FAIL" }, c.name, c.detail);
    })?;
    let failed = checks.iter().filter(|c| !c.passed).count();
    if let Some(path) = &a.json {
        let doc = serde_json::json!({"device": gpu_line, "checks": checks, "wall_s": started.elapsed().as_secs_f64()});
        std::fs::write(path, serde_json::to_vec_pretty(&doc)?).with_context(|| format!("writing {}", path.display()))?;
    }
    println!("{} passed, {failed} failed", checks.len() - failed);
    Ok(if failed == 0 { ExitCode::SUCCESS } else { ExitCode::FAILURE })
}

fn describe(i: &reinforge_cuda::gpu::DeviceInfo) -> String {
    if i.emulated {
        return "the CUDA emulator (kernels run on the CPU)".into();
    }
    format!(
        "{} (cuda:{}, sm_{}{}, {} SMs, {:.1} GiB, driver CUDA {}.{})",
        i.name,
        i.ordinal,
        i.sm.0,
        i.sm.1,
        i.sms,
        i.total_mem as f64 / (1u64 << 30) as f64,
        i.driver_version / 1000,
        (i.driver_version % 1000) / 10
    )
}

/// The CUDA engine's libraries as this machine finds them, by the engine's own search, for a
/// driver supporting CUDA `driver_major` (0: unknown): what `reinforge doctor` checks.
pub fn lib_facts(driver_major: u32) -> Vec<LibFact> {
    use reinforge_cuda::libs::{load, CudaLib};
    reinforge_cuda::libs::limit_to_driver(driver_major);
    [(CudaLib::CublasLt, "cuBLASLt", true), (CudaLib::Nvrtc, "NVRTC", true), (CudaLib::Nccl, "NCCL", false)]
        .into_iter()
        .map(|(lib, name, required)| {
            let fact = LibFact { lib: name.into(), required, path: None, error: None, fix: None };
            match load(lib) {
                Ok(l) => LibFact { path: l.path.map(|p| p.display().to_string()), ..fact },
                Err(reinforge_cuda::CudaError::MissingLibrary { lib, searched, fix }) => {
                    LibFact { error: Some(format!("{lib} not found (looked in {searched})")), fix: Some(fix), ..fact }
                }
                Err(e) => LibFact { error: Some(e.to_string()), ..fact },
            }
        })
        .collect()
}

/// `reinforge cuda ...`.
pub fn run(c: CudaCmd) -> Result<ExitCode> {
    match c {
        CudaCmd::Info(a) => {
            println!("library search directories, in order:");
            for d in reinforge_cuda::libs::search_dirs() {
                println!("  {}", d.display());
            }
            // The driver first: libraries built for a newer CUDA than it supports are passed
            // over, as when the engine opens the GPU.
            let driver = reinforge_cuda::libs::driver_cuda_version();
            match driver {
                Some((major, minor)) => println!("driver: supports CUDA {major}.{minor}"),
                None => println!("driver: not found (libcuda.so.1); the libraries below are what a GPU node with this search would use"),
            }
            for l in lib_facts(driver.map_or(0, |d| d.0)) {
                match (l.path, l.error, l.fix) {
                    (_, Some(e), fix) => println!("{}: {e}{}", l.lib, fix.map(|f| format!("; {f}")).unwrap_or_default()),
                    (path, None, _) => println!("{}: {}", l.lib, path.unwrap_or_else(|| "found by the dynamic loader".into())),
                }
            }
            if let Ok(v) = reinforge_cuda::gpu::cublaslt::version() {
                println!("cuBLASLt version {v}");
            }
            if let Ok((major, minor)) = reinforge_cuda::gpu::nvrtc::Nvrtc::get().and_then(|n| n.version()) {
                println!("NVRTC version {major}.{minor}");
            }
            if let Ok((v, _)) = reinforge_cuda::nccl::version() {
                println!("NCCL version {}.{}.{}", v / 10000, v / 100 % 100, v % 100);
            }
            let g = reinforge_cuda::Gpu::open(gpu_kind(&a.device)?)?;
            println!("device: {}", describe(&g.info));
            Ok(ExitCode::SUCCESS)
        }
        CudaCmd::Compile(a) => {
            // ptxas runs for real architectures only; PTX has no registers yet.
            let real: Vec<&str> = a.arch.iter().map(String::as_str).filter(|arch| arch.starts_with("sm_")).collect();
            if a.resources && real.is_empty() {
                bail!("--resources needs a real architecture among --arch (sm_80, sm_90, ...): ptxas reports registers for the GPU it compiles for, and --arch {} gives PTX only", a.arch.join(","));
            }
            // With --resources the real architectures compile once, with ptxas's report, into
            // the kernel cache, which the check below then reads.
            let mut reports = Vec::new();
            if a.resources {
                for &arch in &real {
                    reports.push((arch, reinforge_cuda::kernels::resources(arch)?));
                }
            }
            let mut total = 0;
            for arch in &a.arch {
                let checked = reinforge_cuda::kernels::check_all(arch)?;
                for c in &checked {
                    let what = if arch.starts_with("sm_") { "cubin, cached" } else { "PTX" };
                    println!("{arch} {}: {} kernels, {} bytes of {what}", c.file, c.kernels, c.bytes);
                    total += c.kernels;
                }
            }
            println!("compiled {total} kernels for {}", a.arch.join(", "));
            if !a.resources {
                return Ok(ExitCode::SUCCESS);
            }
            let mut spilling = Vec::new();
            for (arch, files) in reports {
                for (file, kernels) in files {
                    for r in kernels {
                        let spills = format!("{} B stack, {} B spill stores, {} B spill loads", r.stack_bytes, r.spill_store_bytes, r.spill_load_bytes);
                        match r.device_function {
                            true => println!("{arch} {file} {} (device function, not inlined): {spills}", r.kernel),
                            false => println!("{arch} {file} {}: {} registers, {spills}, {} B static shared memory", r.kernel, r.registers, r.smem_bytes),
                        }
                        if r.spills() {
                            spilling.push(format!("{} on {arch} ({} B stored, {} B loaded)", r.kernel, r.spill_store_bytes, r.spill_load_bytes));
                        }
                    }
                }
            }
            match (spilling.is_empty(), a.deny_spills) {
                (true, _) => println!("no kernel spills registers on {}", real.join(", ")),
                (false, false) => println!("warning: registers spill to local memory in {}", spilling.join(", ")),
                (false, true) => bail!(
                    "registers spill to local memory in {}: give the kernel fewer live values (smaller tiles, fewer unrolled loads) or looser __launch_bounds__, and check the report with `reinforge cuda compile --arch {} --resources`",
                    spilling.join(", "),
                    real.join(",")
                ),
            }
            Ok(ExitCode::SUCCESS)
        }
    }
}
