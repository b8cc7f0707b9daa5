"""How the lab times anything: process settings applied the same way everywhere, warm-up, interleaved repeats,
the spread of the samples, and whether other processes took the CPU while we measured.

bench/attention.py and the Kernels page's worker both time through `time_interleaved` after
`apply_timing_settings`, so a number on the page and one printed by the bench differ only by noise.
"""

import contextlib
import ctypes
import os
import statistics
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass

import torch

M_TRIM_THRESHOLD, M_MMAP_THRESHOLD = -1, -3  # glibc mallopt parameters
MMAP_THRESHOLD_BYTES = 256 * 1024**2
TRIM_THRESHOLD_BYTES = 1024**3
BUSY_OTHER_CORES = 0.25  # other processes used more than a quarter of a core on average: the machine was busy
NOISY_SPREAD = 0.25  # interquartile range over median above this: the samples disagree too much to trust
_MALLOC_TUNED: bool | None = None  # None: not tried in this process; else whether mallopt accepted it


def tune_malloc() -> bool:
    """Keep freed memory in the heap (glibc): no mmap/munmap and page faults for every per-call buffer.

    ATen's CPU attention kernels allocate their outputs and scratch (a few hundred KiB to MiB) on every call; with
    glibc's defaults these come from fresh mmaps, and the page faults cost the chunked paged kernels (tens of
    calls per step) far more than one SDPA call. Serving stacks use jemalloc/tcmalloc for the same reason. Applies
    to paged and contiguous alike, and to the whole process (the setting is never undone). Returns False where it
    cannot be set (not glibc). Tried once per process; later calls return the first answer.
    """
    global _MALLOC_TUNED
    if _MALLOC_TUNED is None:
        try:
            libc = ctypes.CDLL("libc.so.6")
            ok = libc.mallopt(M_MMAP_THRESHOLD, MMAP_THRESHOLD_BYTES) == 1
            _MALLOC_TUNED = libc.mallopt(M_TRIM_THRESHOLD, TRIM_THRESHOLD_BYTES) == 1 and ok
        except (OSError, AttributeError):
            _MALLOC_TUNED = False
    return _MALLOC_TUNED


@dataclass(frozen=True)
class TimingSettings:
    """The process settings a timing ran under. malloc_tuning: `tune_malloc` is in effect; threads: torch's
    intra-op threads; niceness: the process's nice value (the app's workers run at +10, below page rendering)."""

    malloc_tuning: bool
    threads: int
    niceness: int

    def as_dict(self) -> dict:
        return asdict(self)


def apply_timing_settings(malloc_tuning: bool = True) -> TimingSettings:
    """Put this process in the state every lab timing runs in and say what that state is.

    malloc_tuning=True applies `tune_malloc` (idempotent). False leaves the allocator alone; the returned settings
    still report True when an earlier call in this process tuned it, because that cannot be undone.
    """
    tuned = tune_malloc() if malloc_tuning else bool(_MALLOC_TUNED)
    niceness = 0
    with contextlib.suppress(OSError, AttributeError):
        niceness = os.nice(0)
    return TimingSettings(malloc_tuning=tuned, threads=torch.get_num_threads(), niceness=niceness)


def spread(values: list[float]) -> dict[str, float]:
    """median, p25, p75 (quartiles, inclusive method), min and max of `values` (at least one)."""
    if len(values) == 1:
        q1 = q3 = values[0]
    else:
        q1, _, q3 = statistics.quantiles(values, n=4, method="inclusive")
    return {
        "median": statistics.median(values),
        "p25": q1,
        "p75": q3,
        "min": min(values),
        "max": max(values),
    }


def relative_spread(stats: dict[str, float]) -> float:
    """(p75 - p25) / median of a `spread` result: 0 for identical samples."""
    return (stats["p75"] - stats["p25"]) / stats["median"] if stats["median"] > 0 else 0.0


def _busy_cpu_seconds() -> tuple[float, int] | None:
    """(seconds of CPU all processes have used since boot, CPUs) from /proc/stat, or None where unreadable."""
    try:
        with open("/proc/stat") as stat:
            lines = stat.read().splitlines()
    except OSError:
        return None
    fields = [int(v) for v in lines[0].split()[1:]]
    idle = fields[3] + (fields[4] if len(fields) > 4 else 0)  # idle + iowait
    cpus = sum(1 for line in lines if line.startswith("cpu") and line[3:4].isdigit())
    busy = sum(fields[:8]) - idle  # user nice system idle iowait irq softirq steal
    return busy / os.sysconf("SC_CLK_TCK"), cpus


@dataclass(frozen=True)
class MachineLoad:
    """What else ran while we measured. other_cores: CPU seconds that processes other than this one used per
    second of the run (0 = we had the machine; 1 = a whole core went elsewhere), None where /proc/stat is
    unreadable. cpus: the CPUs /proc/stat counts (or os.cpu_count()). load_avg: the 1-minute load average at the
    end. wall_s, cpu_s: wall time of the run and CPU time this process used in it."""

    other_cores: float | None
    cpus: int
    load_avg: float
    wall_s: float
    cpu_s: float

    @property
    def busy(self) -> bool:
        """Other processes took more than BUSY_OTHER_CORES of a core, or (without /proc/stat) the load average
        exceeded the CPU count."""
        if self.other_cores is not None:
            return self.other_cores > BUSY_OTHER_CORES
        return self.load_avg > self.cpus


class LoadMonitor:
    """`with LoadMonitor() as monitor: ...` then `monitor.load`: the MachineLoad of the block."""

    def __enter__(self) -> "LoadMonitor":
        self._machine = _busy_cpu_seconds()
        self._cpu = time.process_time()
        self._wall = time.perf_counter()
        return self

    def __exit__(self, *exc) -> None:
        wall = max(time.perf_counter() - self._wall, 1e-9)
        cpu = time.process_time() - self._cpu
        machine = _busy_cpu_seconds()
        other = None
        cpus = os.cpu_count() or 1
        if self._machine is not None and machine is not None:
            cpus = machine[1] or cpus
            other = max(0.0, (machine[0] - self._machine[0] - cpu) / wall)
        try:
            load_avg = os.getloadavg()[0]
        except OSError:
            load_avg = 0.0
        self.load = MachineLoad(other, cpus, load_avg, wall, cpu)


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


@dataclass(frozen=True)
class TimingRun:
    """Wall times in ms of each function, one per timed round (warm-up rounds dropped), and the machine's load
    over the whole run. samples[name][i] and samples[other][i] come from the same round."""

    samples: dict[str, list[float]]
    load: MachineLoad

    def stats(self, name: str) -> dict[str, float]:
        return spread(self.samples[name])

    def median(self, name: str) -> float:
        return statistics.median(self.samples[name])


def time_interleaved(
    fns: dict[str, Callable[[], object]], device, repeats: int = 7, warmup: int = 2
) -> TimingRun:
    """Run the functions round-robin (a, b, c, a, b, c, ...): `warmup` untimed rounds then `repeats` timed ones,
    so background noise and clock changes hit every candidate alike and paired rounds can be compared."""
    device = torch.device(device)
    samples: dict[str, list[float]] = {name: [] for name in fns}
    with LoadMonitor() as monitor:
        for round_index in range(warmup + repeats):
            for name, fn in fns.items():
                _sync(device)
                start = time.perf_counter()
                fn()
                _sync(device)
                if round_index >= warmup:
                    samples[name].append((time.perf_counter() - start) * 1e3)
    return TimingRun(samples, monitor.load)
