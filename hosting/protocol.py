"""One simulated person speaking Streamlit's own websocket protocol: no browser, ~20 ms of client CPU per render.

A session is one websocket to `/_stcore/stream` (subprotocol `streamlit`, a same-origin `Origin` header) carrying
binary protobufs from `streamlit.proto`. The client sends `BackMsg(rerun_script=ClientState(...))`; the server
answers `new_session`, `navigation` (the pages' script hashes), deltas (elements, widgets with their ids),
`page_info_changed`, and ends each run with `script_finished`. A first load names its page by `page_name` (the URL
path); sidebar navigation sends the target's `page_script_hash`; a widget edit sends the widget's id and value
in `widget_states`, as the browser does.

Used by the team host to warm its replicas before it says ready (hosting/warmup.py) and by the load test
(tests/load/run.py). Loopback only: the host's replicas and proxy bind 127.0.0.1.

`Render` is what one run cost, timed on the client from sending `rerun_script` to the run's final
`script_finished` (on loopback, the server's seconds). Exceptions are `exception` elements the script drew;
refusals are error alerts saying the job queue is full.
"""

import asyncio
import contextlib
import time
import urllib.request
from dataclasses import dataclass, field

import websockets
from streamlit.proto.BackMsg_pb2 import BackMsg
from streamlit.proto.ForwardMsg_pb2 import ForwardMsg
from streamlit.proto.NumberInput_pb2 import NumberInput

EARLY_FOR_RERUN = 2  # ScriptFinishedStatus.FINISHED_EARLY_FOR_RERUN: st.rerun, another run follows
REFUSAL_MARKERS = ("queue is full", "PAGED_LAB_MAX_QUEUED_JOBS")


@dataclass(frozen=True)
class Edit:
    """Set the number input labelled `label` on page `page` to `value`."""

    page: str
    label: str
    value: float


@dataclass
class Render:
    """One script run. action: "open" (first load, by page name), "navigate" (sidebar, by script hash) or
    "edit" (a widget change). server_s: request to final script_finished; first_s: request to the first element
    (delta) of this run; bytes: every frame received for it; charts: plotly charts drawn."""

    page: str
    action: str
    server_s: float = 0.0
    first_s: float | None = None
    bytes: int = 0
    charts: int = 0
    exceptions: list[str] = field(default_factory=list)
    refusals: list[str] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)


@dataclass
class _Widget:
    id: str
    integer: bool


