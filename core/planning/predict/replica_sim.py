"""What the simulator runs for a `Deployment`: one replica sized by the planner (its KV slots, step cost, host
tier and request-side seconds), the `SimulatorConfig` and memory policy of that replica, and the routed fleet of
its ranks. The one home of this arithmetic: `predict`'s steady state (`core.planning.predict.prediction`), the
staged-ramp replay (`core.planning.predict.ramp`, `python -m core.planning ramp`) and bench/kv_cache_wins.py all
build their simulation here.

    setup = fleet_setup(deployment, max_len, seed)
    session = SimulationSession(setup.policy, setup.config, fleet=setup.fleet)
"""

from collections.abc import Mapping
from typing import NamedTuple

from core.errors import InvalidArgumentError
from core.planning.cost.speculative import SpeculativeStepTime
from core.planning.cost.step_time import StepTimeModel
from core.planning.memory.plan import ReplicaMemory, replica_memory
from core.planning.predict.deployment import Deployment
from core.serving.fleet import Fleet
from core.serving.host_offload import HostOffload
from core.serving.memory_policies import Policy, paged
from core.serving.sim_config import SimulatorConfig

__all__ = [
    "FleetSetup",
    "SizedReplica",
    "caches_prefixes",
    "fleet_setup",
    "replica_config",
    "replica_policy",
    "routed_fleet",
    "sized_replica",
]


class SizedReplica(NamedTuple):
    """One replica of a deployment as the planner sizes it: its memory (`replica_memory`), what a step costs
    (with speculation, the speculative step), the KV slots left for the target's sequences, its host tier
    (None: none) and the engine profile's request-side seconds (None: none)."""

    memory: ReplicaMemory
    step: StepTimeModel | SpeculativeStepTime
    kv_tokens: int
    offload: HostOffload | None
    request_overhead_s: float | None


class FleetSetup(NamedTuple):
    """What `simulate_fleet` / `SimulationSession(policy, config, fleet=fleet)` take for a deployment, and the
    sized replica they came from."""

    policy: Policy
    config: SimulatorConfig
    fleet: Fleet
    replica: SizedReplica


def sized_replica(deployment: Deployment, max_len: int, step_time: Mapping | None = None) -> SizedReplica:
    """One replica of `deployment` serving requests of up to `max_len` tokens: resolved once
    (`Deployment.resolve`), its memory by the exact planner's arithmetic, its step cost from the same resolved
    deployment (`step_time`: overrides of the engine profile). Raises InvalidArgumentError when it does not fit
    (the planner's verdict) or speculation leaves no KV memory."""
    resolved = deployment.resolve(max_len)
    memory = replica_memory(resolved)
    if not memory.fits:
        raise InvalidArgumentError(f"the deployment does not fit: {memory.verdict}")
    step, kv_tokens = deployment.step_cost(deployment.step_model(step_time, resolved), memory.kv_tokens)
    return SizedReplica(
        memory,
        step,
        int(kv_tokens),
        deployment.host_offload(memory),
        deployment.request_overhead_s(step_time),
    )


def replica_config(
    deployment: Deployment,
    step: StepTimeModel | SpeculativeStepTime,
    kv_tokens: int,
    max_len: int,
    offload: HostOffload | None = None,
) -> SimulatorConfig:
    """The simulator's configuration of one replica: `kv_tokens` KV slots, vLLM's batch limits, the longest
    request (`max_len` tokens), what a step costs and the host tier (one snapshot kept: only figures are read)."""
    return SimulatorConfig(
        kv_capacity_tokens=int(kv_tokens),
        max_num_seqs=deployment.max_num_seqs,
        max_num_batched_tokens=deployment.max_num_batched_tokens,
        max_seq_len=max_len,
        step_time=step,
        max_snapshots=1,
        offload=offload,
    )


def caches_prefixes(deployment: Deployment, load) -> bool:
    """Whether a replica serving `load` (a `Load`) runs vLLM's prefix cache: its prompts share tokens (shared
    prefixes, chats), or the deployment has a host KV tier (which runs with the cache on)."""
    return load.uses_prefix_cache or bool(deployment.kv_offload_gib)


def replica_policy(deployment: Deployment, caching: bool) -> Policy:
    """The paged KV cache at the deployment's block size: with block tables and prefix caching when `caching`
    (prompts that share tokens, or a host tier), else counted blocks (the same admissions, cheaper)."""
    return paged(deployment.block_size, enable_prefix_caching=caching, counted=not caching)


def routed_fleet(deployment: Deployment, seed: int = 0) -> Fleet:
    """The deployment's ranks (replicas x DP ranks) behind its router; `seed` drives the `random` policy."""
    return Fleet(deployment.ranks, deployment.routing, seed, deployment.prefix_history)


def fleet_setup(
    deployment: Deployment, max_len: int, seed: int = 0, step_time: Mapping | None = None
) -> FleetSetup:
    """The routed fleet of `deployment`, each replica sized for requests of up to `max_len` tokens and run with
    prefix caching (`sized_replica`, `replica_config`, `replica_policy`, `routed_fleet`)."""
    replica = sized_replica(deployment, max_len, step_time)
    config = replica_config(deployment, replica.step, replica.kv_tokens, max_len, replica.offload)
    return FleetSetup(replica_policy(deployment, True), config, routed_fleet(deployment, seed), replica)
