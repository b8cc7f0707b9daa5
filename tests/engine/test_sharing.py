"""Sharing measured like the paper's Figure 15, on a hand-checked run and on the Alpaca workload."""

import pandas as pd
import pytest

from core.engine import Engine, SamplingParams
from core.engine.config import TINY_LLAMA
from core.engine.metrics import sharing_saving
from core.engine.sharing import PAPER_SAVING_PCT, measure_sharing


def test_saving_of_two_samples_by_hand():
    """Prompt of 8 tokens, blocks of 4, n = 2, 4 new tokens each.
    step 0: prefill, the 2 prompt blocks shared by both samples: 2 in use, 4 without sharing -> 1/2
    steps 1-2: each sample's own block for tokens 8..: 4 in use, 6 without sharing -> 1/3
    step 3: the samples finish and are freed (no block held: left out). Mean (1/2 + 1/3 + 1/3) / 3."""
    engine = Engine.from_config(TINY_LLAMA, num_blocks=16, block_size=4, device="cpu")
    engine.generate([list(range(8))], SamplingParams(4, n=2, seed=0, ignore_eos=True))
    steps = engine.last_run.steps
    assert steps["blocks_in_use"].tolist() == [2, 4, 4, 0]
    assert steps["blocks_without_sharing"].tolist() == [4, 6, 6, 0]
    assert engine.last_run.sharing_saving() == pytest.approx((1 / 2 + 1 / 3 + 1 / 3) / 3)


def test_saving_ignores_empty_steps():
    frame = pd.DataFrame({"blocks_in_use": [3, 0, 1], "blocks_without_sharing": [4, 0, 1]})
    assert sharing_saving(frame) == pytest.approx(0.125)
    assert sharing_saving(frame.iloc[1:2]) == 0.0


def test_alpaca_sharing_beam_search_saves_more_than_sampling():
    table = measure_sharing(num_requests=4, widths=(2, 4), max_output_len=24)
    ours = {(r.mode, r.width): r.saving_pct for r in table.itertuples()}
    assert list(table["paper_pct"]) == [PAPER_SAVING_PCT[k] for k in ours]
    assert 0 < ours[("parallel sampling", 2)] < ours[("parallel sampling", 4)]
    assert ours[("beam search", 2)] > ours[("parallel sampling", 2)]
    assert ours[("beam search", 4)] > ours[("beam search", 2)]
