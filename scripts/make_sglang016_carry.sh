#!/usr/bin/env bash
# Builds .sglang016/carry/ (git-ignored, ~46 MiB): what the lent H200 (Python 3.12, torch 2.11.0+cu130,
# triton 3.6.0, transformers 5.17.0, no network) needs to run SGLang 0.5.16's bench_one_batch / server.
# Run here from the checkout (needs the package registry). Device call: scripts/sglang_arms_h200.sh.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
root=$(git -C "$here" rev-parse --show-toplevel)
py=${PYTHON:-python3}
source "$here/carry_lib.sh"
C=$root/.sglang016/carry        # git-ignored (.gitignore)
rm -rf "$C" && mkdir -p "$C/whl"
tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT
pip_dl "$tmp" sglang==0.5.16 sglang-kernel==0.4.5 flashinfer_python==0.6.14

# The server path's imports beyond the image (carry_lib.sh), with 0.5.16's pins of openai and compressed-tensors.
# sglang 0.5.16 pins transformers==5.12.1; the image's 5.17.0 lacks Qwen2_5_VisionRotaryEmbedding, which
# sglang/srt/models/qwen2_5_vl.py imports, so the multimodal processor module qwen_vl.py fails to import and the
# server's TokenizerManager stops with "No processor registered for architecture: ['Qwen3_5MoeForConditionalGeneration']"
# (bench_one_batch does not need it). transformers 5.12.1 wants tokenizers<=0.23.0 (image: 0.23.2) -> 0.22.2.
pip_dl "$C/whl" "${SERVER_WHEELS[@]}" openai==2.6.1 compressed-tensors==0.20.1 transformers==5.12.1 tokenizers==0.22.2

# sglang 0.5.16: no Rust extensions (srt/grpc/_core: gRPC server mode only; srt/multimodal/_core: Inkling
# image preprocessing only), no multimodal_gen/ (diffusion). Patched (sglang016_patch.py) before packing.
"$py" -c "import glob, sys, zipfile; zipfile.ZipFile(glob.glob(sys.argv[1] + '/sglang-0.5.16-*.whl')[0]).extractall(sys.argv[1] + '/sg')" "$tmp"
"$py" "$here/sglang016_patch.py" "$tmp/sg"
pack "$tmp/sg" "$C/sglang_0.5.16_trim.tar.xz" --drop sglang/multimodal_gen/ --no-so
pack_sgl_kernel "$tmp" "$C"
pack_flashinfer "$tmp" "$C" 0.6.14
write_setup "$C" < /dev/null
ls -la "$C" "$C/whl"
du -sb "$C"
