"""Shared test harness: AppTest on the real entry point, a live streamlit server, and a real Chromium."""

import fcntl
import os
import shutil
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
ARTIFACTS = ROOT / "tests" / "artifacts"
CHROMIUM = "/usr/bin/chromium"
CHROMIUM_ARGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]

if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

# Under pytest-xdist (`-n 2`: a worker per core on CI's two) each worker, and every server it starts, runs torch
# and OpenMP on one thread: two workers of two threads each on two cores spin-wait on each other's cores (the
# real-model tests took 4-10x their serial time that way). Before torch is imported, so that it takes effect.
if os.environ.get("PYTEST_XDIST_WORKER"):
    os.environ.setdefault("OMP_NUM_THREADS", "1")

# Bytecode is kept (in __pycache__, git-ignored) even where PYTHONDONTWRITEBYTECODE is set, as on the machine this
# suite runs on: otherwise every process of a run (the workers, the servers and job workers they start) compiles
# the project's modules again, and each worker rewrites and compiles every test file's asserts (collecting took
# 15.8 s in one process without bytecode, 6.2 s with it). Set here, before pytest-xdist starts the workers.
if os.environ.pop("PYTHONDONTWRITEBYTECODE", None) is not None:
    sys.dont_write_bytecode = False


def open_app(page: str | None = None, timeout: float = 120):
    """Run app.py under AppTest, switch to `page` (e.g. "app_pages/playground.py") and return the AppTest.

    Pages are opened through the entry point, since a page run on its own cannot import modules beside app.py.
    """
    from streamlit.testing.v1 import AppTest

    at = AppTest.from_file(str(ROOT / "app.py"), default_timeout=timeout)
    at.run()
    assert not at.exception, at.exception
    if page is not None:
        at.switch_page(page)
        at.run()
        assert not at.exception, at.exception
    return at


def open_page_with(page: str | None, params: dict[str, str], timeout: float = 120):
    """app.py under AppTest on `page` (None: the app's default page) with this query string, as a shared link
    opens it; fails on an exception. The one helper the page tests' `open_*` functions call."""
    from streamlit.testing.v1 import AppTest

    at = AppTest.from_file(str(ROOT / "app.py"), default_timeout=timeout)
    if page is not None:
        at.switch_page(page)
    for key, value in params.items():
        at.query_params[key] = value
    at.run()
    assert not at.exception, at.exception
    return at


def page_order(node):
    """The page's elements in the order they are drawn (AppTest's tree, depth first)."""
    children = getattr(node, "children", None)
    if children is None:
        yield node
        return
    for key in sorted(children):
        yield from page_order(children[key])


def wait_for_script_done(page, timeout_ms: float) -> None:
    """Until a rerun ends, Streamlit shows its status widget and keeps the last run's stale elements beside the new
    ones, so a button whose place moved is on the page twice; wait for the end before clicking."""
    page.wait_for_selector('[data-testid="stStatusWidget"]', state="detached", timeout=timeout_ms)
    # the widget shows a moment after a run starts, so its absence alone can be read too early: the last run's
    # elements are marked data-stale="true" until the run that replaces them ends
    page.wait_for_function(
        "() => document.querySelectorAll('[data-stale=\"true\"]').length === 0", timeout=timeout_ms
    )


def fill_form_number(page, label: str, value: str, shown: str | None = None) -> None:
    """Type into a number input inside an st.form and commit it. The input commits its typed value on blur, so a
    submit clicked straight after `fill` can read the old value (CI once reran the simulator's default 1,000
    requests with "150" on screen): Tab out and wait until the field shows the committed value."""
    from playwright.sync_api import expect

    field = page.get_by_label(label, exact=True)
    field.fill(value)
    field.press("Tab")
    expect(field).to_have_value(shown or value)


@pytest.fixture(scope="session")
def _worker_lock_path(tmp_path_factory) -> Path:
    """A file the pytest-xdist workers of one run share (their base temporary directories have one parent)."""
    return tmp_path_factory.getbasetemp().parent / "exclusive.lock"


