# autotune: one image per CUDA / GPU family. The stack is pinned by build args because the tuned
# files belong to it (SGLang reads configs per Triton version; FlashInfer caches per version).
# The default stack is CUDA 13 (SGLang 0.5.23 pins torch 2.14.1, whose PyPI build is cu130): it
# covers SM90, SM100 and SM120 (RTX PRO 6000 needs CUDA >= 12.8, FlashInfer's b12x kernels CUDA 13)
# with a driver >= 580. For an older driver pick another CUDA base and torch index:
#   docker build -t autotune:cu130 .
#   docker build --build-arg CUDA_IMAGE=docker.io/nvidia/cuda:12.9.1-devel-ubuntu24.04 \
#       --build-arg TORCH_INDEX_URL=https://download.pytorch.org/whl/cu129 --build-arg IMAGE_STACK=resolve \
#       -t autotune:cu129 .
# Image names are written in full (registry and all): podman resolves no short name without a registries.conf.
#   docker run --gpus device=0 -v autotune-jit:/cache -v $PWD/tuned_configs:/work/tuned_configs autotune:cu130 \
#       run --shapes qwen3.5 --tp 8 --gpus all
# docs/DEPLOY.md: one job per GPU, N workers on PostgreSQL (deploy/docker-compose.yml), the dashboard.
ARG CUDA_IMAGE=docker.io/nvidia/cuda:13.0.1-devel-ubuntu24.04
FROM ${CUDA_IMAGE}

ARG TORCH_INDEX_URL=https://pypi.org/simple
ARG TORCH_VERSION=2.14.1
ARG SGLANG_VERSION=0.5.23
ARG FLASHINFER_VERSION=0.7.2
ARG OPTUNA_VERSION=5.0.0
ARG PSYCOPG_VERSION=3.3.9

# ca-certificates: a plain Debian base has no CA bundle (nvidia/cuda's has); PIP_CERT below names it.
# apt-get clean: nvidia/cuda's base drops downloaded packages by its own apt configuration, a plain
# Debian base (debootstrap) keeps them in the layer.
RUN apt-get update && apt-get install -y --no-install-recommends python3 python3-venv python3-dev git ca-certificates \
    && apt-get clean && rm -rf /var/lib/apt/lists/*
RUN python3 -m venv /opt/venv
ENV PATH=/opt/venv/bin:$PATH PYTHONUNBUFFERED=1

# The CA bundle pip verifies with (an ARG is in RUN's environment, and pip reads PIP_CERT): the
# image's own by default. Behind a TLS-inspecting proxy, give the machine's bundle as a build secret,
# mounted read-only at its own path for the pip steps only, never a layer of the image:
#   docker build --secret id=pip-cert,src=/etc/ssl/certs/ca-certificates.crt \
#       --build-arg PIP_CERT=/etc/ssl/certs/ca-certificates.crt ...      (scripts/build_image.sh does this)
ARG PIP_CERT=/etc/ssl/certs/ca-certificates.crt

# The GPU stack, in full: torch for this CUDA, SGLang with its sgl_kernel, FlashInfer (JIT kernels
# compile on first use into the cache volume below). pip installs exactly Dockerfile.pip-freeze.txt,
# the image's lock (every package at its version, with the sha256 of the files the index offers where
# it gives them), resolving nothing (--no-deps): two builds a day apart install the same stack, and the
# layer is built again only when the lock changes (COPY keys the cache on its bytes).
# IMAGE_STACK=resolve resolves the stack afresh instead, as scripts/lock_image.sh does to write a new lock
# (a deliberate step: docs/DEPLOY.md): the Dockerfile's version args, and every package the CPU tests run
# held at the version they ran (requirements/cpu.lock, as constraints), except two that SGLang's full
# dependency tree forbids at those versions (the CPU setup installs SGLang without its dependencies):
# numpy < 2.4 (mistral-common, on Python <= 3.12) and python-dateutil < 3. The version args must equal
# requirements/ and the lock (tests/repo/test_deploy.py); another stack is a change of all three.
ARG IMAGE_STACK=locked
COPY Dockerfile.pip-freeze.txt requirements/cpu.lock /tmp/lock/
RUN --mount=type=secret,id=pip-cert,target=${PIP_CERT} \
    if [ "${IMAGE_STACK}" = resolve ]; then \
      grep -v -E '^(numpy|python-dateutil)==' /tmp/lock/cpu.lock > /tmp/constraints.txt \
      && pip install --no-cache-dir -c /tmp/constraints.txt --index-url ${TORCH_INDEX_URL} "torch==${TORCH_VERSION}" \
      && pip install --no-cache-dir -c /tmp/constraints.txt "sglang==${SGLANG_VERSION}" \
         "flashinfer-python==${FLASHINFER_VERSION}" "optuna==${OPTUNA_VERSION}" "psycopg[binary]==${PSYCOPG_VERSION}" \
         pandas pyyaml tqdm matplotlib; \
    else \
      pip install --no-cache-dir --no-deps --extra-index-url ${TORCH_INDEX_URL} -r /tmp/lock/Dockerfile.pip-freeze.txt; \
    fi \
    && rm -rf /tmp/lock /tmp/constraints.txt && pip check
# podman build (buildah) deletes a secret's mount target after its step, even a file the image had:
# the bundle is made again from the image's own certificates (a no-op where the file was left alone).
RUN update-ca-certificates >/dev/null

WORKDIR /opt/autotune
COPY pyproject.toml README.md ./
COPY autotune ./autotune
COPY search_spaces ./search_spaces
# --no-build-isolation: the setuptools installed above builds it (no index needed, nor a CA bundle).
RUN pip install --no-cache-dir --no-deps --no-build-isolation -e .

# JIT caches (Triton, FlashInfer, SGLang's own kernels) on a volume: compiled once per machine.
# uid 1000 (a host user's usual uid, so files on bind mounts are theirs); Ubuntu 24.04 (nvidia/cuda's
# base) already gives it to the user `ubuntu`, and useradd then refuses it.
RUN if getent passwd 1000 >/dev/null; then userdel --remove "$(getent passwd 1000 | cut -d: -f1)"; fi \
    && useradd --create-home --uid 1000 tuner && mkdir -p /work /cache && chown tuner /work /cache
ENV TRITON_CACHE_DIR=/cache/triton FLASHINFER_WORKSPACE_BASE=/cache SGLANG_CACHE_DIR=/cache/sglang \
    XDG_CACHE_HOME=/cache
VOLUME ["/cache"]
# The base it was built FROM, for people and for tests/repo/test_container.py (which builds the PostgreSQL
# image of deploy/ on the same base).
ARG CUDA_IMAGE
LABEL org.opencontainers.image.base.name=${CUDA_IMAGE}
USER tuner
WORKDIR /work
ENTRYPOINT ["autotune"]
CMD ["--help"]
