#!/usr/bin/env bash
# Builds .sglang023/carry/ (git-ignored, ~47 MiB): what the lent H200 (Python 3.12, torch 2.11.0+cu130, triton 3.6.0,
# transformers 5.17.0, no network) needs to run SGLang 0.5.23's server and `python -m sglang.benchmark.one_batch`.
# Run here from the checkout (needs the package registry). Device call: SGLANG=0.5.23 scripts/sglang_arms_h200.sh.
# Same pieces as make_sglang016_carry.sh (carry_lib.sh). No source patch is needed for 0.5.23 (xgrammar is carried).
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
root=$(git -C "$here" rev-parse --show-toplevel)
py=${PYTHON:-python3}
source "$here/carry_lib.sh"
C=$root/.sglang023/carry        # git-ignored (.gitignore)
rm -rf "$C" && mkdir -p "$C/whl"
tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT
# sglang 0.5.23 pins sglang-kernel 0.4.10, whose SM90 common_ops.so needs torch symbols that torch 2.11 lacks;
# 0.4.5 (built for torch 2.11, CUDA 13) has every name the Qwen3.5 path imports. The start-up version check
# is skipped with SGLANG_SKIP_SGL_KERNEL_VERSION_CHECK=1 (setup.sh sets it).
pip_dl "$tmp" sglang==0.5.23 sglang-kernel==0.4.5 flashinfer_python==0.7.2 transformers==5.19.0

# The server path's imports beyond the image (carry_lib.sh; checked for 0.5.23 by importing every sglang module,
# also with CUDA faked), with 0.5.23's pins: openai 2.8.0, compressed-tensors 0.18.0, and xgrammar 0.2.7 (1.3 MB:
# function_call/{inkling,kimik3}_detector.py import it unguarded on the http_server path).
pip_dl "$C/whl" "${SERVER_WHEELS[@]}" openai==2.8.0 compressed-tensors==0.18.0 xgrammar==0.2.7

# sglang 0.5.23: no multimodal_gen/ (diffusion), no test/, no Rust extensions except the radix TreeCore
# (srt/mem_cache/rust_tree_core/mem_cache*.so, 3.4 MB, links libtorch; SGLang's default TreeCore, built even
# with --disable-radix-cache; when absent SGLang logs "Using the Python TreeCore" and uses that). Dropped:
# srt/rust_extensions/_server (SGLANG_RUST_SERVER only), _grpc (--grpc-port only), _bench (bench_serving
# --rust client), _multimodal (Inkling / DeepSeek-V4.1 image preprocessing).
pack "$(ls "$tmp"/sglang-0.5.23-*.whl)" "$C/sglang_0.5.23_trim.tar.xz" --drop sglang/multimodal_gen/ \
     --drop sglang/test/ --keep-so sglang/srt/mem_cache/rust_tree_core/mem_cache.
# transformers: sglang 0.5.23 pins 5.19.0 (image: 5.17.0); 5.19.0 wants tokenizers>=0.23.1,<0.24 and the
# image's 0.23.2 fits, so no tokenizers wheel. Packed as xz (3.3 MiB, wheel 12 MiB); /tmp/sg comes first on
# PYTHONPATH, so it and its dist-info shadow the image's 5.17.0.
pack "$(ls "$tmp"/transformers-5.19.0-*.whl)" "$C/transformers_5.19.0.tar.xz"
pack_sgl_kernel "$tmp" "$C"
pack_flashinfer "$tmp" "$C" 0.7.2
# The NVFP4 sieve (scripts/device_steps.sh sieve): FlashInfer's CUTLASS and CCCL headers, which its FP4 quantizer
# JIT includes (without them b12x fails in our carry, not in FlashInfer: "cutlass/arch/barrier.h: No such
# file", session 16), as their own 3 MiB tarball; and optuna with its needs for `autotune run` there.
"$py" - "$(ls "$tmp"/flashinfer_python-0.7.2-*.whl)" "$C/flashinfer_0.7.2_headers.tar.xz" <<'PY'
import io, sys, tarfile, zipfile
z = zipfile.ZipFile(sys.argv[1])
keep = ('flashinfer/data/cutlass/include/', 'flashinfer/data/cutlass/tools/util/include/', 'flashinfer/data/cccl/')
with tarfile.open(sys.argv[2], 'w:xz', preset=9) as t:
    for n in z.namelist():
        if n.startswith(keep):
            data = z.read(n); ti = tarfile.TarInfo(n); ti.size = len(data); t.addfile(ti, io.BytesIO(data))
PY
pip_dl "$C/whl" optuna==5.0.0 sqlalchemy==2.0.44 alembic==1.17.2 mako==1.3.10 colorlog==6.10.1 greenlet==3.2.4
write_setup "$C" <<'SH'
export SGLANG_SKIP_SGL_KERNEL_VERSION_CHECK=1   # sglang-kernel 0.4.5 instead of the pinned 0.4.10
# The Rust radix TreeCore links libtorch (built for torch 2.14): if it does not load under this torch,
# take SGLang's Python TreeCore instead of failing at cache creation.
if ! python3 -c 'import glob, importlib.util as u, torch
p = glob.glob("/tmp/sg/sglang/srt/mem_cache/rust_tree_core/mem_cache.*.so")[0]
u.module_from_spec(u.spec_from_file_location("sglang.srt.mem_cache.rust_tree_core.mem_cache", p))' 2>/dev/null; then
  echo "setup: the Rust TreeCore .so does not load here -> SGLANG_UNIFIED_RADIX_TREE_CORE_BACKEND=python"
  export SGLANG_UNIFIED_RADIX_TREE_CORE_BACKEND=python
fi
SH
ls -la "$C" "$C/whl"
du -sb "$C"
