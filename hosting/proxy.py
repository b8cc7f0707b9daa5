"""The nginx configuration of a team host, rendered from hosting/nginx.conf.template, and the copy of Streamlit's
front-end files nginx serves itself."""

import importlib.util
import os
import shutil
from pathlib import Path

TEMPLATE = Path(__file__).with_name("nginx.conf.template")
FORM_OVERHEAD_BYTES = 1_000_000  # multipart framing around the largest upload


def render_config(
    address: str,
    port: int,
    replica_ports: list[int],
    runtime: Path,
    max_upload_bytes: int,
    nginx_workers: int = 1,
    static_dir: Path | None = None,
) -> str:
    """The nginx.conf text: `address:port` proxied to 127.0.0.1 at each of `replica_ports`, sticky by cookie,
    websockets upgraded; `/static/` served from `static_dir` (default `runtime/static`, see `copy_static_files`);
    pid and temporary files under `runtime`. Raises ValueError for no replica or a port out of range."""
    if not replica_ports:
        raise ValueError("the proxy needs at least one replica port")
    for value in (port, *replica_ports):
        if not 0 < value < 65536:
            raise ValueError(f"port {value} is outside 1-65535")
    servers = "\n".join(f"        server 127.0.0.1:{p} max_fails=1 fail_timeout=5s;" for p in replica_ports)
    values = {
        "ADDRESS": address,
        "PORT": str(port),
        "REPLICAS": str(len(replica_ports)),
        "RUNTIME": str(runtime),
        "MAX_BODY_BYTES": str(max_upload_bytes + FORM_OVERHEAD_BYTES),
        "NGINX_WORKERS": str(nginx_workers),
        "UPSTREAM_SERVERS": servers,
        "STATIC_DIR": str(static_dir or Path(runtime) / "static"),
    }
    text = TEMPLATE.read_text()
    for name, value in values.items():
        text = text.replace("{{" + name + "}}", value)
    if "{{" in text:
        raise ValueError(f"unfilled placeholder in {TEMPLATE.name}: {text[text.index('{{') :][:40]}")
    return text


def streamlit_static_dir() -> Path:
    """Where the installed Streamlit keeps the files its pages load from `/static/` (scripts, styles, fonts)."""
    spec = importlib.util.find_spec("streamlit")
    if spec is None or spec.origin is None:
        raise RuntimeError("streamlit is not installed")
    return Path(spec.origin).parent / "static" / "static"


def copy_static_files(runtime: Path) -> Path:
    """Copy Streamlit's front-end files to `runtime/static`, readable by every user (nginx's workers run as
    another user when it starts as root, and may not reach a home directory); returns the copy."""
    target = Path(runtime) / "static"
    shutil.copytree(streamlit_static_dir(), target)
    for directory, _, files in os.walk(target):
        os.chmod(directory, 0o755)
        for name in files:
            os.chmod(os.path.join(directory, name), 0o644)
    return target
