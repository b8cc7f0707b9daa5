"""Disaggregated prefill and decode (DistServe, Zhong et al., OSDI 2024; NVIDIA Dynamo; llm-d) as the
steady-state predictor models it: `predict_disagg(DisaggDeployment, Load)`.

    d = DisaggDeployment.of("llama-3.1-8b", "h100-80gb", prefill=(1, 1), decode=(2, 1))
    p = predict_disagg(d, Load(8, 2048, 256)); p.to_dict()["kv_transfer_s"], p.to_dict()["ttft_p99_s"]

A request is prefilled by one of `prefill_workers` workers (each tp GPUs, its own queue), its KV cache moves to
one of `decode_workers` workers, which emits its output tokens. The three parts:
1. the prefill pool: a steady-state prediction (`core.planning.predict.prediction`) of the load with one output token, so
   every step is prefill-only (chunked by max_num_batched_tokens) and TTFT is queue + prefill; prefix caching
   applies there when the load shares prefixes;
2. the transfer: the prompt's K/V of every layer, prompt_len x `kv_accounting.kv_bytes_per_token` bytes
   (tp = pp = 1: the whole model's), sent by the prefill worker's tp GPUs in parallel shards to the decode
   worker's, so over min(prefill_tp, decode_tp) links of one GPU each: NVLink (half its bidirectional figure)
   when every GPU of the deployment fits one 8-GPU node, else the GPU's NIC (`GPUSpec.network_bandwidth`).
   kv_transfer_s = bytes / (links x bandwidth), for a prompt of prompt_len; a prefill worker's link is busy
   rate / prefill_workers x kv_transfer_s of the time (`kv_link_utilization`; 1 or more is not a steady state);
3. the decode pool: a steady-state prediction of the load on the decode workers, whose prompt tokens arrive
   rather than being computed (`ArrivedKVStepTime`: the last prompt token is computed for the first logits, as
   a connector's external hit leaves it; every prompt token is read as context and held in the KV cache).
Latencies: TTFT = prefill TTFT + kv_transfer_s + the decode worker's TTFT (its queue and first step); e2e =
prefill TTFT + kv_transfer_s + the decode worker's e2e; TPOT / ITL are the decode pool's. Percentiles are added
part by part, an upper bound of the sum's percentile when the parts rise together (conservative otherwise).
Left out: the transfer's overlap with the prefill's last chunks (layer-by-layer sending), contention of
several transfers on one link (reported as utilization, not queued), the connector's own latency.
"""

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace

from core.errors import InvalidArgumentError
from core.fields import InputField
from core.planning.cost.step_time import StepTimeModel
from core.planning.memory.kv_accounting import kv_bytes_per_token
from core.planning.memory.plan import replica_memory
from core.planning.predict.deployment import Deployment
from core.planning.predict.load import Load
from core.planning.predict.prediction import Prediction, predict, replica_steady_state
from core.serving.latency import PERCENTILES
from core.serving.steady_state import SteadyState, SteadyStateSettings

GPUS_PER_NODE = 8  # an HGX / DGX board: NVLink within, the NICs between
KV_LINKS = ("nvlink", "network")
# A disaggregated deployment's own inputs, declared once (`core.fields`; the rest are the aggregated deployment's):
# the flags of `predict --disagg` and the SLO page's URL fields and widgets are made from them, and
# `core.planning.predict.inputs.disagg_from` is the one converter (kv_link "auto": None, the rule below).
DISAGG_FIELDS = (
    InputField(
        "disagg",
        "--disagg",
        "disagg",
        "bool",
        False,
        "Disaggregated (--disagg: TP, PP and replicas above unused)",
        "separate prefill and decode workers",
    ),
    InputField(
        "prefill_workers",
        "--prefill-workers",
        "p_workers",
        "int",
        1,
        "Prefill workers",
        "--disagg: prefill instances, each a vLLM server of --prefill-tp GPUs",
        minimum=1,
        maximum=1024,
        step=1,
    ),
    InputField(
        "prefill_tp",
        "--prefill-tp",
        "p_tp",
        "int",
        1,
        "Prefill TP",
        "--disagg: tensor parallel size of each prefill instance",
        minimum=1,
        maximum=64,
        step=1,
    ),
    InputField(
        "decode_workers",
        "--decode-workers",
        "d_workers",
        "int",
        1,
        "Decode workers",
        "--disagg: decode instances, each a vLLM server of --decode-tp GPUs",
        minimum=1,
        maximum=1024,
        step=1,
    ),
    InputField(
        "decode_tp",
        "--decode-tp",
        "d_tp",
        "int",
        1,
        "Decode TP",
        "--disagg: tensor parallel size of each decode instance",
        minimum=1,
        maximum=64,
        step=1,
    ),
    InputField(
        "kv_link",
        "--kv-link",
        "kv_link",
        "choice",
        "auto",
        "KV link (--kv-link; auto: NVLink within 8 GPUs)",
        "--disagg: the link the KV cache crosses from prefill to decode, auto, nvlink or network (auto: NVLink "
        "when the deployment has at most 8 GPUs, one node; else the network)",
        choices=("auto", *KV_LINKS),
    ),
)


