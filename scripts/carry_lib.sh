# Shared by scripts/make_sglang016_carry.sh and make_sglang023_carry.sh (source it after setting `py`):
# wheels for the lent H200's image (Python 3.12, torch 2.11.0+cu130, triton 3.6.0, no network), packed
# into solid xz tarballs, and the setup.sh both carries source on the device.
lib_dir=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
plat=(--platform manylinux_2_34_x86_64 --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64
      --platform manylinux_2_24_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64
      --platform manylinux1_x86_64)
pip_dl() { "$py" -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 \
             --implementation cp "${plat[@]}" -d "$1" "${@:2}" 2>&1 | grep -v 'is ignored' || true; }
pack() { "$py" "$lib_dir/carry_pack.py" "$@"; }       # SOURCE OUT.tar.xz [--drop P]... [--keep-so P]...

# What the server's import path needs beyond the image in both releases (found by importing SGLang's
# server, one-batch and Qwen3.5 modules with only the image's packages + these on the path); each
# script adds the wheels its release pins differently.
SERVER_WHEELS=(orjson==3.13.0 pybase64==1.5.1 pyzmq==27.3.0 msgspec==0.23.0
  pydantic==2.14.4 pydantic_core==2.50.5 annotated-types==0.8.0 typing-inspection==0.4.5 typing_extensions==4.16.0
  starlette==1.10.0 fastapi==0.165.0 opentelemetry-api==1.45.2 importlib-metadata==10.2.0 uvicorn==0.54.0
  ipython==9.18.1 traitlets==5.16.1 dill==0.4.1 jiter==0.19.0 distro==1.9.0 sniffio==1.3.1
  partial_json_parser==0.2.1.1.post7 loguru==0.7.3 gguf==0.19.0 setproctitle==1.3.8
  jsonschema==4.26.0 jsonschema-specifications==2025.9.1 referencing==0.37.0 rpds-py==2026.9.1
  soundfile==0.13.1 cffi==2.1.1 pycparser==3.12 python-multipart==0.0.34 apache-tvm-ffi==0.1.11)

# sglang-kernel 0.4.5 (383 MB wheel; built for torch 2.11, CUDA 13): keep the SM90 common_ops (15 MB),
# spatial_ops, all Python, triton_kernels. Dropped: flash_ops.abi3.so (342 MB, FA3, imported only by
# sgl_kernel/flash_attn.py), sm100/ (SM100 ops), infllm_ops (lazy loader, InfLLM-V2 attention),
# flashmla_ops (import guarded by try/except in flash_mla.py).
pack_sgl_kernel() {   # DOWNLOADS CARRY
  pack "$(ls "$1"/sglang_kernel-0.4.5-*.whl)" "$2/sgl_kernel_0.4.5_sm90.tar.xz" --drop sgl_kernel/flash_ops.abi3.so \
       --drop sgl_kernel/sm100/ --drop sgl_kernel/infllm_ops --drop sgl_kernel/flashmla_ops
}

# FlashInfer: SGLang's sampler imports it. Keep all Python + csrc/include/spdlog; drop the CUTLASS and CCCL
# header trees (JIT of CUTLASS kernels, not used with the triton attention / triton MoE / pytorch sampling
# backends these carries run).
pack_flashinfer() {   # DOWNLOADS CARRY VERSION
  pack "$(ls "$1"/flashinfer_python-"$3"-*.whl)" "$2/flashinfer_$3_trim.tar.xz" \
       --drop flashinfer/data/cutlass/ --drop flashinfer/data/cccl/
}

# setup.sh: install the small wheels, unpack the tarballs, paths and caches, then the release's own
# lines (stdin), then CUDA_HOME: SGLang's JIT kernels build with nvcc (tvm-ffi) and want a CUDA_HOME whose
# lib64 holds libcudart.so (same fix as shared/device/make_sglang_carry.sh).
write_setup() {       # CARRY (relative to the repo root, as the device sees it) < release lines
  local rel=${1#"$root"/}
  {
    echo "# source from the repo root on the device: \`source $rel/setup.sh\`"
    echo "C=$rel"
    cat <<'SH'
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site $C/whl/*.whl || return 9
mkdir -p /tmp/sg
for t in $C/*.tar.xz; do tar -xJf "$t" -C /tmp/sg || return 8; done
export PYTHONPATH=/tmp/sg:/tmp/site${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1
export TRITON_CACHE_DIR=${TRITON_CACHE_DIR:-/tmp/triton_cache}
export FLASHINFER_WORKSPACE_BASE=${FLASHINFER_WORKSPACE_BASE:-/tmp/fiws}
SH
    cat
    cat <<'SH'
nv=$(command -v nvcc); ch=$(dirname "$(dirname "$nv")")
if [ ! -e "$ch/lib64/libcudart.so" ]; then
  l=$(ls "$ch"/lib64/libcudart.so* "$ch"/lib/libcudart.so* /usr/local/cuda*/targets/x86_64-linux/lib/libcudart.so* 2>/dev/null | head -1)
  [ -n "$l" ] || l=$(find / -name 'libcudart.so*' -not -path '/proc/*' 2>/dev/null | head -1)
  mkdir -p /tmp/cudahome/lib64; ln -sfn "$ch/bin" /tmp/cudahome/bin; ln -sfn "$ch/include" /tmp/cudahome/include
  ln -sf "$l" /tmp/cudahome/lib64/libcudart.so; export CUDA_HOME=/tmp/cudahome
fi
SH
  } > "$1/setup.sh"
}
