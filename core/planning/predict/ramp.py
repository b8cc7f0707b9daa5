"""A deployment's run of one staged ramp as inference-perf runs it: `python -m core.planning ramp`.

A TRANSIENT replay of one benchmark, not a steady-state estimate (`predict` answers that): the fleet starts empty
(cold caches, no queue), each stage's rate is held for its duration, the stages are run as inference-perf runs them
(`core.serving.staged_run.drained_ramp`: each once every request of the stage before has ended; a request not
finished within the client's 300 s `TIMEOUT_S` failed), and the figures are that one run's, aggregated as the
tool aggregates them (`core.serving.staged_workload.ramp_report`: a stage's output tok/s over its first arrival
to its last finish, the run's the mean over the stages after the warm-up, TTFT p90 over every finished request).

The requests are inference-perf's `shared_prefix` data (`SharedPrefixPrompts`): --num-prefixes groups of
--users-per-prefix users (its num_groups, num_prompts_per_group), each prompt --prompt-len tokens = the group's
--shared-prefix-len-token system prompt + the user's own question, --output-len tokens out. The fleet is the
deployment's (`core.planning.predict.replica_sim.fleet_setup`: each replica sized by the planner, its step cost
the engine profile's, prefix caching on), as `predict` and bench/kv_cache_wins.py build it.

    deployment = ramp_deployment_from(values)   # predict's deployment flags + --block-size, --gpu-memory-utilization
    body = replay_ramp(deployment, ramp_from(values))
"""

from collections.abc import Mapping
from dataclasses import replace
from typing import Any, NamedTuple

from core.errors import InvalidArgumentError
from core.fields import InputField, check_values, field_named
from core.planning.predict.deployment import Deployment
from core.planning.predict.deployment_fields import GPU_MEMORY_FIELD, ROUTING_FIELD
from core.planning.predict.inputs import deployment_from
from core.planning.predict.load import LEVER_FIELDS, SHAPE_FIELDS
from core.planning.predict.plan_fields import BLOCK_SIZE_FIELD
from core.planning.predict.prediction import add_request_side
from core.planning.predict.replica_sim import fleet_setup
from core.serving.resume import SimulationSession
from core.serving.staged_run import STAGE_GAP_S, TIMEOUT_S, drained_ramp
from core.serving.staged_workload import SharedPrefixPrompts, Stage, check_stages, ramp_report

__all__ = [
    "KIND",
    "RAMP_FIELDS",
    "Ramp",
    "parse_stages",
    "ramp_deployment_from",
    "ramp_from",
    "replay_ramp",
]

KIND = "transient replay of a staged ramp as inference-perf runs it, not a steady-state estimate"
MAX_PROMPTS = 1_000_000  # groups x users: the distinct prompts the data cycles through

STAGES_FIELD = InputField(
    "stages",
    "--stages",
    None,
    "str",
    None,
    "Stages (requests/s x seconds)",
    "the ramp: comma-separated RATExSECONDS stages, each a Poisson rate in requests/s held for that many "
    "seconds (inference-perf's load stages), e.g. 15x50,3x20,10x20",
    required=True,
    metavar="RATExSECONDS,...",
)
WARMUP_STAGES_FIELD = InputField(
    "warmup_stages",
    "--warmup-stages",
    None,
    "int",
    0,
    "Warm-up stages",
    "the first N stages run but left out of the summary's output tok/s (a warm-up)",
    minimum=0,
    metavar="N",
)
USERS_PER_PREFIX_FIELD = InputField(
    "users_per_prefix",
    "--users-per-prefix",
    None,
    "int",
    1,
    "Users per prefix",
    "users (prompts) per shared prefix, each its own question (inference-perf's num_prompts_per_group)",
    minimum=1,
    maximum=MAX_PROMPTS,
    metavar="U",
)
# the ramp's inputs beside the deployment's: the stages, then inference-perf's shared_prefix data (the lengths,
# --shared-prefix-len and --num-prefixes as `predict` declares them) and the seed
RAMP_FIELDS = (
    STAGES_FIELD,
    WARMUP_STAGES_FIELD,
    field_named(SHAPE_FIELDS, "prompt_len"),
    field_named(SHAPE_FIELDS, "output_len"),
    field_named(LEVER_FIELDS, "shared_prefix_len"),
    field_named(LEVER_FIELDS, "num_prefixes"),
    USERS_PER_PREFIX_FIELD,
    field_named(SHAPE_FIELDS, "seed"),
)
# the deployment's inputs `predict` does not take: a ramp replays a benchmark's server as it was configured
RAMP_DEPLOYMENT_FIELDS = (BLOCK_SIZE_FIELD, GPU_MEMORY_FIELD)


class Ramp(NamedTuple):
    """One staged ramp: its stages, its prompts, the stages left out of the summary (a warm-up) and the seed
    (arrivals, the prompts' order and the `random` router)."""

    stages: tuple[Stage, ...]
    prompts: SharedPrefixPrompts
    warmup_stages: int
    seed: int

    @property
    def max_len(self) -> int:
        """The longest request, prompt + output tokens: each replica's max_model_len."""
        p = self.prompts
        return p.prefix_len + p.question_len + p.output_len


