"""Where fetched models (and what is made from them: converted tokenizers, Hugging Face folders) are kept."""

import os
from pathlib import Path

CACHE_VARIABLE = "PAGED_LAB_MODEL_CACHE"
DEFAULT_CACHE = Path("~/.cache/paged-attention-lab/models")


def model_cache_dir(cache_dir: str | Path | None = None) -> Path:
    """The directory models are cached in: `cache_dir`, else $PAGED_LAB_MODEL_CACHE, else ~/.cache/...; not created."""
    if cache_dir is None:
        cache_dir = os.environ.get(CACHE_VARIABLE, "").strip() or DEFAULT_CACHE
    return Path(cache_dir).expanduser()
