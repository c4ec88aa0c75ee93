#!/usr/bin/env bash
# Builds .sglang023/carry/ (git-ignored): what the lent H200 (Python 3.12, torch 2.11.0+cu130, triton 3.6.0,
# transformers 5.17.0, no network) needs to run SGLang 0.5.23's server and `python -m sglang.benchmark.one_batch`.
# Run here from the checkout (needs the package registry). Device call: SGLANG=0.5.23 scripts/sglang_arms_h200.sh.
# Same method as make_sglang016_carry.sh. No source patch is needed for 0.5.23 (xgrammar is carried instead).
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
root=$(git -C "$here" rev-parse --show-toplevel)
mkdir -p "$root/.sglang023"   # git-ignored (.gitignore)
py=${PYTHON:-python3}
C=$root/.sglang023/carry
rm -rf "$C" && mkdir -p "$C/whl"
plat=(--platform manylinux_2_34_x86_64 --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64
      --platform manylinux_2_24_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64
      --platform manylinux1_x86_64)
pip_dl() { "$py" -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 \
             --implementation cp "${plat[@]}" -d "$1" "${@:2}" 2>&1 | grep -v 'is ignored' || true; }
tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT
# sglang 0.5.23 pins sglang-kernel 0.4.10, whose SM90 common_ops.so needs torch symbols that torch 2.11 lacks;
# 0.4.5 (built for torch 2.11, CUDA 13) has every name the Qwen3.5 path imports. The start-up version check
# is skipped with SGLANG_SKIP_SGL_KERNEL_VERSION_CHECK=1 (the device script sets it).
pip_dl "$tmp" sglang==0.5.23 sglang-kernel==0.4.5 flashinfer_python==0.7.2

# What `import sglang.launch_server / sglang.srt.entrypoints.http_server / sglang.benchmark.one_batch /
# sglang.srt.models.qwen3_5` (and every other sglang module, also with CUDA faked) needs beyond the device image,
# found by importing them with only the image's packages (torch 2.11.0, triton 3.6.0, ...) + these on the path.
# Versions: sglang 0.5.23's pins (openai 2.8.0, compressed-tensors 0.18.0, xgrammar 0.2.7, apache-tvm-ffi 0.1.11),
# else the 0.5.16 carry's. jiter, importlib-metadata, pycparser: run-time deps of openai / opentelemetry / cffi.
pip_dl "$C/whl" orjson==3.13.0 pybase64==1.5.1 pyzmq==27.3.0 msgspec==0.23.0 \
  pydantic==2.14.4 pydantic_core==2.50.5 annotated-types==0.8.0 typing-inspection==0.4.5 typing_extensions==4.16.0 \
  starlette==1.10.0 fastapi==0.165.0 opentelemetry-api==1.45.2 importlib-metadata==10.2.0 uvicorn==0.54.0 \
  ipython==9.18.1 traitlets==5.16.1 dill==0.4.1 openai==2.8.0 jiter==0.19.0 distro==1.9.0 sniffio==1.3.1 \
  partial_json_parser==0.2.1.1.post7 compressed-tensors==0.18.0 loguru==0.7.3 gguf==0.19.0 setproctitle==1.3.8 \
  jsonschema==4.26.0 jsonschema-specifications==2025.9.1 referencing==0.37.0 rpds-py==2026.9.1 \
  soundfile==0.13.1 cffi==2.1.1 pycparser==3.12 python-multipart==0.0.34 apache-tvm-ffi==0.1.11 \
  xgrammar==0.2.7
# xgrammar 0.2.7 (1.3 MB): function_call/{inkling,kimik3}_detector.py import it unguarded (http_server path).
# transformers: sglang 0.5.23 pins 5.19.0 (image: 5.17.0); 5.19.0 wants tokenizers>=0.23.1,<0.24 and the
# image's 0.23.2 fits, so no tokenizers wheel. Packed as xz (3.3 MiB, wheel 12 MiB); /tmp/sg comes first on
# PYTHONPATH, so it and its dist-info shadow the image's 5.17.0.
pip_dl "$tmp" transformers==5.19.0

"$py" - "$tmp" "$C" <<'PY'
import glob, io, os, sys, tarfile, zipfile
tmp, C = sys.argv[1:3]
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