@pytest.fixture(autouse=True)
def _exclusive_when_marked(request, _worker_lock_path):
    """Under pytest-xdist a test marked `exclusive` (its bounds are timings on this machine, e.g. the load
    tests') runs with no other test at the same time: it takes the workers' lock file exclusively, every other
    test takes it shared (flock), so the other worker finishes its current test and waits for this one."""
    if not os.environ.get("PYTEST_XDIST_WORKER"):
        yield
        return
    exclusive = request.node.get_closest_marker("exclusive") is not None
    with open(_worker_lock_path, "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX if exclusive else fcntl.LOCK_SH)
        try:
            yield
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


def _free_port() -> int:
    from core.serve.ports import free_port

    return free_port()


@pytest.fixture(scope="session")
def streamlit_server():
    """`streamlit run app.py` on 127.0.0.1 for the whole session; yields its base URL, then stops it."""
    port = _free_port()
    ARTIFACTS.mkdir(exist_ok=True)
    # one log per pytest-xdist worker (gw0, gw1, ...): two workers' servers never write one file
    log_path = ARTIFACTS / f"streamlit-{os.environ.get('PYTEST_XDIST_WORKER', 'main')}.log"
    from tests.load.server import start_server, stop_server  # it imports this module's ROOT

    # the browser tests' own core.serve listens on free loopback ports, not the lab server's defaults
    env = {**os.environ, "PAGED_LAB_LIVE_HOSTS": "127.0.0.1"}
    process = start_server(port, log_path, env, ready_timeout_s=60)
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        stop_server(process)


@pytest.fixture(scope="session")
def shared_host_cache(tmp_path_factory) -> Path:
    """One result cache directory (PAGED_LAB_CACHE_DIR) for the team hosts the suite starts besides
    tests/hosting/test_host.py's (which starts empty, to see its warm-up fill the cache, then hands its results
    over to this one: TEAM_HOST_TESTS run as one unit, that file first, so the pages' defaults are computed once
    in the run); a host that finds it empty computes them. Shared by the pytest-xdist workers (their base
    temporary directories have one parent); concurrent hosts write it safely (`DiskResultCache`)."""
    root = tmp_path_factory.getbasetemp()
    path = (root.parent if os.environ.get("PYTEST_XDIST_WORKER") else root) / "shared-host-results"
    path.mkdir(exist_ok=True)
    return path


@pytest.fixture(scope="session")
def browser():
    """Debian's Chromium driven by Python Playwright (never a downloaded browser).

    Skipped when /usr/bin/chromium is missing, except under CI (CI=true), where that is a failure.
    """
    if not Path(CHROMIUM).exists() or shutil.which(CHROMIUM) is None:
        if os.environ.get("CI"):
            pytest.fail(f"{CHROMIUM} is missing; .ci/run installs it with apt-get install -y chromium")
        pytest.skip(f"{CHROMIUM} is missing (apt-get install -y chromium)")
    from playwright.sync_api import sync_playwright

    with sync_playwright() as playwright:
        instance = playwright.chromium.launch(executable_path=CHROMIUM, headless=True, args=CHROMIUM_ARGS)
        yield instance
        instance.close()


@pytest.fixture
def page(browser):
    context = browser.new_context(viewport={"width": 1500, "height": 1100})
    tab = context.new_page()
    tab.set_default_timeout(60_000)
    yield tab
    context.close()


@pytest.fixture
def real_vllm(request):
    """The run's one real vLLM (`tests/vllm_server.py`), for this test alone, its prefix cache empty."""
    from tests.vllm_server import use_vllm

    with use_vllm(request.config) as server:
        yield server


REAL_VLLM_TESTS = "tests/vllm/"
# The files that start team hosts, in the order they run, on one worker: test_host.py computes every page's
# defaults into an empty cache (what it checks) and hands them to `shared_host_cache`, which the others read.
TEAM_HOST_TESTS = ("tests/hosting/test_host.py", "tests/hosting/test_docker.py", "tests/load/test_load.py")
# Browser tests on one worker's `streamlit_server`, in this order: the Engine page's default chat turn on SmolLM2
# (~15 s), computed by test_browser_engine.py, is in that server's result cache when the offline test opens it.
ENGINE_BROWSER_TESTS = ("tests/app/test_browser_engine.py", "tests/app/test_browser_offline.py")
# AppTest files in one process, in this order: the SLO planner's and the Engine page's defaults (~15 s and ~10 s)
# the page tests compute are in the process-wide job pool's cache when the hostile-URL and widget-fuzz tests open
# those pages (the fuzz file alone took 45 s, 17 s after the page tests).
APP_DEFAULT_TESTS = (
    "tests/app/test_engine_chat.py",
    "tests/app/test_slo_planner_page.py",
    "tests/hosting/test_hostile_urls.py",
    "tests/hosting/test_fuzz_pages.py",
)
TOGETHER = (TEAM_HOST_TESTS, ENGINE_BROWSER_TESTS, APP_DEFAULT_TESTS)  # each: one unit of work, in its order


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config, log):
    """`--dist loadfile` with tests/vllm/ as one unit: those tests take the run's one vLLM one at a time, so on two
    workers they run best on one while the other runs everything else (as separate files both workers ended up
    waiting on them, at the end of the run: ~4 minutes of one idle worker). Each group of TOGETHER is one unit
    too, so what its first file computes serves the later ones."""
    if config.getoption("dist") != "loadfile":
        return None
    from xdist.scheduler import LoadFileScheduling

    # xdist reorders the units by their number of tests unless told not to (`--loadscope-reorder`, on by default):
    # the 12 real-vLLM tests then started ~100 s into a full run, behind 38 larger files, and the run ended on one
    # worker with the other idle (~55 s between the two in a replay of a full run's durations). The order
    # pytest_collection_modifyitems gives is the one meant.
    config.option.loadscopereorder = False

    class RealVLLMTogether(LoadFileScheduling):
        def _split_scope(self, nodeid: str) -> str:
            if nodeid.startswith(REAL_VLLM_TESTS):
                return REAL_VLLM_TESTS
            for group in TOGETHER:
                if nodeid.startswith(group):
                    return group[0]
            return super()._split_scope(nodeid)

    return RealVLLMTogether(config, log)


