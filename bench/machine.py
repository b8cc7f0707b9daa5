"""The machine facts every bench prints beside its figures (a figure from one machine is no claim about another)."""

import os
import platform


def machine_facts(load_before: tuple[float, float, float], **extra) -> dict:
    """The CPU, its core count, the load average before the run and now (the machine may be shared), and the
    caller's own facts (`extra`: versions, threads, niceness ...) after them."""
    return {
        "cpu": platform.processor() or platform.machine(),
        "cores": os.cpu_count(),
        **extra,
        "load_average_before": load_before,
        "load_average_after": os.getloadavg(),
    }
