"""llm-d's "KV-cache wins" benchmark as a `predict` question: the deployment, the load and the published figures
it is checked against (docs/levers.md, "A fleet, routed").

The benchmark (llm-d blog "KV-Cache Wins You Can See", 2025): Qwen3-32B on 8 pods of TP 2 H100, 307,328 KV tokens a
pod; 150 prefix groups x 5 users, 6,000-token shared prefixes, 1,200-token questions, 1,000-token outputs, Poisson
arrivals ramped from 3 to 60 QPS. Published output tokens/s and TTFT p90: precise prefix-aware routing 8,730 /
0.542 s; approximate prefix routing 6,944 / 31.1 s; load-only 4,429 / 94.9 s; random 4,429 / 92.6 s. Its
approximate run ("estimated-scheduling" in llm-d-kv-cache-manager's benchmarking/73-capacity report) is llm-d's
prefix-cache-scorer at its defaults (hashBlockSize 64, maxPrefixBlocksToMatch 256, lruCapacityPerServer 31,250)
with the kv-cache and queue scorers, weights 1 : 1 : 1: `approximate-prefix` with `PrefixHistory()`.

The published figures are one run of a staged ramp (3 -> 60 QPS, each stage drained before the next, as
inference-perf runs them), aggregated: `core.serving.staged_run` and bench/kv_cache_wins.py replay it, and
`PUBLISHED_STAGES` holds the report's per-stage rows. `OPERATING_RATE` is a steady-state question asked of the
same fleet: 8.73 requests/s, the rate whose 1,000-token outputs make precise routing's 8,730 tok/s; at it the
prediction for round-robin (llm-d's random: blind to the prefixes) falls behind with a growing queue, and
prefix-aware serves all of it with a short TTFT.

`scale` shrinks the case for a fast check, keeping every ratio that decides what hits: token lengths, the KV
cache a pod holds and the prefill chunk (max_num_batched_tokens) are divided by `scale`; so are the approximate
router's blocks matched and blocks remembered a pod (`PrefixHistory(16, 25, 3125)`: 400 matched tokens, within
the 600-token prefix as 4,096 are within 6,000; 50,000 remembered tokens a pod, 1.6x its KV cache as 500,000
are of 307,328); the pods, the groups, the prefix / prompt / output proportions and the cache footprint ratios (150 prefixes x 6,000 tokens = 2.8 pods'
KV cache under round-robin, 150 / 8 x 6,000 = 0.35 of one under prefix-aware) stay.
"""

from core.planning.catalog.models import ModelSpec
from core.planning.predict.deployment import Deployment
from core.planning.predict.load import Load
from core.serving.router import PrefixHistory

