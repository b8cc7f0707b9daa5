"""Start `core.serve`: build the engine, its metrics and KV-event publisher, the engine loop and the HTTP app.

`--kv-events-config` takes vLLM's JSON: {"enable_kv_cache_events": true, "publisher": "zmq", "endpoint":
"tcp://*:5557", "replay_endpoint": null, "topic": "", "buffer_steps": 10000, "hwm": 100000}. The PUB socket follows
vLLM's rule (`ZmqEventPublisher._is_bind_endpoint` in vllm/distributed/kv_events.py): a wildcard endpoint (`*`
or `::` as the host) is bound, any other is *connected to* (the consumer binds there, as a central KV-cache
indexer does). A wildcard binds the server's own --host (127.0.0.1 by default), never every interface. The
replay endpoint is always bound. Events need prefix caching (only cached blocks are announced): events without
--enable-prefix-caching are refused.

Block hashes: `--prefix-caching-hash-algo` (vLLM's flag and default, sha256; or sha256_cbor) keys the prefix cache
with vLLM's own block hashes (`core.kv.block_hash.VllmBlockHasher`), so the events carry the ints a vLLM
serving the same prompts would send.
"""

import argparse
import json
import sys
from dataclasses import dataclass
from pathlib import Path

from core.engine import Engine
from core.errors import InvalidArgumentError, LabError
from core.kv.block_hash import VLLM_HASH_ALGOS, VllmBlockHasher
from core.serve.app import ServedModel, build_app
from core.serve.exporter import ServerMetrics
from core.serve.kv_publisher import ZmqEventPublisher
from core.serve.loop import EngineLoop

REAL_MODEL = "smollm2-135m-instruct"


@dataclass(frozen=True)
class KVEventsConfig:
    endpoint: str
    replay_endpoint: str | None
    topic: str
    buffer_steps: int
    hwm: int
    bind: bool = True  # the PUB socket binds `endpoint` (a wildcard was given) or connects to it


def is_bind_endpoint(endpoint: str) -> bool:
    """vLLM's rule for its PUB socket: bind a wildcard host (`*`, `::`) or an ipc/inproc address, connect to
    any other."""
    return "*" in endpoint or "::" in endpoint or endpoint.startswith(("ipc://", "inproc://"))


def parse_kv_events_config(text: str | None, host: str) -> KVEventsConfig | None:
    """The publisher settings in vLLM's JSON, None when events are off. Raises InvalidArgumentError."""
    if not text:
        return None
    try:
        raw = json.loads(text)
    except ValueError as err:
        raise InvalidArgumentError(f"--kv-events-config is not JSON: {err}") from None
    if not isinstance(raw, dict):
        raise InvalidArgumentError("--kv-events-config must be a JSON object")
    if not raw.get("enable_kv_cache_events", False):
        return None
    if raw.get("publisher", "zmq") not in ("zmq", None):
        raise InvalidArgumentError(
            f"publisher {raw.get('publisher')!r} is not supported; this server has 'zmq'"
        )

    def address(value: str | None) -> str | None:
        if value is None:
            return None
        if not isinstance(value, str) or not value.startswith("tcp://"):
            raise InvalidArgumentError(f"KV event endpoints must be tcp://host:port, got {value!r}")
        wildcard = f"tcp://[{host}]:" if ":" in host else f"tcp://{host}:"
        return (
            value.replace("tcp://*:", wildcard)
            .replace("tcp://[::]:", wildcard)
            .replace("tcp://:::", wildcard)
        )

    topic, buffer_steps, hwm = raw.get("topic", ""), raw.get("buffer_steps", 10_000), raw.get("hwm", 100_000)
    if not isinstance(topic, str) or not all(isinstance(v, int) and v > 0 for v in (buffer_steps, hwm)):
        raise InvalidArgumentError("topic must be a string; buffer_steps and hwm positive integers")
    endpoint = raw.get("endpoint", "tcp://*:5557")
    bind = isinstance(endpoint, str) and is_bind_endpoint(endpoint)
    return KVEventsConfig(
        address(endpoint), address(raw.get("replay_endpoint")), topic, buffer_steps, hwm, bind=bind
    )


@dataclass(frozen=True)
class ServeConfig:
    """What one server serves, as `python -m core.serve`'s flags say: the model (`tiny`, REAL_MODEL, a model
    directory or .gguf file), the name it answers to (None: the model's), the KV pool (`block_size` tokens a
    block; `num_blocks` None: from the memory budget), prefix caching, the tiny model's weight seed, the
    scheduler's max_num_seqs, the KV-event publisher (None: off; events need prefix caching) and the prefix
    cache's block hash (vLLM's `--prefix-caching-hash-algo`)."""

    model: str = "tiny"
    served_name: str | None = None
    block_size: int = 16
    num_blocks: int | None = None
    prefix_caching: bool = False
    seed: int = 0
    max_num_seqs: int = 64
    events: KVEventsConfig | None = None
    hash_algo: str = "sha256"

    @classmethod
    def from_args(cls, args: argparse.Namespace) -> "ServeConfig":
        """The flags of `make_parser()`. Raises InvalidArgumentError for a bad --kv-events-config."""
        return cls(
            args.model,
            served_name=args.served_model_name,
            block_size=args.block_size,
            num_blocks=args.num_blocks,
            prefix_caching=args.enable_prefix_caching,
            seed=args.seed,
            max_num_seqs=args.max_num_seqs,
            events=parse_kv_events_config(args.kv_events_config, args.host),
            hash_algo=args.prefix_caching_hash_algo,
        )