@pytest.hookimpl(optionalhook=True)
def pytest_configure_node(node):
    """Tell each worker whether the real-vLLM tests are one unit on one worker (the scheduler above)."""
    from tests.vllm_server import ONE_WORKER_KEY

    node.workerinput[ONE_WORKER_KEY] = node.config.getoption("dist") == "loadfile"


def pytest_collection_modifyitems(config, items):
    """The real-vLLM tests first: their worker starts the server (1-3 minutes) while the other runs the rest.
    Each group of TOGETHER together, in its order, where the first of its tests was."""
    items.sort(key=lambda item: not item.nodeid.startswith(REAL_VLLM_TESTS))
    for group in TOGETHER:
        members = [item for item in items if item.nodeid.startswith(group)]
        if members:
            at = items.index(members[0])
            rest = [item for item in items if not item.nodeid.startswith(group)]
            members.sort(key=lambda item: next(i for i, f in enumerate(group) if item.nodeid.startswith(f)))
            items[:] = rest[:at] + members + rest[at:]


@pytest.hookimpl(trylast=True)
def pytest_runtest_teardown(item, nextitem):
    """The real vLLM stops once its last test has run and torn down (`tests.vllm_server.stop_after_last_test`)."""
    from tests.vllm_server import stop_after_last_test

    stop_after_last_test(item.config, REAL_VLLM_TESTS, item.nodeid, nextitem and nextitem.nodeid)


def pytest_sessionfinish(session, exitstatus):
    """The run's controller (or the single process) stops the real vLLM a worker started."""
    from tests.vllm_server import stop_shared_vllm

    stop_shared_vllm(session.config)
