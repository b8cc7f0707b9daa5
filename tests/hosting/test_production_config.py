"""`.streamlit/config.toml`: the production settings a hosted demo relies on, read the way Streamlit reads them."""

import json
import subprocess
import sys
import tomllib

from core.limits import Limits
from tests.conftest import ROOT

CONFIG = tomllib.loads((ROOT / ".streamlit" / "config.toml").read_text())


def test_local_by_default_headless_with_xsrf_and_no_code_reloading():
    server = CONFIG["server"]
    assert server["address"] == "127.0.0.1" and server["headless"] is True
    assert server["enableXsrfProtection"] is True and server["enableCORS"] is True
    assert server["runOnSave"] is False and server["fileWatcherType"] == "none"
    assert CONFIG["runner"]["postScriptGC"] is False
    assert CONFIG["browser"]["gatherUsageStats"] is False


def test_streamlit_upload_cap_matches_the_operator_default():
    # Streamlit's cap is in megabytes (10^6 bytes); the pages check PAGED_LAB_MAX_UPLOAD_BYTES before reading.
    assert CONFIG["server"]["maxUploadSize"] * 1_000_000 == Limits().max_upload_bytes


def test_streamlit_itself_reads_every_option():
    """Each option exists under that name in the installed Streamlit and takes the file's value (a misspelt key
    would be ignored with a warning and silently fall back to the default)."""
    options = [
        f"{section}.{key}" for section, values in CONFIG.items() for key in values if section != "theme"
    ]
    code = (
        "import json, sys; from streamlit import config; config.get_config_options(force_reparse=True); "
        "print(json.dumps({name: config.get_option(name) for name in sys.argv[1:]}))"
    )
    completed = subprocess.run(
        [sys.executable, "-c", code, *options], cwd=ROOT, capture_output=True, text=True, timeout=60
    )
    assert completed.returncode == 0, completed.stderr
    read = json.loads(completed.stdout.strip().splitlines()[-1])
    for name in options:
        section, key = name.split(".")
        assert read[name] == CONFIG[section][key], name
