"""The SLO search's space as input fields (`core.fields`), declared once: `SEARCH_FIELDS` (the GPU types, the most
GPUs, the KV and weight dtypes the command line's `slo` and the SLO planner page's search mode share; the parallel
sizes, max_num_seqs values, stop rule and routing candidates of the command line only; the search's shared
settings) and `SEARCH_URL_FIELDS`, the page's. `core.planning.search.slo_candidates.SloCandidates` checks its
inputs by them.
"""

from dataclasses import replace

from core.fields import InputField, field_named
from core.planning.catalog.hardware import GPUS
from core.planning.memory.kv_accounting import KV_DTYPES, MAX_GPUS, WEIGHT_DTYPES
from core.planning.predict.deployment_fields import MOE_FIELDS, ROUTING_FIELD, SETTING_FIELDS
from core.planning.predict.disagg import DISAGG_FIELDS
from core.serving.router import ROUTING_POLICIES

DEFAULT_SLO_GPUS = ("l40s", "h100-80gb", "h200-141gb")
# The search space's inputs that the command line (`slo`) and the SLO planner page's search mode share, declared
# once (`core.fields`): `SloCandidates` checks them by these, the flags and the page's URL fields and widgets are
# made from them (`SEARCH_URL_FIELDS`; the rest, below, are command-line flags only).
SEARCH_FIELDS = (
    InputField(
        "gpus",
        "--gpus",
        "gpus",
        "multi",
        DEFAULT_SLO_GPUS,
        "GPU types",
        f"presets: {', '.join(GPUS)}",
        choices=tuple(GPUS),
    ),
    InputField(
        "max_gpus",
        "--max-gpus",
        "max_gpus",
        "int",
        8,
        "Most GPUs per deployment",
        "the most GPUs one deployment may use: tp x pp x D x replicas (--disagg: all its workers' GPUs)",
        minimum=1,
        maximum=MAX_GPUS,
        step=1,
    ),
    InputField(
        "kv_dtypes",
        "--kv-dtypes",
        "kv",
        "multi",
        ("auto", "fp8"),
        "KV cache dtypes",
        f"one or more of {', '.join(KV_DTYPES)}",
        choices=KV_DTYPES,
    ),
    InputField(
        "weight_dtypes",
        "--weight-dtypes",
        "weights",
        "multi",
        ("auto",),
        "Weight dtypes",
        f"one or more of {', '.join(WEIGHT_DTYPES)}",
        choices=WEIGHT_DTYPES,
    ),
)

# The rest of the search space: `slo`'s flags only (no URL key: the page searches their defaults), declared here
# too so `SloCandidates` checks them by their flags' fields (one message) and `candidates_from` converts them.
SEARCH_FIELDS += (
    InputField(
        "tensor_parallel",
        "--tp",
        None,
        "ints",
        (1, 2, 4, 8),
        "Tensor-parallel sizes",
        "tensor-parallel sizes tried",
        minimum=1,
        maximum=64,
    ),
    InputField(
        "pipeline_parallel",
        "--pp",
        None,
        "ints",
        (1, 2),
        "Pipeline-parallel sizes",
        "pipeline-parallel sizes tried",
        minimum=1,
        maximum=64,
    ),
    InputField(
        "max_num_seqs",
        "--max-num-seqs",
        None,
        "ints",
        (64, 128, 256, 512, 1024),
        "max_num_seqs values",
        "vLLM's --max-num-seqs values tried",
        minimum=1,
        maximum=65_536,
    ),
    InputField(
        "data_parallel",
        "--data-parallel-size",
        None,
        "ints",
        (1,),
        "DP ranks per replica",
        "DP ranks per replica tried (vLLM's --data-parallel-size; a MoE model: data-parallel attention)",
        minimum=1,
        maximum=1024,
        metavar="D",
    ),
    InputField(
        "max_meeting",
        "--max-meeting",
        None,
        "int",
        3,
        "Deployments meeting the SLO before the search stops",
        "the search stops once this many deployments met the SLO (every cheaper one has been evaluated)",
        minimum=1,
    ),
    InputField(
        "routing_candidates",
        "--routing-candidates",
        None,
        "str",
        None,
        "Routing policies ranked",
        "comma-separated routing policies to rank with the deployments (each (deployment, policy) a "
        "candidate), e.g. round-robin,least-loaded,prefix-aware",
        optional=True,
    ),
)
# The search's shared settings, a deployment's fields with the search's meaning: one max_num_batched_tokens,
# expert parallelism and the router for every candidate, disaggregated deployments too (the page's search mode's
# `disagg_too`), --routing without a default (none: each replica serves 1 / N of the load).
SEARCH_FIELDS += (
    field_named(SETTING_FIELDS, "max_num_batched_tokens"),
    replace(
        MOE_FIELDS[1],
        help="every candidate with vLLM's --enable-expert-parallel (a MoE model: whole experts per GPU)",
    ),
    replace(
        DISAGG_FIELDS[0],
        url_key="disagg_too",
        label="Disaggregated prefill / decode deployments too (slo --disagg)",
        help="also search disaggregated deployments: x prefill workers + y decode workers of one GPU type "
        "(tp from --tp, pp 1, max_num_seqs the largest --max-num-seqs), ranked with the aggregated ones",
    ),
    replace(
        ROUTING_FIELD,
        default=None,
        optional=True,
        help=f"the router in front of every deployment of several replicas: one of {', '.join(ROUTING_POLICIES)} "
        "(default: none, each replica serves 1 / N of the load; round-robin is what a plain load balancer does)",
    ),
)
# the search space's fields shared with the SLO planner page's search mode (its URL fields and widgets)
SEARCH_URL_FIELDS = tuple(f for f in SEARCH_FIELDS if f.url_key is not None)
