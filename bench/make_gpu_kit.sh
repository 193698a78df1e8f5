#!/usr/bin/env bash
# Builds what a GPU machine without Rust or network needs to run bench/gpu_check.sh, into
# target/gpu-kit (ignored by git; the device tool carries it with `carry: ["target/gpu-kit"]`,
# 64 MiB at most): the stripped release binary with the C runtime it was linked against, the
# tiny fixture models, and SmolLM2's tokenizer beside its config (the benches then use the same
# chat-templated prompts as compare_hf.py, with random weights of SmolLM2's shape: real weights
# do not fit the carry).
#
#   bench/make_gpu_kit.sh            # then: bench/gpu_check.sh OUT (on the GPU machine)
set -euo pipefail
cd "$(dirname "$0")/.."
kit=target/gpu-kit
rm -rf "$kit" && mkdir -p "$kit/models"
cargo build --release --locked -p reinforge-cli
strip -o "$kit/reinforge" target/release/reinforge
# The build machine's C and C++ runtimes beside the binary, for a GPU machine whose glibc is
# older than the one the binary was linked against: gpu_check.sh then starts the binary
# through this loader, its libraries first and the node's after, instead of failing every part.
# All of glibc's libraries go, not only the binary's: a library of the node (the CUDA driver,
# NCCL) or one glibc loads itself (the NSS modules behind getaddrinfo) must come from the same
# glibc as the libc it runs with. libdl, libpthread and librt are stubs since glibc 2.34, but
# CUDA's own libraries still name them.
mkdir -p "$kit/glibc"
libc_dir=""
while read -r lib; do
  cp -L "$lib" "$kit/glibc/"
  [ "$(basename "$lib")" = libc.so.6 ] && libc_dir=$(dirname "$lib")
done < <(ldd "$kit/reinforge" | awk '$2 == "=>" && $3 ~ /^\// {print $3} $1 ~ /^\/.*ld-linux/ {print $1}')
[ -n "$libc_dir" ] && [ -f "$kit/glibc/ld-linux-x86-64.so.2" ] || { echo "ldd did not show libc.so.6 and the loader of $kit/reinforge"; exit 1; }
for lib in libdl.so.2 libpthread.so.0 librt.so.1 libresolv.so.2 libutil.so.1 libanl.so.1 libmvec.so.1 \
  libnss_files.so.2 libnss_dns.so.2 libnss_compat.so.2 libnsl.so.1 libthread_db.so.1 libBrokenLocale.so.1; do
  [ -e "$libc_dir/$lib" ] && cp -L "$libc_dir/$lib" "$kit/glibc/"
done
fixtures="${REINFORGE_FIXTURES:-../shared/fixtures}"
[ -d "$fixtures/models" ] || { echo "no fixtures at $fixtures (set REINFORGE_FIXTURES)"; exit 1; }
mkdir -p "$kit/fixtures/models"
cp -r "$fixtures/models/tiny-llama" "$fixtures/models/tiny-qwen2" "$kit/fixtures/models/"
smol="$kit/models/smollm2-135m-shape"
mkdir -p "$smol" && cp bench/models/smollm2-135m-shape/config.json "$smol/"
if ./target/release/reinforge model fetch smollm2-135m-instruct >/dev/null 2>&1; then
  src="${REINFORGE_HOME:-$HOME/.cache/reinforge}/models/smollm2-135m-instruct"
  for f in tokenizer.json tokenizer_config.json chat_template.jinja generation_config.json; do
    [ -f "$src/$f" ] && cp "$src/$f" "$smol/"
  done
else
  echo "SmolLM2 could not be fetched: its benches will use random prompt ids"
fi
# The kernels compiled for sm_90 (H100, H200) into the kit's kernel cache, where NVRTC is found
# here (REINFORGE_CUDA_LIB_DIRS, or pip's nvidia-cuda-nvrtc==13.0.*): gpu_check.sh copies them
# into its REINFORGE_HOME, so the GPU run compiles nothing at start when its NVRTC has the same
# version (another version misses the cache and compiles, as without the kit's). ptxas's
# per-kernel register report goes beside them, to read with the GPU run's profiles.
# One compile gives both (the report changes nothing in the cubins but the ptxas command line
# they record).
# Each cached cubin is whole (written aside, then renamed), so a compile that failed part-way
# leaves a cache the GPU run completes at start.
if REINFORGE_HOME="$kit" "$kit/reinforge" cuda compile --arch sm_90 --resources > "$kit/kernel-resources.txt" 2>&1; then
  echo "kernels compiled for sm_90 into $kit/cuda-kernels; their registers: $kit/kernel-resources.txt ($(tail -1 "$kit/kernel-resources.txt"))"
else
  echo "kernels not (all) compiled ahead ($(tail -1 "$kit/kernel-resources.txt"); NVRTC not found here?): the GPU run compiles what is missing at start"
fi
# The GPU run's CPU half, which needs no GPU: GRPO on the quickstart task on this machine's CPU,
# whose reward curve gpu_check.sh puts beside the GPU run's (its checkpoints are not kept).
qs="$kit/quickstart-cpu"
if "$kit/reinforge" train examples/quickstart.toml 'trainer.device="cpu"' "trainer.default_local_dir=\"$PWD/$qs\"" 'trainer.logger=["jsonl"]' --resume none > "$kit/quickstart-cpu.log" 2>&1; then
  rm -rf "$qs/checkpoints"
  echo "$(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ //'), $(nproc) cores, $(date -u +%F)" > "$qs/machine.txt"
  echo "quickstart on the CPU: $qs/metrics.jsonl"
else
  rm -rf "$qs"
  echo "the CPU quickstart failed (see $kit/quickstart-cpu.log): gpu_check.sh runs it there"
fi
# Which code the kit holds, for the GPU run's summary.
# The newest glibc symbol version the binary needs: a GPU machine with an older glibc cannot
# start it, and gpu_check.sh says so with this figure.
carried=$("$kit/glibc/ld-linux-x86-64.so.2" --version 2>/dev/null | head -1 | grep -o '[0-9][0-9.]*[0-9]\.$' | sed 's/\.$//' || true)
glibc=$(objdump -T "$kit/reinforge" 2>/dev/null | grep -o 'GLIBC_[0-9.]*' | sort -uV | tail -1 | sed 's/GLIBC_//' || true)
echo "$(git rev-parse --short HEAD)$([ -z "$(git status --porcelain -- . ':!target')" ] || echo ' with uncommitted changes'), built $(date -u '+%F %H:%M UTC'), needs glibc ${glibc:-?} or newer (carries glibc $carried for older machines)" > "$kit/COMMIT"
du -sh "$kit"
size=$(du -sb "$kit" | cut -f1)
[ "$size" -lt $((64 * 1024 * 1024)) ] || { echo "$kit is over the 64 MiB the device tool carries"; exit 1; }
echo "kit ready: carry target/gpu-kit, run bench/gpu_check.sh OUT on the GPU machine"
