"""The planner against a running vLLM's CPU backend: the blocks `VLLM_CPU_KVCACHE_SPACE` holds for the served
model, planned from the config.json the server names in /v1/models, equal the blocks vLLM computed.

The run's vLLM keeps 64 blocks (`--num-gpu-blocks-override 64`, so other tests overflow its cache cheaply), so
its /metrics report the override; the number vLLM computed from its KV space is in its start log ("Overriding
num_gpu_blocks=N with num_gpu_blocks_override=64") and its KV space in cache_config_info's kv_cache_memory_bytes.
"""

import re
from pathlib import Path

from core.limits import Limits
from core.live.addresses import check_metrics_url
from core.live.metrics import parse_vllm_metrics
from core.live.served_model import fetch_served_models, local_hf_config
from core.planning.catalog.models import ModelSpec
from core.planning.commands.dispatch import main as planning_main
from core.planning.memory.cpu_kv import CpuKVInputs, GiB, plan_cpu_kv

OVERRIDE = re.compile(r"Overriding num_gpu_blocks=(\d+) with num_gpu_blocks_override=(\d+)")


def test_planned_cpu_blocks_equal_the_blocks_vllm_computed(real_vllm, capsys):
    url = check_metrics_url(real_vllm.url + "/metrics", Limits(live_hosts="127.0.0.1"))
    (served,) = fetch_served_models(url)
    assert served.name == real_vllm.model and served.max_model_len == real_vllm.max_model_len
    assert Path(served.root) == Path(real_vllm.model_dir)
    config = local_hf_config(served.root, url.host)
    metrics = parse_vllm_metrics(real_vllm.get("/metrics").decode())
    space = int(metrics.cache_setting("kv_cache_memory_bytes"))
    assert space == real_vllm.kv_cache_space_gib * GiB
    assert (
        metrics.num_gpu_blocks
        == int(metrics.cache_setting("num_gpu_blocks_override"))
        == real_vllm.num_gpu_blocks_override
    )

    inputs = CpuKVInputs(
        ModelSpec.from_hf_config(config, name=served.name),
        space,
        block_size=metrics.block_size,
        max_model_len=served.max_model_len,
        dtype=real_vllm.dtype,  # the server's --dtype: its /metrics do not say it
    )
    plan = plan_cpu_kv(inputs)
    computed, override = map(int, OVERRIDE.search(Path(real_vllm.log_path).read_text()).groups())
    assert override == real_vllm.num_gpu_blocks_override
    assert plan.num_blocks == computed  # 1,456 for bf16 SmolLM2 at block 32 in 1 GiB, 728 in float32
    assert plan.kv_tokens == computed * real_vllm.block_size

    # the command line says the same, from the folder the server names
    code = planning_main(
        [
            "--config",
            str(Path(served.root) / "config.json"),
            "--cpu-kv-cache-space-gib",
            str(real_vllm.kv_cache_space_gib),
            "--block-size",
            str(real_vllm.block_size),
            "--max-model-len",
            str(real_vllm.max_model_len),
            "--dtype",
            real_vllm.dtype,
        ]
    )
    out = capsys.readouterr().out
    assert code == 0
    assert re.search(rf"num_blocks\s+{computed:,}\n", out)
    assert f"VLLM_CPU_KVCACHE_SPACE={real_vllm.kv_cache_space_gib} vllm serve {served.root}" in out
    assert f"--dtype {real_vllm.dtype}" in out
