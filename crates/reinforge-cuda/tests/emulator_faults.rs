//! What the emulator refuses or exposes where a GPU would fail or leave results undefined.
//!
//! It stops a kernel that reads past the end of a buffer, as a GPU stops it with an
//! illegal-address error, and names the kernel: device memory is mapped with an inaccessible
//! page after each buffer. The fault ends the process, so that test runs the launch in a child.

use reinforge_cuda::ops::Ops;
use reinforge_cuda::{DType, Gpu, GpuKind};

const CHILD: &str = "REINFORGE_TEST_OOB_CHILD";

#[test]
fn a_kernel_reading_past_a_buffer_stops_with_a_report() {
    let gpu = Gpu::open(GpuKind::Emulated).unwrap();
    let ops = Ops::new(&gpu, DType::Bf16);
    let src = gpu.alloc(64 * 2, "source", "").unwrap();
    let dst = gpu.alloc(1 << 20, "destination", "").unwrap();
    if std::env::var_os(CHILD).is_some() {
        // 64 bf16 allocated, 100 000 read: far past the buffer's last 256-byte unit.
        ops.cast_to_f32(dst.ptr, src.ptr, 100_000).unwrap();
        gpu.sync().unwrap();
        eprintln!("the out-of-bounds launch completed");
        return;
    }
    // Within bounds (slack of the last 256-byte unit included), the same launch is fine.
    ops.cast_to_f32(dst.ptr, src.ptr, 64).unwrap();
    let out = std::process::Command::new(std::env::current_exe().unwrap())
        .args(["--exact", "a_kernel_reading_past_a_buffer_stops_with_a_report", "--nocapture", "--test-threads=1"])
        .env(CHILD, "1")
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "the child should have been stopped: {stderr}");
    assert!(!stderr.contains("launch completed"), "{stderr}");
    assert!(stderr.contains("emulated kernel cast_to_f32_bf16: invalid address"), "no report naming the kernel: {stderr}");
}

#[test]
fn a_full_mask_shuffle_in_a_partial_warp_is_refused() {
    // value_fwd gives each warp a row and reduces it with full-mask shuffles, which is sound
    // only when whole warps run: launched with 48 threads, its second warp has 16 lanes, and
    // a shuffle naming the 16 that do not exist is undefined on a GPU. The emulator refuses it
    // instead of reading those lanes' stale slots.
    use reinforge_cuda::gpu::Arg;
    let gpu = Gpu::open(GpuKind::Emulated).unwrap();
    let (n, hd) = (2usize, 64usize);
    let h = gpu.upload_new(&vec![1f32; n * hd], "rows").unwrap();
    let w = gpu.upload_new(&vec![0.5f32; hd], "weights").unwrap();
    let out = gpu.alloc(n * 4, "values", "").unwrap();
    let args = |rows: usize| [Arg::Ptr(out.ptr), Arg::Ptr(h.ptr), Arg::Ptr(w.ptr), Arg::I32(rows as i32), Arg::I32(hd as i32)];
    // Whole warps: two blocks of one warp each.
    gpu.launch("value_fwd_f32", [2, 1, 1], [32, 1, 1], 0, &args(n)).unwrap();
    assert_eq!(gpu.to_vec::<f32>(out.ptr, n).unwrap(), vec![32.0; n]);
    let e = gpu.launch("value_fwd_f32", [1, 1, 1], [48, 1, 1], 0, &args(n)).and_then(|_| gpu.sync()).unwrap_err().to_string();
    assert!(e.contains("value_fwd_f32") && e.contains("mask names a lane that has exited"), "{e}");
}

#[test]
fn static_shared_memory_starts_every_block_as_all_ones() {
    // A GPU's static shared memory holds whatever the SM last had: the emulator gives each new
    // block all-ones bytes (not zeros, not the previous block's values), and only once per
    // block, so a thread reaching the declaration after another thread wrote it keeps that.
    use reinforge_cuda::gpu::Arg;
    let gpu = Gpu::open(GpuKind::Emulated).unwrap();
    let blocks = 16usize;
    let out = gpu.alloc(2 * blocks * 4, "probe", "").unwrap();
    for mirrored in [false, true] {
        reinforge_cuda::gpu::set_emulator_schedule_mirrored(mirrored);
        for _ in 0..2 {
            gpu.launch("emu_probe_static_shared", [blocks as u32, 1, 1], [64, 1, 1], 0, &[Arg::Ptr(out.ptr)]).unwrap();
            let got = gpu.to_vec::<u32>(out.ptr, 2 * blocks).unwrap();
            for b in 0..blocks {
                assert_eq!(got[2 * b], u32::MAX, "block {b} (mirrored {mirrored}) read its static shared memory's previous contents");
                assert_eq!(got[2 * b + 1], 7 + b as u32, "block {b} (mirrored {mirrored}) lost its own write");
            }
        }
    }
    reinforge_cuda::gpu::set_emulator_schedule_mirrored(false);
}

#[test]
fn a_block_over_the_kernels_launch_bounds_is_refused() {
    // `__launch_bounds__(64)` promises the compiler blocks of at most 64 threads; a GPU refuses
    // a larger launch, and so does the emulator, naming the bound.
    use reinforge_cuda::gpu::Arg;
    let gpu = Gpu::open(GpuKind::Emulated).unwrap();
    let out = gpu.alloc(128 * 4, "probe", "").unwrap();
    gpu.launch("emu_probe_bounded", [2, 1, 1], [64, 1, 1], 0, &[Arg::Ptr(out.ptr)]).unwrap();
    assert_eq!(gpu.to_vec::<u32>(out.ptr, 128).unwrap(), (0..128).map(|i| i % 64).collect::<Vec<u32>>());
    let e = gpu.launch("emu_probe_bounded", [1, 1, 1], [128, 1, 1], 0, &[Arg::Ptr(out.ptr)]).and_then(|_| gpu.sync()).unwrap_err().to_string();
    assert!(e.contains("emu_probe_bounded") && e.contains("128 threads per block, more than the kernel's __launch_bounds__ (64)"), "{e}");
}