SOURCE = "llm-d blog, KV-Cache Wins You Can See (llm-d.ai/blog/kvcache-wins-you-can-see, 2025)"
# Qwen/Qwen3-32B config.json (the fields the planner reads); 32.8 B parameters (its model card)
QWEN3_32B_CONFIG = {
    "architectures": ["Qwen3ForCausalLM"],
    "model_type": "qwen3",
    "hidden_size": 5120,
    "intermediate_size": 25600,
    "num_hidden_layers": 64,
    "num_attention_heads": 64,
    "num_key_value_heads": 8,
    "head_dim": 128,
    "vocab_size": 151936,
    "max_position_embeddings": 40960,
    "tie_word_embeddings": False,
    "torch_dtype": "bfloat16",
}
QWEN3_32B_PARAMS = 32.8e9
PODS, TP, GROUPS = 8, 2, 150
PREFIX_LEN, QUESTION_LEN, OUTPUT_LEN = 6000, 1200, 1000
KV_TOKENS_PER_POD = 307_328
# routing -> (output tokens/s, TTFT p90 seconds) as published
PUBLISHED = {
    "precise prefix-aware": (8730.0, 0.542),
    "approximate prefix": (6944.0, 31.1),
    "load-only": (4429.0, 94.9),
    "random": (4429.0, 92.6),
}
# routing -> the 16 ladder stages' (output tokens/s, TTFT p90 seconds) as llm-d-kv-cache-manager's
# benchmarking/73-capacity report prints them ("Per-QPS Results", 3 -> 60 QPS; the warm-up is not reported);
# the plain means of the output rates are the summary row (8,730.0 / 6,944.4 / 4,266.4 / 4,428.7)
PUBLISHED_STAGES = {
    "precise prefix-aware": (
        (1219.1, 0.498),
        (3902.1, 0.6),
        (5761.1, 0.4),
        (9184.5, 0.6),
        (9382.0, 0.5),
        (9242.2, 0.583),
        (9221.8, 0.509),
        (9780.6, 0.5),
        (10270.8, 0.488),
        (10054.8, 0.5),
        (10128.7, 0.589),
        (10296.5, 0.6),
        (10284.6, 0.507),
        (10140.9, 0.6),
        (10313.9, 0.6),
        (10496.9, 0.5),
    ),
    "approximate prefix": (
        (1310.9, 0.497),
        (3842.4, 0.499),
        (5152.9, 0.4),
        (8082.6, 0.6),
        (8415.7, 0.7),
        (8445.1, 0.609),
        (8435.9, 0.708),
        (7443.5, 2.459),
        (8045.9, 43.018),
        (7969.6, 43.515),
        (7695.2, 44.93),
        (7455.9, 46.335),
        (7452.3, 47.284),
        (7100.7, 50.108),
        (7013.8, 49.93),
        (7247.9, 50.226),
    ),
    "load-only": (
        (1274.8, 1.609),
        (3607.0, 4.124),
        (3348.4, 7.002),
        (4902.5, 77.707),
        (4785.5, 72.972),
        (4872.8, 85.979),
        (4888.7, 83.806),
        (4660.7, 88.086),
        (4946.4, 100.911),
        (4973.3, 101.524),
        (4723.6, 105.884),
        (4004.8, 105.015),
        (3991.0, 108.572),
        (4671.9, 110.681),
        (3866.5, 113.278),
        (4745.1, 110.184),
    ),
    "random": (
        (1314.0, 0.82),
        (3568.5, 1.398),
        (3791.1, 2.299),
        (4933.1, 70.273),
        (4765.4, 78.42),
        (4781.3, 82.943),
        (4636.3, 86.182),
        (4332.6, 91.519),
        (4773.8, 101.272),
        (4844.6, 101.142),
        (4969.5, 101.265),
        (4783.2, 103.514),
        (4845.1, 105.004),
        (4921.7, 104.321),
        (4764.2, 106.816),
        (4835.2, 105.988),
    ),
}
OPERATING_RATE = PUBLISHED["precise prefix-aware"][0] / OUTPUT_LEN  # requests/s precise routing kept up with
# gpu_memory_utilization that leaves a pod its published KV cache: 307,360 tokens (the default 0.9: 321,520);
# scale 10: 30,736 tokens, a tenth (both found with the planner, `Deployment.memory_plan`)
_UTILIZATION = {1: 0.8783, 10: 0.4444}


def qwen3_32b() -> ModelSpec:
    return ModelSpec.from_hf_config(QWEN3_32B_CONFIG, name="Qwen3-32B", num_params=QWEN3_32B_PARAMS)


def kv_cache_wins_deployment(routing: str, scale: int = 1) -> Deployment:
    """The 8 pods of TP 2 H100 behind `routing`; scale 10: a pod with a tenth of the KV cache and prefill chunks
    of 256 tokens (max_num_seqs 128, never reached: ~40 requests fill a pod's cache), and an approximate router
    remembering a tenth (module docstring)."""
    if scale == 1:
        return Deployment(
            qwen3_32b(),
            "h100-80gb",
            tp=TP,
            replicas=PODS,
            routing=routing,
            gpu_memory_utilization=_UTILIZATION[1],
        )
    return Deployment(
        qwen3_32b(),
        "h100-80gb",
        tp=TP,
        replicas=PODS,
        max_num_seqs=128,
        max_num_batched_tokens=2048 // 8,
        routing=routing,
        prefix_history=PrefixHistory(16, 256 // scale, 31_250 // scale),
        gpu_memory_utilization=_UTILIZATION[scale],
    )


def kv_cache_wins_load(rate: float, scale: int = 1, groups: int = GROUPS) -> Load:
    """The benchmark's requests at `rate` requests/s (token lengths divided by `scale`); groups=1: the same load
    with one shared prefix (no routing gap expected)."""
    prefix, question, output = PREFIX_LEN // scale, QUESTION_LEN // scale, OUTPUT_LEN // scale
    return Load(
        rate=rate,
        prompt_len=prefix + question,
        output_len=output,
        shared_prefix_len=prefix,
        num_prefixes=groups,
        seed=0,
    )
