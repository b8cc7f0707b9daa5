"""The first round of a closed loop at fixed lengths (`core.serving.workload`): each client's first output drawn
uniformly from 2 to OSL tokens, so the clients run at independent random phases of their cycle afterwards
(`out_of_phase_outputs`), or evenly spaced over it (`evenly_spaced_outputs`, the best case: no two clients'
prefills meet), docs/slo.md 2c, the sixth stage."""

import numpy as np
import pytest

from core.serving.workload import evenly_spaced_outputs, out_of_phase_outputs


def test_evenly_spaced_by_hand():
    # client i's first output is (i + 1) / C x OSL tokens, at least 2, at most OSL
    assert evenly_spaced_outputs(4, 100) == [25, 50, 75, 100]
    assert evenly_spaced_outputs(3, 10) == [3, 7, 10]
    assert evenly_spaced_outputs(5, 4) == [2, 2, 2, 3, 4]


def test_random_phases_are_seeded_and_within_the_output():
    first = out_of_phase_outputs(64, 1024, seed=3)
    assert first == out_of_phase_outputs(64, 1024, seed=3)
    assert first != out_of_phase_outputs(64, 1024, seed=4)
    assert len(first) == 64 and min(first) >= 2 and max(first) <= 1024
    assert all(isinstance(n, int) for n in first)
    assert out_of_phase_outputs(3, 1) == [1, 1, 1]  # one token: no TPOT to stagger
    assert out_of_phase_outputs(3, 2) == [2, 2, 2]


def test_random_phases_are_uniform_over_the_cycle():
    """20,000 clients at OSL 100: every length 2..100 about equally often (the chi-square statistic of the 99
    counts below its 0.999 quantile at 98 degrees of freedom, 147.0), mean 51 (the uniform's (2 + 100) / 2)."""
    first = np.array(out_of_phase_outputs(20_000, 100, seed=0))
    counts = np.bincount(first, minlength=101)[2:]
    expected = len(first) / 99
    chi2 = float(((counts - expected) ** 2 / expected).sum())
    assert chi2 < 147.0
    assert first.mean() == pytest.approx(51.0, abs=0.5)


def test_random_phases_let_clients_meet_where_even_spacing_never_does():
    """64 clients over a 1,024-token cycle: evenly spaced, neighbours are 16 tokens apart; at independent random
    phases some two land within 4 tokens of each other (the expected closest pair is ~1,024 / 64^2 = 0.25 apart),
    i.e. their prefills can queue one behind the other."""
    even = np.diff(sorted(evenly_spaced_outputs(64, 1024)))
    assert even.min() == 16
    drawn = np.diff(sorted(out_of_phase_outputs(64, 1024, seed=0)))
    assert drawn.min() < 4
