"""Run under vLLM's interpreter (tests/vllm_reference.py). Reads {"cases": [[ep_size, num_experts], ...],
"layouts": [[tp, dp, enable_expert_parallel], ...]} on stdin and prints {"local_experts": per case, vLLM's local
expert count of every EP rank (`determine_expert_map`), "moe": per layout, the MoE layers' tp_size and ep_size
(`FusedMoEParallelConfig.make`, with the process groups it asks for stubbed as rank 0 of their size)}."""

import json
import sys
from types import SimpleNamespace

from vllm.model_executor.layers.fused_moe import config as moe_config
from vllm.model_executor.layers.fused_moe.expert_map_manager import determine_expert_map

payload = json.loads(sys.stdin.read())
moe_config.get_tensor_model_parallel_rank = lambda: 0  # no distributed run: rank 0 of each group
moe_config.get_dp_group = lambda: SimpleNamespace(rank_in_group=0)
moe_config.get_pcp_group = lambda: SimpleNamespace(rank_in_group=0)
moe = []
for tp, dp, ep in payload["layouts"]:
    parallel = SimpleNamespace(
        enable_expert_parallel=ep, all2all_backend="allgather_reducescatter", enable_eplb=False
    )
    made = moe_config.FusedMoEParallelConfig.make(tp, 1, dp, 1, parallel)
    moe.append([made.tp_size, made.ep_size])
local = [
    [determine_expert_map(ep, rank, experts)[0] for rank in range(ep)] for ep, experts in payload["cases"]
]
print(json.dumps({"local_experts": local, "moe": moe}))
