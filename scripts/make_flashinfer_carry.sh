#!/usr/bin/env bash
# Builds, in the project's root, the folder `.carry-fi/` (at most 36 MiB, to travel beside the
# 24 MiB sglang `.carry/` in one 64 MiB device call) that lets FlashInfer import and JIT-build, on the
# lent H200 (Python 3.12, torch 2.11 cu130, nvcc 13.0, no network), flashinfer.gemm.bmm_fp8
# (cublas and cudnn backends) and flashinfer.fused_moe.cutlass_fused_moe for SM90 (bf16, fp8).
# Run it here, from the project root, with the dev venv (it has the same flashinfer, which lists the
# files those two JIT modules read). Device call: carry=[".carry", ".carry-fi"], command starting
#   source .carry/setup.sh >/dev/null 2>&1; source .carry-fi/setup.sh >/dev/null 2>&1; python3 ...
# Usage: bash scripts/make_flashinfer_carry.sh
set -euo pipefail
root=$(git rev-parse --show-toplevel)
cd "$root"
py=${PYTHON:-$root/.venv/bin/python}
grep -qx '/.carry-fi/' .git/info/exclude 2>/dev/null || echo '/.carry-fi/' >> .git/info/exclude
rm -rf .carry-fi && mkdir -p .carry-fi/whl
plat=(--platform manylinux_2_34_x86_64 --platform manylinux_2_28_x86_64 --platform manylinux_2_24_x86_64
      --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 --platform manylinux1_x86_64)
pip_dl() { "$py" -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 \
             --implementation cp "${plat[@]}" -d "$1" "${@:2}"; }
# The venv's version (0.7.2): its installed copy is what check_flashinfer_carry.py compares against.
ver=$("$py" -m pip show flashinfer-python | sed -n 's/^Version: //p')
tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT
pip_dl "$tmp" "flashinfer-python==$ver"
# `import flashinfer, flashinfer.gemm, flashinfer.fused_moe` imports, of what the image lacks, only
# apache-tvm-ffi (it rides in .carry/); cuda-bindings, click, einops, tabulate... are in the image.
# The cuDNN frontend is optional (try/except) and enables bmm_fp8's cudnn backend (libcudnn itself is
# torch's nvidia-cudnn-cu13). nvidia-cutlass-dsl, cuda-tile, nccl4py, nccl-extensions are only probed
# (find_spec) or imported lazily by other kernels: not carried.
pip_dl .carry-fi/whl nvidia-cudnn-frontend==1.32.0
"$py" -c "import zipfile, sys; zipfile.ZipFile(sys.argv[1]).extractall(sys.argv[2])" "$tmp"/flashinfer_python-*.whl "$tmp/full"
# The data files the SM90 gemm and fused_moe_90 builds read (sources, #include closure, whole CUTLASS
# and CCCL header trees); the rest of data/ (262 MB of other kernels' csrc, CUTLASS/CCCL docs, tests,
# python) is dropped. All Python of the package is kept: xz makes it small, and lazy imports stay safe.
"$py" scripts/check_flashinfer_carry.py "$tmp/full" --list > "$tmp/keep"
"$py" - "$tmp/full" "$tmp/keep" ".carry-fi/flashinfer_${ver}_sm90.tar.xz" <<'PY'
import os, sys, tarfile
full, keep, out = sys.argv[1], set(open(sys.argv[2]).read().split()), sys.argv[3]
with tarfile.open(out, "w:xz", preset=9) as t:   # solid xz: ~4x smaller than the wheel's zip here
    for d, _, fs in os.walk(full):
        for f in sorted(fs):
            rel = os.path.relpath(os.path.join(d, f), full)
            if rel.startswith("flashinfer/data/") and rel not in keep or rel.endswith("dist-info/RECORD"):
                continue
            t.add(os.path.join(full, rel), rel)
