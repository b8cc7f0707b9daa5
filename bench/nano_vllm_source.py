"""nano-vllm's own block manager and sequence classes, loaded from its source: the baseline of `bench.block_manager`.

Nothing of nano-vllm is re-implemented here. By default the source is the copy in
`bench/third_party/nano_vllm/`: three files of GeeeekExplorer/nano-vllm at commit `UPSTREAM_COMMIT`, byte for byte
(their git blob ids are in `UPSTREAM_BLOBS`, and a test checks them), with nano-vllm's MIT licence beside them. A
copy, rather than a checkout fetched at run time, so that the bench and its tests measure the same pinned code on
any machine, with no network. `--nano-vllm DIR` (or the NANO_VLLM_DIR environment variable) loads the same three
files from another checkout instead (a newer nano-vllm, say); the bench prints which source it timed.

Only `nanovllm/sampling_params.py`, `nanovllm/engine/sequence.py` and `nanovllm/engine/block_manager.py` are
executed, each as its own module under the package names it imports; the package's `__init__` is not run (it
imports the model runner, which needs CUDA and flash-attn).

nano-vllm hashes a full block with `xxhash.xxh64` over a numpy array's bytes. xxhash is not one of this project's
dependencies: where it is installed, nano-vllm's code uses it; where it is not, `XXH64StandIn` takes its place
(the same three calls: construct, `update(bytes)`, `intdigest()`; Python's hash of the bytes), and `hash_name`
says which ran. At nano-vllm's block size, 256, a block is hashed once per 256 tokens, so the choice moves the
per-token figure by little; docs/benchmarks.md gives both measured.
"""

import hashlib
import importlib.util
import os
import sys
import types
from dataclasses import dataclass
from pathlib import Path

VENDORED = Path(__file__).resolve().parent / "third_party" / "nano_vllm"
UPSTREAM_REPO = "GeeeekExplorer/nano-vllm"
UPSTREAM_COMMIT = "bb823b3e06983d71485a8e1f23715ebd87d98ef8"
# git blob id of each file at UPSTREAM_COMMIT (`git rev-parse COMMIT:PATH`)
UPSTREAM_BLOBS = {
    "LICENSE": "8eb3afcc8ebd428387d69d55b315588a1efd6a93",
    "nanovllm/sampling_params.py": "3e46598e3c46d7ca20bedd52713d756b56858d3f",
    "nanovllm/engine/sequence.py": "4decfce5f9cbbbe829a6e692ee01290970b87e90",
    "nanovllm/engine/block_manager.py": "a48989ca090431cf794573b983d1e7da93a05f2f",
}
_MODULES = ("nanovllm.sampling_params", "nanovllm.engine.sequence", "nanovllm.engine.block_manager")
ENV_VAR = "NANO_VLLM_DIR"


class XXH64StandIn(bytearray):
    """Stands in for `xxhash.xxh64` where xxhash is not installed: constructed empty, `update` appends bytes
    (bytearray's own extend, a C call as xxhash's is), `intdigest` is Python's hash of the bytes as an unsigned
    64-bit int."""

    __slots__ = ()
    update = bytearray.extend

    def intdigest(self) -> int:
        return hash(bytes(self)) & 0xFFFF_FFFF_FFFF_FFFF


@dataclass(frozen=True)
class NanoVllm:
    """nano-vllm's classes as loaded: `BlockManager` and `Sequence` are its own."""

    BlockManager: type
    Sequence: type
    source: str  # "vendored <commit>" or the checkout's path
    hash_name: str  # "xxhash <version>" or "stand-in (Python's hash of the bytes)"


def git_blob_id(data: bytes) -> str:
    """The id git gives a file with these bytes (`git hash-object`)."""
    return hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()


def _xxhash_module() -> tuple[types.ModuleType, str]:
    try:
        import xxhash
    except ImportError:
        stand_in = types.ModuleType("xxhash")
        stand_in.xxh64 = XXH64StandIn
        return stand_in, "stand-in (Python's hash of the bytes)"
    return xxhash, f"xxhash {xxhash.VERSION}"


def load(root: str | os.PathLike | None = None) -> NanoVllm:
    """nano-vllm's `BlockManager` and `Sequence` from `root` (a nano-vllm checkout), else from NANO_VLLM_DIR, else
    the vendored copy. Raises FileNotFoundError when a file is missing. Leaves `sys.modules` as it found it."""
    root = root or os.environ.get(ENV_VAR) or None
    base = Path(root) if root else VENDORED
    source = str(base) if root else f"vendored {UPSTREAM_REPO}@{UPSTREAM_COMMIT[:7]}"
    xxhash, hash_name = _xxhash_module()
    saved = {name: sys.modules.get(name) for name in ("xxhash", "nanovllm", "nanovllm.engine", *_MODULES)}
    try:
        sys.modules["xxhash"] = xxhash
        for package in ("nanovllm", "nanovllm.engine"):  # bare packages: their __init__ is not run
            module = types.ModuleType(package)
            module.__path__ = [str(base / package.replace(".", "/"))]
            sys.modules[package] = module
        loaded = {}
        for name in _MODULES:
            path = base / (name.replace(".", "/") + ".py")
            if not path.is_file():
                raise FileNotFoundError(
                    f"nano-vllm source {path} not found: give a nano-vllm checkout's root"
                )
            spec = importlib.util.spec_from_file_location(name, path)
            module = importlib.util.module_from_spec(spec)
            sys.modules[name] = module
            spec.loader.exec_module(module)
            loaded[name] = module
    finally:
        for name, module in saved.items():
            if module is None:
                sys.modules.pop(name, None)
            else:
                sys.modules[name] = module
    return NanoVllm(
        BlockManager=loaded["nanovllm.engine.block_manager"].BlockManager,
        Sequence=loaded["nanovllm.engine.sequence"].Sequence,
        source=source,
        hash_name=hash_name,
    )
