"""The shared timing machinery: quartiles against hand-worked values, the process settings, and the load monitor
seeing CPU that another process takes."""

import statistics
import subprocess
import sys
import time

import pytest
import torch

from core.kernels.timer import (
    LoadMonitor,
    MachineLoad,
    apply_timing_settings,
    relative_spread,
    spread,
    time_interleaved,
)


def test_spread_gives_hand_worked_quartiles():
    # inclusive quartiles of 1..9: positions 1 + 8/4 = 3 and 1 + 3 * 8/4 = 7
    stats = spread([9.0, 1.0, 5.0, 3.0, 7.0, 2.0, 8.0, 4.0, 6.0])
    assert stats == {"median": 5.0, "p25": 3.0, "p75": 7.0, "min": 1.0, "max": 9.0}
    assert relative_spread(stats) == pytest.approx(0.8)
    # between samples: 1, 2, 4, 8 -> p25 at 1 + 0.75 = 1.75, p75 at 4 + 0.25 * 4 = 5
    assert spread([1.0, 2.0, 4.0, 8.0])["p25"] == pytest.approx(1.75)
    assert spread([1.0, 2.0, 4.0, 8.0])["p75"] == pytest.approx(5.0)
    assert spread([2.5]) == {"median": 2.5, "p25": 2.5, "p75": 2.5, "min": 2.5, "max": 2.5}


def test_settings_report_the_process_state():
    settings = apply_timing_settings()
    assert settings.threads == torch.get_num_threads()
    assert settings.malloc_tuning  # glibc here
    assert apply_timing_settings(malloc_tuning=False).malloc_tuning  # once tuned, it stays tuned


def test_interleaved_rounds_drop_the_warmup_and_pair_the_candidates():
    calls = []
    run = time_interleaved(
        {"a": lambda: calls.append("a"), "b": lambda: calls.append("b")}, "cpu", repeats=3, warmup=2
    )
    assert calls == ["a", "b"] * 5  # round-robin, warm-up included
    assert [len(run.samples[name]) for name in "ab"] == [3, 3]
    assert run.median("a") == statistics.median(run.samples["a"])
    assert run.load.wall_s > 0


def test_load_monitor_sees_another_process_burn_a_core():
    burn = "import time\nend = time.time() + 1.5\nwhile time.time() < end: pass\n"
    with LoadMonitor() as monitor:
        child = subprocess.Popen([sys.executable, "-c", burn])
        child.wait(timeout=30)
    load = monitor.load
    assert load.other_cores is not None and load.cpus >= 1
    # the child spun for 1.5 s of a run at most ~2 s long (start-up included): over half a core went elsewhere
    assert load.other_cores > 0.5 and load.busy
    assert load.cpu_s < 0.5  # and we ourselves only waited


def test_load_monitor_counts_our_own_cpu_as_ours():
    with LoadMonitor() as monitor:
        end = time.process_time() + 0.4
        while time.process_time() < end:
            pass
    assert monitor.load.cpu_s >= 0.4


def test_busy_falls_back_to_the_load_average():
    assert MachineLoad(None, cpus=2, load_avg=3.0, wall_s=1, cpu_s=1).busy
    assert not MachineLoad(None, cpus=2, load_avg=1.0, wall_s=1, cpu_s=1).busy
    assert not MachineLoad(0.1, cpus=2, load_avg=9.0, wall_s=1, cpu_s=1).busy  # measured beats the average
