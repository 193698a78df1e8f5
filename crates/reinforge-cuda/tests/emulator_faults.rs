//! The emulator stops a kernel that reads past the end of a buffer, as a GPU stops it with an
//! illegal-address error, and names the kernel: device memory is mapped with an inaccessible
//! page after each buffer. The fault ends the process, so the test runs the launch in a child.

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