class ProtocolSession:
    """A websocket session of one person. Use as `async with ProtocolSession(base_url) as s: await s.open(...)`."""

    def __init__(self, base_url: str, timeout_s: float = 300.0, load_page: bool = True):
        """`load_page`: first GET the page as a browser does, for the proxy's sticky cookie (False: connect the
        websocket at once, as to a replica's own port, where there is no cookie to get)."""
        self.base_url, self.timeout_s, self.load_page = base_url.rstrip("/"), timeout_s, load_page
        self.hashes: dict[str, str] = {}  # url path -> page script hash, in the navigation's order
        self.titles: dict[str, str] = {}  # url path -> the page's title in the sidebar
        self.default_page: str | None = None  # url path of the page the server opens for "" (is_default)
        self.on_navigation = None  # called with `hashes` whenever the server sends the page list
        self.widgets: dict[str, _Widget] = {}  # label -> widget on the current page
        self.query_string = ""
        self.current: str | None = None
        self.replica = (
            ""  # the proxy's X-Paged-Lab-Replica for this session ("" without the team host's proxy)
        )
        self._socket = None

    async def __aenter__(self) -> "ProtocolSession":
        cookie = await asyncio.to_thread(self._cookie) if self.load_page else ""
        url = self.base_url.replace("http", "ws", 1) + "/_stcore/stream"
        headers = {"Cookie": cookie} if cookie else None
        self._socket = await websockets.connect(
            url,
            subprotocols=["streamlit"],
            origin=self.base_url,
            additional_headers=headers,
            max_size=None,
            open_timeout=self.timeout_s,
            ping_interval=None,
        )
        return self

    async def __aexit__(self, *exc) -> None:
        with contextlib.suppress(Exception):
            await self._socket.close()

    def _cookie(self) -> str:
        """What a browser holds after loading the page: the proxy's sticky-replica cookie, if any."""
        with urllib.request.urlopen(self.base_url + "/", timeout=self.timeout_s) as response:
            cookies = response.headers.get_all("Set-Cookie") or []
            self.replica = response.headers.get("X-Paged-Lab-Replica", "")
        return "; ".join(c.split(";", 1)[0] for c in cookies)

    async def open(self, page: str, query_string: str = "") -> Render:
        """Load `page` by URL (the first run of the session; "" is the app's default page) or by the sidebar
        (later runs), with `query_string` (e.g. "metrics=http%3A%2F%2F..."), as a browser opening that URL sends
        it."""
        message = BackMsg()
        if self.current is None or page not in self.hashes:
            message.rerun_script.page_name = page
            action = "open"
        else:
            message.rerun_script.page_script_hash = self.hashes[page]
            action = "navigate"
        message.rerun_script.query_string = query_string
        self.current, self.widgets = page, {}
        return await self._run(message, Render(page, action))

    async def edit(self, edit: Edit) -> Render:
        """Change one number input on the current page, as a person typing a value and pressing Enter."""
        if edit.page != self.current:
            raise ValueError(f"the session is on {self.current!r}, not {edit.page!r}")
        widget = self.widgets.get(edit.label)
        if widget is None:
            raise LookupError(
                f"no number input labelled {edit.label!r} on {edit.page!r}: {sorted(self.widgets)}"
            )
        message = BackMsg()
        message.rerun_script.page_script_hash = self.hashes[edit.page]
        message.rerun_script.query_string = self.query_string
        state = message.rerun_script.widget_states.widgets.add()
        state.id = widget.id
        if widget.integer:
            state.int_value = int(edit.value)
        else:
            state.double_value = float(edit.value)
        return await self._run(message, Render(edit.page, "edit"))

    async def _run(self, message: BackMsg, render: Render) -> Render:
        started = time.perf_counter()
        await self._socket.send(message.SerializeToString())
        deadline = started + self.timeout_s
        while True:
            frame = await asyncio.wait_for(
                self._socket.recv(), timeout=max(0.1, deadline - time.perf_counter())
            )
            render.bytes += len(frame)
            forward = ForwardMsg.FromString(frame)
            kind = forward.WhichOneof("type")
            if kind == "delta" and render.first_s is None:
                render.first_s = time.perf_counter() - started
            if kind == "delta":
                self._read_delta(forward.delta, render)
            elif kind == "navigation":
                pages = forward.navigation.app_pages
                self.hashes = {p.url_pathname: p.page_script_hash for p in pages}
                self.titles = {p.url_pathname: p.page_name for p in pages}
                self.default_page = next((p.url_pathname for p in pages if p.is_default), None)
                if self.on_navigation is not None:
                    self.on_navigation(self.hashes)
            elif kind == "page_info_changed":
                self.query_string = forward.page_info_changed.query_string
            elif kind == "script_finished" and forward.script_finished != EARLY_FOR_RERUN:
                render.server_s = time.perf_counter() - started
                return render

    def _read_delta(self, delta, render: Render) -> None:
        if delta.WhichOneof("type") != "new_element":
            return
        element = delta.new_element
        kind = element.WhichOneof("type")
        if kind == "plotly_chart":
            render.charts += 1
        elif kind == "exception":
            render.exceptions.append(f"{element.exception.type}: {element.exception.message}"[:300])
        elif kind == "alert" and element.alert.format == element.alert.ERROR:
            text = element.alert.body[:300]
            (render.refusals if any(m in text for m in REFUSAL_MARKERS) else render.errors).append(text)
        elif kind == "number_input":
            widget = element.number_input
            self.widgets[widget.label] = _Widget(widget.id, widget.data_type == NumberInput.INT)
