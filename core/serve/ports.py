"""Free TCP ports for servers this lab starts on loopback: `free_port()`.

A port found free is closed again before the server that is given it binds it, seconds later for a Streamlit
server, ~30 s later for the replay socket of a vLLM start (its engine core binds it after loading the model). A
port the kernel picks (`bind(host, 0)`) lies in its ephemeral range, the range it also hands every outgoing
connection its local port from, so any client of the machine (a health poll, a browser) can take it in between
(a vLLM start in one run of the suite failed exactly as one does whose replay port is taken: docs/development.md).
So the port is drawn at random below that range, where only
another explicit bind can take it, and checked free by binding it.

Invariant: the returned port was bindable on `host` when returned; it is never below LOWEST_PORT.
"""

import random
import socket
from pathlib import Path

LOWEST_PORT = 20_000  # above the usual fixed service ports (8000, 8080, 8501, ...)
EPHEMERAL_RANGE_FILE = Path("/proc/sys/net/ipv4/ip_local_port_range")
IANA_EPHEMERAL_LOW = 49_152  # where the kernel's range cannot be read (macOS and Windows use the IANA range)
TRIES = 50
_RANDOM = random.SystemRandom()


def ephemeral_low(range_file: Path = EPHEMERAL_RANGE_FILE) -> int:
    """The first port of the kernel's ephemeral range (Linux: ip_local_port_range), IANA's 49,152 elsewhere."""
    try:
        return int(range_file.read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return IANA_EPHEMERAL_LOW


def bindable(host: str, port: int) -> bool:
    """Whether `port` on `host` could be bound now (nothing holds it)."""
    with socket.socket() as sock:
        try:
            sock.bind((host, port))
        except OSError:
            return False
    return True


def free_port(host: str = "127.0.0.1", range_file: Path = EPHEMERAL_RANGE_FILE) -> int:
    """A TCP port on `host` that was free a moment ago, drawn from [LOWEST_PORT, the ephemeral range's start)
    (module docstring: why); a port the kernel picks when that range is empty or no draw of TRIES is free."""
    low = ephemeral_low(range_file)
    if low > LOWEST_PORT:
        for _ in range(TRIES):
            port = _RANDOM.randrange(LOWEST_PORT, low)
            if bindable(host, port):
                return port
    with socket.socket() as sock:
        sock.bind((host, 0))
        return sock.getsockname()[1]