# sglang 0.5.23: no multimodal_gen/ (diffusion), no test/, no Rust extensions except the radix TreeCore
# (srt/mem_cache/rust_tree_core/mem_cache*.so, 3.4 MB, links libtorch; SGLang's default TreeCore, built even
# with --disable-radix-cache; when absent SGLang logs "Using the Python TreeCore" and uses that). Dropped:
# srt/rust_extensions/_server (SGLANG_RUST_SERVER only), _grpc (--grpc-port only), _bench (bench_serving
# --rust client), _multimodal (Inkling / DeepSeek-V4.1 image preprocessing).
sg = glob.glob(f"{tmp}/sglang-0.5.23-*.whl")[0]
tar_from_wheel(sg, f"{C}/sglang_0.5.23_trim.tar.xz", lambda f: not f.startswith(("sglang/multimodal_gen/", "sglang/test/"))
               and (not f.endswith(".so") or f.startswith("sglang/srt/mem_cache/rust_tree_core/mem_cache.")))

tf = glob.glob(f"{tmp}/transformers-5.19.0-*.whl")[0]
tar_from_wheel(tf, f"{C}/transformers_5.19.0.tar.xz", lambda f: True)

# sglang-kernel 0.4.5 (383 MB wheel): keep the SM90 common_ops (15 MB), spatial_ops, all Python, triton_kernels.
# Dropped: flash_ops.abi3.so (342 MB, FA3, imported only by sgl_kernel/flash_attn.py), sm100/ (SM100 ops),
# infllm_ops (lazy loader, InfLLM-V2 attention), flashmla_ops (import guarded by try/except in flash_mla.py).
sk = glob.glob(f"{tmp}/sglang_kernel-0.4.5-*.whl")[0]
drop = ("sgl_kernel/flash_ops.abi3.so", "sgl_kernel/sm100/", "sgl_kernel/infllm_ops", "sgl_kernel/flashmla_ops")
tar_from_wheel(sk, f"{C}/sgl_kernel_0.4.5_sm90.tar.xz", lambda f: not f.startswith(drop))

# flashinfer 0.7.2: imported by sglang modules on the server path (sampler lazily). Keep all Python +
# csrc/include/spdlog; drop the CUTLASS and CCCL header trees (JIT of CUTLASS kernels; not used with the
# triton attention / triton MoE / pytorch sampling backends; sglang's own JIT kernels on this path name no
# "cutlass"/"flashinfer" extra_dependencies).
fi = glob.glob(f"{tmp}/flashinfer_python-0.7.2-*.whl")[0]
tar_from_wheel(fi, f"{C}/flashinfer_0.7.2_trim.tar.xz",
               lambda f: not f.startswith(("flashinfer/data/cutlass/", "flashinfer/data/cccl/")))
PY

cat > "$C/setup.sh" <<'SH'
# source from the repo root on the device: `source .sglang023/carry/setup.sh`
C=.sglang023/carry
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site $C/whl/*.whl || return 9
mkdir -p /tmp/sg
for t in $C/*.tar.xz; do tar -xJf "$t" -C /tmp/sg || return 8; done
export PYTHONPATH=/tmp/sg:/tmp/site${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1
export TRITON_CACHE_DIR=${TRITON_CACHE_DIR:-/tmp/triton_cache}
export FLASHINFER_WORKSPACE_BASE=${FLASHINFER_WORKSPACE_BASE:-/tmp/fiws}
export SGLANG_SKIP_SGL_KERNEL_VERSION_CHECK=1   # sglang-kernel 0.4.5 instead of the pinned 0.4.10
# The Rust radix TreeCore links libtorch (built for torch 2.14): if it does not load under this torch,
# take SGLang's Python TreeCore instead of failing at cache creation.
if ! python3 -c 'import glob, importlib.util as u, torch
p = glob.glob("/tmp/sg/sglang/srt/mem_cache/rust_tree_core/mem_cache.*.so")[0]
u.module_from_spec(u.spec_from_file_location("sglang.srt.mem_cache.rust_tree_core.mem_cache", p))' 2>/dev/null; then
  echo "setup: the Rust TreeCore .so does not load here -> SGLANG_UNIFIED_RADIX_TREE_CORE_BACKEND=python"
  export SGLANG_UNIFIED_RADIX_TREE_CORE_BACKEND=python
fi
# SGLang's JIT kernels build with nvcc (tvm-ffi) and want a CUDA_HOME whose lib64 holds libcudart.so.
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
