# First version: one image per CUDA / GPU family. Build args pin the stack the configs are tuned
# for (the Triton version is part of SGLang's config path). A later issue adds the FlashInfer
# backends, the JIT cache volume and multi-worker deployment.
#   docker build -t autotune:cu129 .
#   docker run --gpus device=0 -v $PWD/tuned_configs:/work/tuned_configs autotune:cu129 \
#       run --shapes qwen3.5 --tp 8 --gpus all --storage sqlite:////work/tuned_configs/autotune.db
ARG CUDA_IMAGE=nvidia/cuda:12.9.1-devel-ubuntu24.04
FROM ${CUDA_IMAGE}

ARG SGLANG_VERSION=0.5.23
ARG OPTUNA_VERSION=5.0.0

RUN apt-get update && apt-get install -y --no-install-recommends python3 python3-venv python3-dev git \
    && rm -rf /var/lib/apt/lists/*
RUN python3 -m venv /opt/venv
ENV PATH=/opt/venv/bin:$PATH PYTHONUNBUFFERED=1
# Full SGLang: its torch, triton, sgl_kernel and flashinfer are what the tuned files are for.
RUN pip install --no-cache-dir "sglang==${SGLANG_VERSION}" "optuna==${OPTUNA_VERSION}" pandas pyyaml tqdm

WORKDIR /opt/autotune
COPY pyproject.toml README.md ./
COPY autotune ./autotune
COPY search_spaces ./search_spaces
RUN pip install --no-cache-dir --no-deps -e .

RUN useradd --create-home --uid 1000 tuner && mkdir -p /work && chown tuner /work
USER tuner
WORKDIR /work
ENV TRITON_CACHE_DIR=/work/.triton
ENTRYPOINT ["autotune"]
CMD ["--help"]
