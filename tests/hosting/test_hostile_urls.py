"""Every page opened with hostile query parameters (its own keys and unknown ones; NaN, huge, negative, unicode,
control characters): the page renders with no exception element; pages that read the URL report what they
refused with st.error."""

import pytest
from streamlit.testing.v1 import AppTest

from tests.conftest import ROOT
from ui.engine.state import FIELDS as ENGINE_FIELDS
from ui.kernels.state import FIELDS as KERNEL_FIELDS
from ui.live.url import FIELDS as LIVE_FIELDS
from ui.planner.state import ALL_FIELDS
from ui.playground.url import URL_FIELDS
from ui.simulator.state import FIELDS as SIMULATOR_FIELDS
from ui.slo_planner.state import FIELDS as SLO_PLANNER_FIELDS

HOSTILE = ["nan", "-1e308", "🧱ü\u202e", "9" * 5000, "<script>alert(1)</script>"]
# page -> the query keys it reads
PAGES = {
    "app_pages/playground.py": [field.key for field in URL_FIELDS],
    "app_pages/kernels.py": [field.key for field in KERNEL_FIELDS],
    "app_pages/simulator.py": [field.key for field in SIMULATOR_FIELDS],
    "app_pages/planner.py": [field.key for field in ALL_FIELDS],
    "app_pages/slo_planner.py": [field.key for field in SLO_PLANNER_FIELDS],
    # its text fields (question, prompts, paths) take any text: the numbers and choices must refuse
    "app_pages/engine.py": [f.key for f in ENGINE_FIELDS if f.kind != "str"],
    "app_pages/about.py": [],
    "app_pages/live.py": [field.key for field in LIVE_FIELDS],
}


@pytest.mark.parametrize("page", list(PAGES))
@pytest.mark.parametrize("raw", HOSTILE)
def test_hostile_query_parameters_never_raise(page, raw):
    at = AppTest.from_file(str(ROOT / "app.py"), default_timeout=300)
    at.switch_page(page)
    for key in [*PAGES[page], "zz_unknown", "page"]:
        at.query_params[key] = raw
    at.run()
    assert not at.exception, at.exception
    if PAGES[page]:
        assert at.error, f"{page} accepted {raw[:20]!r} in every parameter without a word"