@dataclass(frozen=True)
class ArrivedKVStepTime:
    """The step cost of a decode worker whose prompts' K/V arrive over the interconnect: a prefill chunk costs
    nothing but, for the chunk that completes a prompt, its last token (computed to sample the first output
    token) attending to the whole prompt; decodes as `target` prices them."""

    target: StepTimeModel

    @property
    def kv_bytes_per_token(self) -> float:
        return self.target.kv_bytes_per_token

    @property
    def swap_bandwidth(self) -> float:
        return self.target.swap_bandwidth

    def step_time(self, new_tokens, kv_tokens_read, attention_pairs=0.0, swap_bytes=0.0, output_tokens=None):
        return self.target.step_time(new_tokens, kv_tokens_read, attention_pairs, swap_bytes, output_tokens)

    def step_load_seconds(self, load, swap_bytes: float = 0.0) -> float:
        firsts = load.output_tokens - load.decode_tokens  # prompts completed this step: one token each
        prompt_read = load.kv_tokens_read - load.decode_context_tokens + load.prefill_tokens
        decode_pairs = load.decode_context_tokens + load.decode_tokens
        new = load.decode_tokens + firsts
        if new == 0:
            return swap_bytes / self.swap_bandwidth
        return self.target.step_seconds(
            new,
            load.decode_context_tokens + prompt_read,
            decode_pairs + prompt_read,
            swap_bytes,
            output_tokens=new,
        )

    def prefill_seconds(self, prompt_len: int, chunk: int) -> float:
        return self.target.step_seconds(1, prompt_len, prompt_len)

    def decode_step_seconds(self, batch: float, context_len: float) -> float:
        return self.target.decode_step_seconds(batch, context_len)


class PrefillDecodeSplit:
    """How a disaggregated deployment's GPUs split: prefill_workers x prefill_tp prefill, decode_workers x
    decode_tp decode (the fields of the class that mixes it in)."""

    prefill_workers: int
    prefill_tp: int
    decode_workers: int
    decode_tp: int

    @property
    def prefill_gpus(self) -> int:
        return self.prefill_workers * self.prefill_tp

    @property
    def decode_gpus(self) -> int:
        return self.decode_workers * self.decode_tp

    @property
    def num_gpus(self) -> int:
        return self.prefill_gpus + self.decode_gpus


