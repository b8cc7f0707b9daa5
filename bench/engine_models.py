"""The models `bench/engine.py` compares on: one set of weights loaded by transformers and by our engine.

    tiny                    a seeded random LlamaForCausalLM (4 layers, hidden 256, 8 query / 4 KV heads, vocab
                            4,096, fp32) saved with save_pretrained to a temporary directory;
    smollm2-135m-instruct   the real model: `core.engine.fetch.fetch_model` (downloaded once), its Q4_1 GGUF file
                            dequantized to float32 by both transformers (`gguf_file=`) and our loader;
    PATH                    a Hugging Face model directory, or a Llama-architecture .gguf file.
Both sides run float32 on the CPU. transformers never stops at EOS here (the bench fixes every output length).
"""

import atexit
import shutil
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import torch

TINY = {
    "vocab_size": 4096,
    "hidden_size": 256,
    "intermediate_size": 688,
    "num_hidden_layers": 4,
    "num_attention_heads": 8,
    "num_key_value_heads": 4,
    "max_position_embeddings": 1024,
}


@dataclass
class BenchModels:
    """hf: the transformers model (eval, float32). engine(**options): a fresh `Engine` on the same weights.
    vocab: the vocabulary size; low_id: the first token id that is not a special token (prompts draw from
    [low_id, vocab)); pad_id: the id padding the left of a transformers batch (masked out)."""

    hf: object
    engine: Callable
    vocab: int
    low_id: int
    pad_id: int
    description: str


def _tiny() -> tuple[Path, str]:
    from transformers import LlamaConfig, LlamaForCausalLM

    directory = Path(tempfile.mkdtemp(prefix="bench_engine_"))
    atexit.register(shutil.rmtree, directory, ignore_errors=True)
    torch.manual_seed(0)
    config = LlamaConfig(
        **TINY, pad_token_id=0, bos_token_id=None, eos_token_id=None, tie_word_embeddings=False
    )
    LlamaForCausalLM(config).save_pretrained(directory)
    return directory, "tiny: random Llama, 4 layers, hidden 256, 8/4 heads, vocab 4,096, fp32"


def _hf_model(path: Path):
    from transformers import AutoModelForCausalLM

    if path.suffix.lower() == ".gguf":
        model = AutoModelForCausalLM.from_pretrained(path.parent, gguf_file=path.name, dtype=torch.float32)
    else:
        model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)
    return model.eval()


def load_models(name: str) -> BenchModels:
    """Both sides of the comparison for `--model name` (see the module docstring)."""
    from core.engine import Engine

    if name == "tiny":
        path, description = _tiny()
    elif name == "smollm2-135m-instruct":
        from core.engine.fetch import fetch_model

        path = fetch_model(name)
        description = (
            "SmolLM2-135M-Instruct (Q4_1 GGUF dequantized to fp32): 30 layers, hidden 576, 9/3 heads"
        )
    else:
        path = Path(name)
        description = str(path)
    hf = _hf_model(path)
    probe = Engine.from_pretrained(path, num_blocks=1, dtype=torch.float32, device="cpu", warmup=False)
    special = getattr(probe.tokenizer, "all_special_ids", None) or [0]
    vocab = probe.config.vocab_size
    del probe
    pad_id = 0
    hf.generation_config.eos_token_id = None  # every output runs its full length, as the engine's ignore_eos
    hf.generation_config.pad_token_id = pad_id

    def engine(**options):
        return Engine.from_pretrained(path, dtype=torch.float32, device="cpu", **options)

    return BenchModels(hf, engine, vocab, max(special) + 1, pad_id, description)
