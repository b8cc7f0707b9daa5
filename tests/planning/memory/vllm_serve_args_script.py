"""Run under vLLM's interpreter (tests/vllm_reference.py). Reads {"texts": [text, ...]} on stdin, each text a block of
`vllm serve` commands as the lab prints them (comment lines, lines continued by a backslash), and parses every
command with vLLM's own `vllm serve` parser (`make_arg_parser`, `validate_parsed_serve_args`,
`AsyncEngineArgs.from_cli_args`). Prints {"parsed": per text, per command, the engine arguments the lab sets, or
{"error": what vLLM's parser said}}."""

import contextlib
import io
import json
import shlex
import sys

from vllm.engine.arg_utils import AsyncEngineArgs
from vllm.entrypoints.launchers.cli_args import make_arg_parser, validate_parsed_serve_args
from vllm.utils.argparse_utils import FlexibleArgumentParser

FIELDS = (
    "model",
    "tensor_parallel_size",
    "pipeline_parallel_size",
    "data_parallel_size",
    "enable_expert_parallel",
    "kv_cache_dtype",
    "gpu_memory_utilization",
    "max_model_len",
    "block_size",
    "max_num_seqs",
    "max_num_batched_tokens",
    "quantization",
    "dtype",
    "disable_hybrid_kv_cache_manager",
    "kv_offloading_size",
    "kv_offloading_backend",
)


def commands(text: str) -> list[list[str]]:
    """Each command of `text` as its words: comment lines dropped, continued lines joined."""
    kept = "\n".join(line for line in text.splitlines() if not line.lstrip().startswith("#"))
    return [shlex.split(line) for line in kept.replace("\\\n", " ").splitlines() if line.strip()]


def parse(words: list[str]) -> dict:
    if words[:2] != ["vllm", "serve"]:
        return {"error": f"not a vllm serve command: {words[:2]}"}
    said = io.StringIO()
    try:
        with contextlib.redirect_stderr(said):
            args = make_arg_parser(FlexibleArgumentParser()).parse_args(words[2:])
        validate_parsed_serve_args(args)
    except (SystemExit, ValueError, TypeError) as err:
        return {"error": said.getvalue().strip() or repr(err)}
    args.model = args.model_tag
    engine = AsyncEngineArgs.from_cli_args(args)
    out = {name: getattr(engine, name) for name in FIELDS}
    transfer = engine.kv_transfer_config
    out["kv_transfer_config"] = None if transfer is None else [transfer.kv_connector, transfer.kv_role]
    return out


payload = json.loads(sys.stdin.read())
print(json.dumps({"parsed": [[parse(words) for words in commands(text)] for text in payload["texts"]]}))