@dataclass(frozen=True)
class DisaggDeployment(PrefillDecodeSplit):
    """Disaggregated serving of one model on one GPU type: the `prefill` pool (a `Deployment`: its replicas are
    the prefill workers, its tp theirs), the `decode` pool (likewise) and the link that carries each prompt's
    K/V from one to the other (kv_link: "nvlink" or "network"; None: NVLink when all the GPUs fit one 8-GPU
    node). `DisaggDeployment.of(model, gpu, prefill=(workers, tp), decode=(workers, tp), kv_link, **settings)`
    builds both pools from one set of `Deployment` settings. Raises InvalidArgumentError for pools that differ
    in anything but tp and replicas (one model, GPU type and vLLM settings serve both), a pool with pp,
    speculation or a host KV tier (not modelled here), an unknown link, or the network when the GPU has no
    known NIC bandwidth."""

    prefill: Deployment
    decode: Deployment
    kv_link: str | None = None

    @classmethod
    def of(
        cls,
        model,
        gpu,
        prefill: tuple[int, int] = (1, 1),
        decode: tuple[int, int] = (1, 1),
        kv_link: str | None = None,
        **settings,
    ) -> "DisaggDeployment":
        """prefill / decode: (workers, tp) of each pool; settings: the `Deployment` fields both pools share
        (max_num_seqs, max_num_batched_tokens, weight_dtype, kv_dtype, engine, block_size,
        gpu_memory_utilization, ...)."""
        pools = []
        for name, pool in (("prefill", prefill), ("decode", decode)):
            if not (isinstance(pool, tuple) and len(pool) == 2):
                raise InvalidArgumentError(f"{name} must be (workers, tp), got {pool!r}")
            workers, tp = pool
            pools.append(Deployment(model, gpu, tp=tp, replicas=workers, **settings))
        return cls(pools[0], pools[1], kv_link)

    def __post_init__(self):
        if not isinstance(self.prefill, Deployment) or not isinstance(self.decode, Deployment):
            raise InvalidArgumentError("a DisaggDeployment's prefill and decode pools must be Deployments")
        for pool in (self.prefill, self.decode):
            if pool.pp != 1 or pool.speculation is not None or pool.kv_offload_gib:
                raise InvalidArgumentError(
                    "a disaggregated pool is tp-only, without speculation or a host KV tier (pp 1, "
                    "speculation None, kv_offload_gib 0)"
                )
        if replace(self.prefill, tp=self.decode.tp, replicas=self.decode.replicas) != self.decode:
            raise InvalidArgumentError(
                "the prefill and decode pools may differ only in tp and replicas (workers): one model, GPU type "
                "and vLLM settings serve both"
            )
        if self.kv_link is not None and self.kv_link not in KV_LINKS:
            raise InvalidArgumentError(
                f"kv_link must be one of {', '.join(KV_LINKS)} or None, got {self.kv_link!r}"
            )
        if self.link == "network" and not self.decode.gpu_spec.network_bandwidth:
            raise InvalidArgumentError(
                f"{self.decode.gpu_spec.name} has no known network bandwidth: a disaggregated deployment of "
                f"{self.num_gpus} GPUs spans nodes; use at most {GPUS_PER_NODE} GPUs (NVLink) or another GPU"
            )

    @property
    def prefill_workers(self) -> int:
        return self.prefill.replicas

    @property
    def prefill_tp(self) -> int:
        return self.prefill.tp

    @property
    def decode_workers(self) -> int:
        return self.decode.replicas

    @property
    def decode_tp(self) -> int:
        return self.decode.tp

    @property
    def link(self) -> str:
        """ "nvlink" or "network": what carries the KV cache from a prefill worker to a decode worker."""
        if self.kv_link is not None:
            return self.kv_link
        return "nvlink" if self.num_gpus <= GPUS_PER_NODE else "network"

    @property
    def link_bandwidth(self) -> float:
        """Bytes/s of one GPU's link, one direction."""
        gpu = self.decode.gpu_spec
        if self.link == "network":
            return float(gpu.network_bandwidth)
        if not gpu.interconnect_bandwidth:
            raise InvalidArgumentError(f"{gpu.name} has no known interconnect bandwidth")
        return gpu.interconnect_bandwidth / 2

    def kv_bytes_per_request(self, prompt_len: int) -> int:
        """Bytes of K/V a prompt of `prompt_len` tokens moves: every layer's, all heads."""
        return prompt_len * kv_bytes_per_token(self.decode.model_spec, self.decode.kv_dtype)

    def kv_transfer_seconds(self, prompt_len: int) -> float:
        """Seconds to move a prompt's K/V over min(prefill_tp, decode_tp) links in parallel."""
        links = min(self.prefill_tp, self.decode_tp)
        return self.kv_bytes_per_request(prompt_len) / (links * self.link_bandwidth)

    def flags(self) -> dict:
        out = self.decode.flags()
        for key in ("tp", "pp", "replicas"):
            out.pop(key)
        return out | {
            "mode": "disagg",
            "prefill_workers": self.prefill_workers,
            "prefill_tp": self.prefill_tp,
            "decode_workers": self.decode_workers,
            "decode_tp": self.decode_tp,
            "prefill_gpus": self.prefill_gpus,
            "decode_gpus": self.decode_gpus,
            "num_gpus": self.num_gpus,
            "kv_link": self.link,
        }


@dataclass(frozen=True, eq=False)
class DisaggPrediction:
    """The steady state of a disaggregated deployment: metrics (percentile keys and means as `Prediction`'s,
    combined as the module docstring says), the two pools' own predictions, the transfer."""

    deployment: DisaggDeployment
    load: Load
    metrics: dict
    stable: bool
    kv_transfer_s: float
    kv_bytes_per_request: int
    kv_link_utilization: float
    prefill: Prediction
    decode: SteadyState

    def to_dict(self) -> dict:
        """JSON-ready: mode "disagg", prefill_gpus, decode_gpus, kv_transfer_s, the combined percentiles,
        throughput_tokens_per_s and tokens_per_s_per_gpu, stable, and each pool's key figures."""
        d = self.deployment
        out = {
            "mode": "disagg",
            "prefill_gpus": d.prefill_gpus,
            "decode_gpus": d.decode_gpus,
            "num_gpus": d.num_gpus,
            "kv_transfer_s": self.kv_transfer_s,
            "kv_bytes_per_request": self.kv_bytes_per_request,
            "kv_link": d.link,
            "kv_link_utilization": self.kv_link_utilization,
            "stable": self.stable,
        }
        out |= self.metrics
        out["prefill"] = {
            "ttft_p50_s": self.prefill.metrics.get("ttft_p50_s"),
            "ttft_p99_s": self.prefill.metrics.get("ttft_p99_s"),
            "stable": self.prefill.stable,
            "prefix_hit_rate": self.prefill.to_dict()["prefix_hit_rate"],
        }
        out["decode"] = {
            "ttft_p99_s": self.decode.metrics.get("ttft_p99_s"),
            "stable": self.decode.stable,
            "mean_running_batch": self.decode.metrics.get("mean_running_batch"),
        }
        out["deployment"] = d.flags()
        return out


