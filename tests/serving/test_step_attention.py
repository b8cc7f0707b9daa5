"""Measured per-step attention: the replayed batches are the simulation's real ones, and both kernels see the
same K/V (paged through the block tables, contiguous through the padded copy), so their outputs agree."""

import pytest
import torch

from core.errors import InvalidArgumentError
from core.kernels.attention import contiguous_attention, paged_attention
from core.planning.cost.step_time import opt_13b_a100
from core.serving.memory_policies import orca_oracle, paged
from core.serving.simulator import SimulatorConfig, simulate
from core.serving.step_attention import measure_step_attention
from core.serving.workload import sharegpt


def test_replay_feeds_both_kernels_the_same_kv():
    result = simulate(
        sharegpt(60, rate=4.0, seed=1),
        paged(16),
        SimulatorConfig(step_time=opt_13b_a100(), kv_capacity_tokens=4096),
    )
    outputs = {}

    def paged_fn(query, key_cache, value_cache, tables, lens):
        outputs["paged"] = paged_attention(query, key_cache, value_cache, tables, lens, backend="torch")
        outputs["lens"] = lens.clone()
        return outputs["paged"]

    def contiguous_fn(query, key, value, lens):
        outputs["contiguous"] = contiguous_attention(query, key, value, lens)
        # an independent reference: SDPA over each sequence's own unpadded K/V
        ref = []
        for s, n in enumerate(lens.tolist()):
            q = query[s][:, None, :]  # [heads, 1, dim]
            k = key[s, :n].transpose(0, 1)  # [heads, n, dim]
            v = value[s, :n].transpose(0, 1)
            ref.append(torch.nn.functional.scaled_dot_product_attention(q, k, v)[:, 0])
        outputs["reference"] = torch.stack(ref)
        return outputs["contiguous"]

    table = measure_step_attention(
        result,
        num_kv_heads=2,
        head_dim=16,
        time_budget_s=0.0,
        repeats=1,
        paged_fn=paged_fn,
        contiguous_fn=contiguous_fn,
    )
    assert len(table) == 1  # a zero budget still measures one step
    row = table.iloc[0]
    snap = next(s for s in result.snapshots if s.step == row["step"])
    assert row["num_seqs"] == len(snap.context_lens) and row["max_context_tokens"] == snap.context_lens.max()
    assert row["padded_tokens"] == row["num_seqs"] * row["max_context_tokens"]
    assert outputs["lens"].tolist() == snap.context_lens.tolist()
    torch.testing.assert_close(outputs["paged"], outputs["reference"], rtol=1e-4, atol=1e-5)
    torch.testing.assert_close(outputs["contiguous"], outputs["reference"], rtol=1e-4, atol=1e-5)


def test_budget_spreads_measurements_and_real_kernels_run():
    result = simulate(
        sharegpt(40, rate=4.0, seed=2),
        paged(16),
        SimulatorConfig(step_time=opt_13b_a100(), kv_capacity_tokens=4096),
    )
    table = measure_step_attention(result, num_kv_heads=2, head_dim=16, time_budget_s=0.5, repeats=1)
    assert len(table) >= 2 and (table["paged_ms"] > 0).all() and (table["contiguous_ms"] > 0).all()
    assert table["step"].is_monotonic_increasing


def test_contiguous_results_cannot_be_measured():
    result = simulate(sharegpt(10, seed=0), orca_oracle(), SimulatorConfig(step_time=opt_13b_a100()))
    with pytest.raises(InvalidArgumentError, match="paged"):
        measure_step_attention(result)