def build_engine(config: ServeConfig) -> tuple[Engine, str]:
    """(engine, served model name). `tiny`: the lab's seeded random Llama (no files); `smollm2-135m-instruct`:
    the real model, fetched into the model cache if missing; else a model directory or .gguf file. With
    `config.events`, the engine's KV cache manager queues vLLM's KV cache events
    (`Engine(enable_kv_cache_events=True)`). The served name is the model's (`config.served_name` not applied)."""
    model = config.model
    common = {
        "block_size": config.block_size,
        "num_blocks": config.num_blocks,
        "enable_prefix_caching": config.prefix_caching,
        "max_num_seqs": config.max_num_seqs,
        "enable_kv_cache_events": config.events is not None,
        "block_hasher": VllmBlockHasher(config.hash_algo),
    }
    if model == "tiny":
        from core.engine.config import TINY_LLAMA

        return Engine.from_config(TINY_LLAMA, seed=config.seed, **common), "tiny"
    if model == REAL_MODEL:
        from core.engine.fetch import fetch_model

        return Engine.from_pretrained(fetch_model(REAL_MODEL), **common), REAL_MODEL
    return Engine.from_pretrained(Path(model), **common), model


def make_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m core.serve", description=__doc__.split("\n")[0])
    p.add_argument("--model", default="tiny", help=f"tiny | {REAL_MODEL} | a model directory or .gguf file")
    p.add_argument(
        "--served-model-name",
        default=None,
        help="the name requests and /metrics use (default: the --model name)",
    )
    p.add_argument("--host", default="127.0.0.1", help="the address to listen on (default: %(default)s)")
    p.add_argument("--port", type=int, default=8000, help="(default: %(default)s)")
    p.add_argument("--block-size", type=int, default=16, help="tokens per KV block (default: %(default)s)")
    p.add_argument(
        "--num-blocks", type=int, default=None, help="KV blocks in the pool (default: from the budget)"
    )
    p.add_argument(
        "--max-num-seqs",
        type=int,
        default=64,
        help="the most sequences in one step's batch (default: %(default)s)",
    )
    p.add_argument(
        "--enable-prefix-caching",
        action="store_true",
        help="reuse cached prompt blocks across requests (off unless given)",
    )
    p.add_argument("--kv-events-config", default=None, help="vLLM's JSON (see the module doc)")
    p.add_argument(
        "--prefix-caching-hash-algo",
        default="sha256",
        choices=VLLM_HASH_ALGOS,
        help="vLLM's block hash of the prefix cache (and the KV events)",
    )
    p.add_argument("--seed", type=int, default=0, help="weights of the tiny model")
    return p


def build_served(config: ServeConfig) -> tuple[ServedModel, ZmqEventPublisher | None]:
    """The engine, its metrics, KV-event publisher (None without `config.events`) and engine loop (not started
    yet) of one server, as `main` runs them; tests serve the same in-process. Raises LabError (a bad model, a
    publisher that cannot bind, events without prefix caching)."""
    events, prefix_caching = config.events, config.prefix_caching
    if events is not None and not prefix_caching:
        raise InvalidArgumentError("KV cache events announce cached blocks: add --enable-prefix-caching")
    engine, name = build_engine(config)
    name = config.served_name or name
    dtype = str(engine.model.dtype).removeprefix("torch.")
    metrics = ServerMetrics(
        name,
        block_size=engine.block_size,
        num_gpu_blocks=engine.num_blocks,
        prefix_caching=prefix_caching,
        dtype=dtype,
        max_model_len=engine.config.max_position_embeddings,
    )
    publisher = None
    if events is not None:
        publisher = ZmqEventPublisher(
            events.endpoint,
            events.replay_endpoint,
            events.topic,
            events.buffer_steps,
            events.hwm,
            bind=events.bind,
        )
    loop = EngineLoop(engine, metrics, publisher)
    return ServedModel(name, engine, loop, metrics, engine.config.max_position_embeddings), publisher


def main(argv: list[str] | None = None) -> int:
    import uvicorn

    args = make_parser().parse_args(argv)
    try:
        served, publisher = build_served(ServeConfig.from_args(args))
    except LabError as err:
        print(f"core.serve: {err}", file=sys.stderr)
        return 2
    loop, engine = served.loop, served.engine
    loop.start()
    where = f"events on {publisher.endpoint}" if publisher else "no KV events"
    print(
        f"core.serve: {served.name} on http://{args.host}:{args.port} ({engine.num_blocks:,} blocks of "
        f"{engine.block_size}; {where})",
        flush=True,
    )
    try:
        uvicorn.run(build_app(served), host=args.host, port=args.port, log_level="warning")
    finally:
        loop.stop()
        if publisher is not None:
            publisher.close()
    return 0
