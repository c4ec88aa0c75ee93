#!/usr/bin/env bash
# Builds .sglang016/carry/ (git-ignored, ~46 MiB): what the lent H200 (Python 3.12, torch 2.11.0+cu130,
# triton 3.6.0, transformers 5.17.0, no network) needs to run SGLang 0.5.16's bench_one_batch / server.
# Run here from the checkout (needs the package registry). Device call: scripts/sglang_arms_h200.sh.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
root=$(git -C "$here" rev-parse --show-toplevel)
mkdir -p "$root/.sglang016"   # git-ignored (.gitignore)
py=${PYTHON:-python3}
C=$root/.sglang016/carry
rm -rf "$C" && mkdir -p "$C/whl"
plat=(--platform manylinux_2_34_x86_64 --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64
      --platform manylinux_2_24_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64
      --platform manylinux1_x86_64)
pip_dl() { "$py" -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 \
             --implementation cp "${plat[@]}" -d "$1" "${@:2}" 2>&1 | grep -v 'is ignored' || true; }
tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT
pip_dl "$tmp" sglang==0.5.16 sglang-kernel==0.4.5 flashinfer_python==0.6.14

# What `import sglang.bench_one_batch / sglang.launch_server / sglang.srt.entrypoints.http_server` needs beyond
# the device image (found by importing them in a Python 3.12 venv holding the image's packages + these).
pip_dl "$C/whl" orjson==3.13.0 pybase64==1.5.1 pyzmq==27.3.0 msgspec==0.23.0 \
  pydantic==2.14.4 pydantic_core==2.50.5 annotated-types==0.8.0 typing-inspection==0.4.5 typing_extensions==4.16.0 \
  starlette==1.10.0 fastapi==0.165.0 opentelemetry-api==1.45.2 importlib-metadata==10.2.0 uvicorn==0.54.0 \
  ipython==9.18.1 traitlets==5.16.1 dill==0.4.1 openai==2.6.1 jiter==0.19.0 distro==1.9.0 sniffio==1.3.1 \
  partial_json_parser==0.2.1.1.post7 compressed-tensors==0.20.1 loguru==0.7.3 gguf==0.19.0 setproctitle==1.3.8 \
  jsonschema==4.26.0 jsonschema-specifications==2025.9.1 referencing==0.37.0 rpds-py==2026.9.1 \
  soundfile==0.13.1 cffi==2.1.1 pycparser==3.12 python-multipart==0.0.34 apache-tvm-ffi==0.1.11
# sglang 0.5.16 pins transformers==5.12.1; the image's 5.17.0 lacks Qwen2_5_VisionRotaryEmbedding, which
# sglang/srt/models/qwen2_5_vl.py imports, so the multimodal processor module qwen_vl.py fails to import and the
# server's TokenizerManager stops with "No processor registered for architecture: ['Qwen3_5MoeForConditionalGeneration']"
# (bench_one_batch does not need it). transformers 5.12.1 wants tokenizers<=0.23.0 (image: 0.23.2) -> 0.22.2.
pip_dl "$C/whl" transformers==5.12.1 tokenizers==0.22.2

"$py" - "$tmp" "$C" "$here/sglang016_patch.py" <<'PY'
import glob, io, os, subprocess, sys, tarfile, zipfile
tmp, C, patcher = sys.argv[1:4]
def tar_from_wheel(whl, out, keep):
    """solid xz tar of the wheel's files for which keep(name) is true"""
    z = zipfile.ZipFile(whl)
    n = 0
    with tarfile.open(out, "w:xz", preset=9) as t:
        for i in z.infolist():
            f = i.filename
            if f.endswith("/") or f.endswith("dist-info/RECORD") or not keep(f):
                continue
            data = z.read(i)
            ti = tarfile.TarInfo(f); ti.size = len(data); ti.mode = 0o755 if f.endswith(".so") else 0o644
            t.addfile(ti, io.BytesIO(data)); n += 1
    print(f"{os.path.basename(out)}: {n} files, {os.path.getsize(out)/2**20:.1f} MiB")

