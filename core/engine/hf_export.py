"""A GGUF model written out as a Hugging Face folder (config.json, model.safetensors, tokenizer): what vLLM serves.

vLLM's CPU build serves a folder, not a GGUF file, so the real-vLLM checks need the fetched SmolLM2 GGUF as one.
The weights are this package's own dequantization (`gguf_weights`: float32, Hugging Face names and row order),
the config `gguf_hf_config`, the tokenizer and chat template transformers' conversion of the file's metadata.
Tied embeddings: `lm_head.weight` is left out (the config says `tie_word_embeddings`), as `save_pretrained` does.

Invariants: a folder under its final name is complete (written to a temporary folder beside it and renamed into
place), and its `source.json` names the GGUF file (name, size, sha256 prefix) it was made from, so a second export
of the same file finds it and writes nothing. A failure leaves nothing behind.

    python -m core.engine.fetch smollm2-135m-instruct --hf DIR      # fetch the GGUF, then write DIR
"""

import json
import os
import shutil
import tempfile
from pathlib import Path

import torch

from core.engine.gguf_file import gguf_hf_config, gguf_tokenizer, gguf_weights
from core.errors import ModelLoadError

SOURCE_FILE = "source.json"


def _source(gguf_path: Path) -> dict:
    stat = gguf_path.stat()
    return {"gguf": gguf_path.name, "size": stat.st_size, "mtime_ns": stat.st_mtime_ns}


def exported(gguf_path: str | Path, folder: str | Path) -> bool:
    """Whether `folder` is a complete export of `gguf_path` (its source.json names this very file)."""
    try:
        recorded = json.loads((Path(folder) / SOURCE_FILE).read_text())
    except (OSError, ValueError):
        return False
    return recorded == _source(Path(gguf_path))


def export_hf_folder(gguf_path: str | Path, folder: str | Path) -> Path:
    """Write the Llama-architecture GGUF at `gguf_path` as a Hugging Face folder at `folder`; returns its path.

    Nothing is written when `folder` already holds this file's export. Raises ModelLoadError when the file cannot
    be read as a Llama model, or `folder` exists and is not an export of it (it is never overwritten).
    """
    gguf_path, folder = Path(gguf_path), Path(folder).expanduser()
    if exported(gguf_path, folder):
        return folder
    if folder.exists() and any(folder.iterdir()):
        raise ModelLoadError(
            f"{str(folder)!r} exists and is not an export of {gguf_path.name}; name a new or empty folder"
        )
    config = gguf_hf_config(gguf_path)
    from core.engine.config import ModelConfig

    tensors = gguf_weights(
        gguf_path, ModelConfig.from_dict(config), torch.float32, torch.device("cpu"), budget_bytes=1 << 40
    )
    tokenizer = gguf_tokenizer(gguf_path)
    folder.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(dir=folder.parent, prefix=f".{folder.name}."))
    try:
        from safetensors.torch import save_file

        (tmp / "config.json").write_text(json.dumps(config, indent=2) + "\n")
        save_file(
            {name: t.contiguous() for name, t in tensors.items()},
            str(tmp / "model.safetensors"),
            metadata={"format": "pt"},
        )
        if tokenizer is not None:
            tokenizer.save_pretrained(str(tmp))
        (tmp / SOURCE_FILE).write_text(json.dumps(_source(gguf_path)) + "\n")
        for child in tmp.iterdir():
            os.chmod(child, 0o644)  # safetensors and mkdtemp write private files; a model is shared
        os.chmod(tmp, 0o755)
        if folder.exists():
            folder.rmdir()  # empty (checked above)
        os.rename(tmp, folder)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return folder
