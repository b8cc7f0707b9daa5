"""What planned vs observed (`core.planning.observed.planned`) plans with: the step-time roofline of the server's model on its
hardware (efficiencies and overhead then fitted to its histograms) and the scheduler limits it runs under.

- A vLLM server: the model from its `model_name` label when that is a planner preset (`core.planning.catalog.models`:
  the slug, or its Hugging Face repository, case-insensitive) or the preset the user picks; the hardware a GPU
  preset (`core.planning.catalog.hardware`) with a tensor-parallel size (`core.planning.cost.step_time.from_specs`).
- `core.serve` on this CPU: its model's own config (`tiny`, or the cached real model's GGUF header; nothing is
  downloaded) and weights in the served dtype (vllm:cache_config_info's cache_dtype), on the roofs measured in
  this process (`core.planning.cost.cpu_roofline`). The roofs are the server machine's only when the page runs there.
- A vLLM server whose model is no preset: its Hugging Face config.json (the folder its /v1/models `root` names,
  read when it runs on this machine, or one the user gives: `core.live.served_model`); on this machine's CPU
  (vLLM's CPU build) the roofline of that config on the measured roofs, in the dtype vLLM serves it in
  (`core.planning.memory.cpu_kv.cpu_model_dtype`), else on the chosen GPU preset (`hf_gpu_step_model`).
- Limits: the KV capacity from vllm:cache_config_info (num_gpu_blocks x block_size); max_num_seqs,
  max_num_batched_tokens and max_model_len are not in /metrics: the user's (vLLM's defaults offered).
"""

from core.errors import InvalidArgumentError
from core.live.metrics import VllmMetrics
from core.planning.catalog.hardware import get_gpu
from core.planning.catalog.models import MODELS, ModelSpec, get_model
from core.planning.cost.cpu_roofline import engine_step_model
from core.planning.cost.fits.engine_profiles import engine_step_defaults
from core.planning.cost.step_model import StepTimeModel
from core.planning.cost.step_time import from_specs
from core.planning.observed.planned import ServerLimits

CORE_SERVE_MODELS = ("tiny", "smollm2-135m-instruct")  # the names `python -m core.serve --model` serves as
DTYPE_BYTES = {"float32": 4, "float16": 2, "bfloat16": 2}


def preset_for(served_name: str | None) -> str | None:
    """The planner preset a served model name is, or None: the slug itself, or the preset whose Hugging Face
    repository equals it (case-insensitive; "meta-llama/Llama-3.1-8B" finds llama-3.1-8b)."""
    if not served_name:
        return None
    name = served_name.strip().lower()
    for slug, spec in MODELS.items():
        if name == slug or (spec.hf_repo and name == spec.hf_repo.lower()):
            return slug
    return None


def gpu_step_model(
    model_slug: str, gpu_slug: str, tensor_parallel: int = 1, engine: str | None = None
) -> StepTimeModel:
    """The roofline of a preset model on `tensor_parallel` preset GPUs; with `engine` (ENGINES), priced with that
    engine's fitted profile, as the SLO planner prices it. Raises InvalidArgumentError naming the known presets
    (or engines) when one is unknown."""
    overrides = {} if engine is None else engine_step_defaults(engine)
    return from_specs(get_model(model_slug), get_gpu(gpu_slug), tensor_parallel=tensor_parallel, **overrides)


def hf_gpu_step_model(model: ModelSpec, gpu_slug: str, tensor_parallel: int = 1) -> StepTimeModel:
    """The roofline of a model read from its config.json on `tensor_parallel` preset GPUs."""
    return from_specs(model, get_gpu(gpu_slug), tensor_parallel=tensor_parallel)


def hf_cpu_step_model(model: ModelSpec, roofs: dict, dtype: str) -> StepTimeModel:
    """The roofline of a model read from its config.json served on this CPU in `dtype` (DTYPE_BYTES): its
    parameters (`ModelSpec.num_params`: the config's estimate) in that dtype, on the measured roofs."""
    if dtype not in DTYPE_BYTES:
        raise InvalidArgumentError(f"dtype must be one of {', '.join(DTYPE_BYTES)}, got {dtype!r}")
    size = DTYPE_BYTES[dtype]
    return engine_step_model(
        model.shape, weight_bytes=float(model.num_params * size), dtype_bytes=size, roofs=roofs
    )


def core_serve_step_model(served_name: str, roofs: dict, dtype: str = "float32") -> StepTimeModel:
    """The roofline of `core.serve`'s model `served_name` (CORE_SERVE_MODELS) on these roofs. Raises
    InvalidArgumentError for another name, an unknown dtype, or a real model that is not in the model cache."""
    from core.engine.config import TINY_LLAMA, ModelConfig
    from core.engine.weights import expected_shapes

    if dtype not in DTYPE_BYTES:
        raise InvalidArgumentError(f"dtype must be one of {', '.join(DTYPE_BYTES)}, got {dtype!r}")
    if served_name == "tiny":
        config = ModelConfig.from_dict(TINY_LLAMA)
    elif served_name in CORE_SERVE_MODELS:
        from core.engine.fetch import cached_model
        from core.engine.gguf_file import gguf_config

        path = cached_model(served_name)
        if path is None:
            raise InvalidArgumentError(
                f"{served_name} is not in the model cache: `python -m core.engine.fetch {served_name}` fetches it"
            )
        config = gguf_config(path)
    else:
        raise InvalidArgumentError(
            f"{served_name!r} is not a core.serve model; known: {', '.join(CORE_SERVE_MODELS)}"
        )
    size = DTYPE_BYTES[dtype]
    weights = sum(_numel(shape) for shape in expected_shapes(config).values()) * size
    return engine_step_model(config.shape, weight_bytes=float(weights), dtype_bytes=size, roofs=roofs)


def _numel(shape: tuple[int, ...]) -> int:
    out = 1
    for n in shape:
        out *= n
    return out


def limits_from_metrics(
    metrics: VllmMetrics, *, max_num_seqs: int, max_num_batched_tokens: int, max_model_len: int
) -> ServerLimits:
    """The server's limits: its KV pool from vllm:cache_config_info, the rest as given. Raises
    InvalidArgumentError when the server does not publish its pool or a limit is not a positive integer."""
    if not metrics.num_gpu_blocks or not metrics.block_size:
        raise InvalidArgumentError(
            "the server publishes no vllm:cache_config_info with num_gpu_blocks and block_size: its KV pool "
            "is unknown"
        )
    for name, value in (
        ("max_num_seqs", max_num_seqs),
        ("max_num_batched_tokens", max_num_batched_tokens),
        ("max_model_len", max_model_len),
    ):
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise InvalidArgumentError(f"{name} must be a positive integer, got {value!r}")
    return ServerLimits(
        kv_capacity_tokens=metrics.num_gpu_blocks * metrics.block_size,
        block_size=metrics.block_size,
        max_num_seqs=max_num_seqs,
        max_num_batched_tokens=max_num_batched_tokens,
        max_seq_len=max_model_len,
    )