PY
cat > .carry-fi/setup.sh <<'SH'
# source this after .carry/setup.sh (it installs apache-tvm-ffi and sets PYTHONPATH/CUDA_HOME):
#   source .carry/setup.sh >/dev/null 2>&1; source .carry-fi/setup.sh >/dev/null 2>&1; python3 ...
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .carry-fi/whl/*.whl || return 9
[ -d /tmp/fi/flashinfer ] || python3 -c "import glob, tarfile; tarfile.open(glob.glob('.carry-fi/flashinfer_*.tar.xz')[0]).extractall('/tmp/fi', filter='data')" || return 8
export PYTHONPATH=/tmp/fi:/tmp/site${PYTHONPATH:+:$PYTHONPATH}
# JIT cache and generated CUTLASS instantiations: $FLASHINFER_WORKSPACE_BASE/.cache/flashinfer/...
export FLASHINFER_WORKSPACE_BASE=${FLASHINFER_WORKSPACE_BASE:-/tmp/fiws}
# The image's CUDA is pip-built (nvcc, cudart, CCCL): cuda_env.py adds what these builds also need.
env_sh=$(python3 .carry-fi/cuda_env.py) || return 7
eval "$env_sh"
SH
cat > .carry-fi/cuda_env.py <<'PY'
"""Prints the FLASHINFER_EXTRA_* exports FlashInfer's JIT needs on an image whose CUDA is pip-built
(as on the H200 and this CPU machine): nvcc, cudart and CCCL, but no cuBLAS/cuRAND headers (bmm_fp8.cu,
CUTLASS's util headers), maybe no CUDA headers where $CUDA_HOME/include points (the .cpp sources), no
unversioned libcublas/libcublasLt/libnvrtc/libcuda to link. They come from torch's nvidia-* wheels,
nvcc's own folders and the driver. FlashInfer appends these flags to every build it writes."""
import ctypes, glob, os, re, shutil, subprocess, nvidia
lib = "/tmp/fi_cuda/lib"
os.makedirs(lib, exist_ok=True)
dry = subprocess.run([shutil.which("nvcc"), "--dryrun", "-c", "x.cu"], capture_output=True, text=True).stderr
cuda_inc = re.search(r'^#\$ INCLUDES="-I([^"]+)"', dry, re.M).group(1)   # nvcc's own include dir
cuda_lib = re.search(r'"-L([^"]+/lib)"', dry).group(1)
pip = [p for d in nvidia.__path__ for p in glob.glob(d + "/*/")]       # nvidia/cu13/, nvidia/cudnn/, ...
inc = [p + "include" for p in pip if os.path.exists(p + "include/cublasLt.h")]
for name in ("cublas", "cublasLt", "nvrtc", "cudart"):
    found = glob.glob(f"{cuda_lib}/lib{name}.so*") + [f for p in pip for f in glob.glob(f"{p}lib/lib{name}.so.*")]
    if found and not os.path.lexists(f"{lib}/lib{name}.so"):
        os.symlink(sorted(found, key=len)[0], f"{lib}/lib{name}.so")
try:  # the driver's libcuda, wherever the loader finds it (no driver: -lcuda fails at link time)
    ctypes.CDLL("libcuda.so.1")
    drv = re.search(r"(/\S+/libcuda\.so[.\d]*)\n", open("/proc/self/maps").read()).group(1)
    os.path.lexists(f"{lib}/libcuda.so") or os.symlink(drv, f"{lib}/libcuda.so")
except OSError:
    pass
isys = " ".join(f"-isystem {d}" for d in inc)
print(f'export FLASHINFER_EXTRA_CFLAGS="-isystem {cuda_inc} {isys}"\n'
      f'export FLASHINFER_EXTRA_CUDAFLAGS="{isys}"\nexport FLASHINFER_EXTRA_LDFLAGS="-L{lib}"')
PY
rm -rf "$tmp/full" && mkdir "$tmp/full"
"$py" -c "import tarfile, glob; tarfile.open(glob.glob('.carry-fi/*.tar.xz')[0]).extractall('$tmp/full', filter='data')"
"$py" scripts/check_flashinfer_carry.py "$tmp/full"   # every file the two SM90 builds read is there
du -sb .carry-fi
echo "device call: carry=[\".carry\", \".carry-fi\"], command starting with:"
echo "  source .carry/setup.sh >/dev/null 2>&1; source .carry-fi/setup.sh >/dev/null 2>&1; ..."