def predict_disagg(
    deployment: DisaggDeployment,
    load: Load,
    step_time=None,
    settings: SteadyStateSettings | None = None,
    decided: Callable[[str, SteadyState, Prediction | None], bool] | None = None,
    focus: Mapping[str, tuple[str, ...]] | None = None,
) -> DisaggPrediction:
    """The steady state of `deployment` serving `load` (module docstring). The prefill pool is simulated
    first, then the decode pool. decided(pool, estimate, prefill): True once the caller's question is answered
    for that pool ("prefill", its estimate, None; then "decode", its estimate and the prefill pool's
    Prediction), ending that pool's simulation early; focus: {pool: the keys whose intervals must reach the
    tolerance}. Both None (the default): every pool grown until every percentile is within the tolerance.
    Raises InvalidArgumentError when a pool's worker does not fit in memory."""
    if not isinstance(deployment, DisaggDeployment) or not isinstance(load, Load):
        raise InvalidArgumentError("predict_disagg needs a DisaggDeployment and a Load")
    focus = focus or {}
    first = None if decided is None else (lambda estimate: decided("prefill", estimate, None))
    prefill = predict(
        deployment.prefill, replace(load, output_len=1), step_time, settings, first, focus.get("prefill")
    )
    decode_dep = deployment.decode
    resolved = decode_dep.resolve(load.max_len)
    memory = replica_memory(resolved)
    if not memory.fits:
        raise InvalidArgumentError(f"a decode worker does not fit: {memory.verdict}")
    cost = ArrivedKVStepTime(decode_dep.step_model(step_time, resolved))
    share = load.per_replica(deployment.decode_workers)
    then = None if decided is None else (lambda estimate: decided("decode", estimate, prefill))
    decode = replica_steady_state(
        decode_dep,
        share,
        cost,
        memory.kv_tokens,
        settings,
        then,
        focus.get("decode"),
        offload=decode_dep.host_offload(memory),
    )
    transfer = deployment.kv_transfer_seconds(load.prompt_len)
    rate = load.rate if load.rate is not None else prefill.metrics.get("request_throughput_per_s", 0.0)
    utilization = rate / deployment.prefill_workers * transfer
    metrics = _combine(prefill.metrics, decode.metrics, transfer)
    metrics["throughput_tokens_per_s"] = (
        decode.metrics.get("throughput_tokens_per_s", 0.0) * deployment.decode_workers
    )
    metrics["tokens_per_s_per_gpu"] = metrics["throughput_tokens_per_s"] / deployment.num_gpus
    stable = prefill.stable and decode.stable and utilization < 1.0
    return DisaggPrediction(
        deployment,
        load,
        metrics,
        stable,
        transfer,
        deployment.kv_bytes_per_request(load.prompt_len),
        utilization,
        prefill,
        decode,
    )


def _combine(prefill: dict, decode: dict, transfer: float) -> dict:
    """TTFT and e2e: prefill TTFT + transfer + the decode side's; TPOT and ITL: the decode side's."""
    out = {}
    for q in PERCENTILES:
        first = prefill.get(f"ttft_p{q}_s", math.nan) + transfer
        out[f"ttft_p{q}_s"] = first + decode.get(f"ttft_p{q}_s", math.nan)
        out[f"e2e_p{q}_s"] = first + decode.get(f"e2e_p{q}_s", math.nan)
        for metric in ("tpot", "itl"):
            out[f"{metric}_p{q}_s"] = decode.get(f"{metric}_p{q}_s")
    out["mean_ttft_s"] = prefill.get("mean_ttft_s", math.nan) + transfer + decode.get("mean_ttft_s", math.nan)
    out["mean_tpot_s"] = decode.get("mean_tpot_s")
    return out
