# autotune: one image per CUDA / GPU family. The stack is pinned by build args because the tuned
# files belong to it (SGLang reads configs per Triton version; FlashInfer caches per version).
# The default stack is CUDA 13 (SGLang 0.5.23 pins torch 2.14.1, whose PyPI build is cu130): it
# covers SM90, SM100 and SM120 (RTX PRO 6000 needs CUDA >= 12.8, FlashInfer's b12x kernels CUDA 13)
# with a driver >= 580. For an older driver pick another CUDA base and torch index:
#   docker build -t autotune:cu130 .
#   docker build --build-arg CUDA_IMAGE=nvidia/cuda:12.9.1-devel-ubuntu24.04 \
#       --build-arg TORCH_INDEX_URL=https://download.pytorch.org/whl/cu129 -t autotune:cu129 .
#   docker run --gpus device=0 -v autotune-jit:/cache -v $PWD/tuned_configs:/work/tuned_configs autotune:cu130 \
#       run --shapes qwen3.5 --tp 8 --gpus all
# docs/DEPLOY.md: one job per GPU, N workers on PostgreSQL (deploy/docker-compose.yml), the dashboard.
ARG CUDA_IMAGE=nvidia/cuda:13.0.1-devel-ubuntu24.04
FROM ${CUDA_IMAGE}

ARG TORCH_INDEX_URL=https://pypi.org/simple
ARG TORCH_VERSION=2.14.1
ARG SGLANG_VERSION=0.5.23
ARG FLASHINFER_VERSION=0.7.2
ARG OPTUNA_VERSION=5.0.0
ARG PSYCOPG_VERSION=3.3.9

RUN apt-get update && apt-get install -y --no-install-recommends python3 python3-venv python3-dev git \
    && rm -rf /var/lib/apt/lists/*
RUN python3 -m venv /opt/venv
ENV PATH=/opt/venv/bin:$PATH PYTHONUNBUFFERED=1

# The GPU stack, in full: torch for this CUDA, SGLang with its sgl_kernel, FlashInfer (JIT kernels
# compile on first use into the cache volume below).
RUN pip install --no-cache-dir --index-url ${TORCH_INDEX_URL} "torch==${TORCH_VERSION}" \
    && pip install --no-cache-dir "sglang==${SGLANG_VERSION}" "flashinfer-python==${FLASHINFER_VERSION}" \
       "optuna==${OPTUNA_VERSION}" "psycopg[binary]==${PSYCOPG_VERSION}" pandas pyyaml tqdm matplotlib

WORKDIR /opt/autotune
COPY pyproject.toml README.md ./
COPY autotune ./autotune
COPY search_spaces ./search_spaces
RUN pip install --no-cache-dir --no-deps -e .

# JIT caches (Triton, FlashInfer, SGLang's own kernels) on a volume: compiled once per machine.
RUN useradd --create-home --uid 1000 tuner && mkdir -p /work /cache && chown tuner /work /cache
ENV TRITON_CACHE_DIR=/cache/triton FLASHINFER_WORKSPACE_BASE=/cache SGLANG_CACHE_DIR=/cache/sglang \
    XDG_CACHE_HOME=/cache
VOLUME ["/cache"]
USER tuner
WORKDIR /work
ENTRYPOINT ["autotune"]
CMD ["--help"]