# sglang 0.5.16: no Rust extensions (srt/grpc/_core: gRPC server mode only; srt/multimodal/_core: Inkling
# image preprocessing only), no multimodal_gen/ (diffusion). Patched (patch_sglang.py) before packing.
sg = glob.glob(f"{tmp}/sglang-0.5.16-*.whl")[0]
src = f"{tmp}/sg"; zipfile.ZipFile(sg).extractall(src)
subprocess.check_call([sys.executable, patcher, src])
with tarfile.open(f"{C}/sglang_0.5.16_trim.tar.xz", "w:xz", preset=9) as t:
    for d, _, fs in os.walk(src):
        for f in sorted(fs):
            rel = os.path.relpath(os.path.join(d, f), src)
            if rel.endswith(".so") or rel.startswith("sglang/multimodal_gen/") or rel.endswith("dist-info/RECORD") \
               or "__pycache__" in rel:
                continue
            t.add(os.path.join(src, rel), rel)
print(f"sglang_0.5.16_trim.tar.xz: {os.path.getsize(f'{C}/sglang_0.5.16_trim.tar.xz')/2**20:.1f} MiB")

# sglang-kernel 0.4.5 (383 MB wheel): keep the SM90 common_ops (15 MB), spatial_ops, all Python, triton_kernels.
# Dropped: flash_ops.abi3.so (342 MB, FA3, imported only by sgl_kernel/flash_attn.py), sm100/ (SM100 ops),
# infllm_ops (lazy loader, InfLLM-V2 attention), flashmla_ops (import guarded by try/except in flash_mla.py).
sk = glob.glob(f"{tmp}/sglang_kernel-0.4.5-*.whl")[0]
drop = ("sgl_kernel/flash_ops.abi3.so", "sgl_kernel/sm100/", "sgl_kernel/infllm_ops", "sgl_kernel/flashmla_ops")
tar_from_wheel(sk, f"{C}/sgl_kernel_0.4.5_sm90.tar.xz", lambda f: not f.startswith(drop))

# flashinfer 0.6.14: sglang's sampler imports flashinfer.sampling whenever CUDA is there (even with
# --sampling-backend pytorch). Keep all Python + csrc/include/spdlog; drop the CUTLASS and CCCL header trees
# (JIT of CUTLASS kernels, not used with the triton attention / triton MoE / pytorch sampling backends).
fi = glob.glob(f"{tmp}/flashinfer_python-0.6.14-*.whl")[0]
tar_from_wheel(fi, f"{C}/flashinfer_0.6.14_trim.tar.xz",
               lambda f: not f.startswith(("flashinfer/data/cutlass/", "flashinfer/data/cccl/")))
PY

cat > "$C/setup.sh" <<'SH'
# source from the repo root on the device: `source .sglang016/carry/setup.sh`
C=.sglang016/carry
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site $C/whl/*.whl || return 9
mkdir -p /tmp/sg
for t in $C/*.tar.xz; do tar -xJf "$t" -C /tmp/sg || return 8; done
export PYTHONPATH=/tmp/sg:/tmp/site${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1
export TRITON_CACHE_DIR=${TRITON_CACHE_DIR:-/tmp/triton_cache}
export FLASHINFER_WORKSPACE_BASE=${FLASHINFER_WORKSPACE_BASE:-/tmp/fiws}
# SGLang's JIT kernels build with nvcc (tvm-ffi) and want a CUDA_HOME whose lib64 holds libcudart.so
# (same fix as shared/device/make_sglang_carry.sh for 0.5.23).
nv=$(command -v nvcc); ch=$(dirname "$(dirname "$nv")")
if [ ! -e "$ch/lib64/libcudart.so" ]; then
  l=$(ls "$ch"/lib64/libcudart.so* "$ch"/lib/libcudart.so* /usr/local/cuda*/targets/x86_64-linux/lib/libcudart.so* 2>/dev/null | head -1)
  [ -n "$l" ] || l=$(find / -name 'libcudart.so*' -not -path '/proc/*' 2>/dev/null | head -1)
  mkdir -p /tmp/cudahome/lib64; ln -sfn "$ch/bin" /tmp/cudahome/bin; ln -sfn "$ch/include" /tmp/cudahome/include
  ln -sf "$l" /tmp/cudahome/lib64/libcudart.so; export CUDA_HOME=/tmp/cudahome
fi
SH
ls -la "$C" "$C/whl"
du -sb "$C"