def parse_stages(text: Any) -> tuple[Stage, ...]:
    """ "15x50,3x20" -> (Stage(15.0, 50.0), Stage(3.0, 20.0)). Raises InvalidArgumentError naming --stages for a
    stage that is not RATExSECONDS, or one the ramp refuses (`staged_workload.check_stages`: a rate or duration
    not finite or <= 0, a ramp that sends no request or more than `MAX_RAMP_REQUESTS`)."""
    if not isinstance(text, str) or not text.strip():
        raise InvalidArgumentError(f"--stages needs RATExSECONDS stages, e.g. 15x50,3x20; got {text!r}")
    stages = []
    for k, part in enumerate(text.split(",")):
        try:
            rate, seconds = (float(bit) for bit in part.strip().lower().split("x"))
        except ValueError:
            raise InvalidArgumentError(
                f"--stages: stage {k + 1} {part.strip()!r} is not RATExSECONDS (requests/s x seconds, e.g. "
                f"15x50,3x20)"
            ) from None
        stages.append(Stage(rate, seconds))
    try:
        return tuple(check_stages(stages))
    except InvalidArgumentError as error:
        raise InvalidArgumentError(f"--stages: {error}") from None


def ramp_from(values: Mapping[str, Any]) -> Ramp:
    """The `Ramp` of `values` (keyed by `RAMP_FIELDS`' names; a key left out takes its field's default). Raises
    InvalidArgumentError naming the flag: bad stages (`parse_stages`), a value out of its field's bounds, as many
    warm-up stages as stages or more, a shared prefix not shorter than the prompt, more than `MAX_PROMPTS`
    prompts."""
    v = {field.name: values.get(field.name, field.default) for field in RAMP_FIELDS}
    stages = parse_stages(v["stages"])
    v = check_values(v, RAMP_FIELDS[1:])
    if v["warmup_stages"] >= len(stages):
        raise InvalidArgumentError(
            f"--warmup-stages must be fewer than the {len(stages)} stage(s) of --stages (the summary needs one), "
            f"got {v['warmup_stages']}"
        )
    prefix, prompt = v["shared_prefix_len"], v["prompt_len"]
    if prefix >= prompt:
        raise InvalidArgumentError(
            f"--shared-prefix-len {prefix} must be shorter than --prompt-len {prompt}: a prompt is its group's "
            f"prefix, then the user's own question (at least 1 token)"
        )
    groups, users = v["num_prefixes"], v["users_per_prefix"]
    if groups * users > MAX_PROMPTS:
        raise InvalidArgumentError(
            f"--num-prefixes x --users-per-prefix is {groups * users:,} prompts; at most {MAX_PROMPTS:,}"
        )
    prompts = SharedPrefixPrompts(groups, users, prefix, prompt - prefix, v["output_len"])
    return Ramp(stages, prompts, v["warmup_stages"], v["seed"])


def ramp_deployment_from(values: Mapping[str, Any]) -> Deployment:
    """The `Deployment` of `values`: `predict`'s (`core.planning.predict.inputs.deployment_from`) with the
    benchmark server's --block-size (None: 16) and --gpu-memory-utilization. Raises InvalidArgumentError naming
    the flag (an unknown --routing among them)."""
    v = check_values(
        {field.name: values.get(field.name, field.default) for field in (ROUTING_FIELD, BLOCK_SIZE_FIELD)},
        (ROUTING_FIELD, BLOCK_SIZE_FIELD),
    )
    block = 16 if v["block_size"] is None else v["block_size"]
    utilization = values.get(GPU_MEMORY_FIELD.name, GPU_MEMORY_FIELD.default)
    return replace(deployment_from(values), block_size=block, gpu_memory_utilization=utilization)


def replay_ramp(deployment: Deployment, ramp: Ramp) -> dict:
    """The deployment's run of `ramp` (module docstring), JSON-ready: `kind`, `deployment` (its flags as
    `predict` echoes them), `vllm_command` (one replica's `vllm serve` command, the capacity plan's),
    kv_tokens_per_replica, requests, the stages' gap and the client timeout, the ramp's inputs, then
    `ramp_report`'s figures: output_tokens_per_s, ttft_p90_s, ttft_mean_s, prefix_hit_rate, unfinished, timed_out
    and `stages` (one row each). Raises InvalidArgumentError when a replica does not fit."""
    setup = fleet_setup(deployment, ramp.max_len, ramp.seed)
    session = SimulationSession(setup.policy, setup.config, fleet=setup.fleet)
    result, stage_of = drained_ramp(ramp.stages, ramp.prompts, session, ramp.seed)
    if (
        setup.replica.request_overhead_s
    ):  # the engine profile's front-end time, as `predict` adds it (open loop)
        add_request_side(result, setup.replica.request_overhead_s, closed_loop=False)
    requests = result.requests
    report = ramp_report(
        requests, ramp.stages, first_stage=ramp.warmup_stages, stage_of=stage_of, timeout_s=TIMEOUT_S
    )
    p = ramp.prompts
    return {
        "kind": KIND,
        "deployment": deployment.flags(),
        "vllm_command": deployment.memory_plan(ramp.max_len).vllm_command,
        "kv_tokens_per_replica": setup.replica.kv_tokens,
        "requests": len(requests),
        "stage_gap_s": STAGE_GAP_S,
        "timeout_s": TIMEOUT_S,
        "ramp": {
            "stages": [list(stage) for stage in ramp.stages],
            "warmup_stages": ramp.warmup_stages,
            "prompt_len": p.prefix_len + p.question_len,
            "output_len": p.output_len,
            "shared_prefix_len": p.prefix_len,
            "num_prefixes": p.groups,
            "users_per_prefix": p.per_group,
            "seed": ramp.seed,
        },
    } | report
