"""The shared pool process: `python -m hosting.pool --socket PATH --cache-dir DIR` runs the one `JobPool` of a
team host (sized by the operator limits in its environment) and serves it to every replica over the Unix socket.
The key authenticating replicas comes from PAGED_LAB_POOL_KEY (hex). Stops, with its workers, on SIGTERM/SIGINT.
"""

import argparse
import contextlib
import os
import signal
import sys
import threading

from core.jobs.disk_cache import DiskResultCache
from core.jobs.remote import PoolServer, shared_pool
from core.jobs.worker import PRELOAD
from core.limits import Limits


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m hosting.pool", description=__doc__.splitlines()[0])
    parser.add_argument("--socket", required=True)
    parser.add_argument("--cache-dir", required=True)
    args = parser.parse_args(argv)
    limits = Limits.from_env()
    disk = DiskResultCache(args.cache_dir, limits.cache_entries, limits.cache_ttl_s)
    pool = shared_pool(limits, disk, preload=PRELOAD)
    with contextlib.suppress(FileNotFoundError):  # a previous pool's socket, when the host restarts this one
        os.unlink(args.socket)
    server = PoolServer(args.socket, bytes.fromhex(os.environ["PAGED_LAB_POOL_KEY"]), pool, disk)
    stop = threading.Event()
    for signum in (signal.SIGTERM, signal.SIGINT):
        signal.signal(signum, lambda *_: stop.set())
    print(f"pool: serving {limits.workers} workers on {args.socket}", flush=True)
    stop.wait()
    server.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
