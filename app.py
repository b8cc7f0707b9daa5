"""PagedAttention Lab: entry point, navigation and the shared sidebar."""

from pathlib import Path

import streamlit as st

from ui.sidebar import render_sidebar

# A file this server serves itself: a ":material/...:" or emoji page_icon makes every browser fetch the favicon
# from a public host (no icon offline, and each visitor's address sent elsewhere). The :material: icons of the
# navigation and buttons are drawn with the font Streamlit serves itself (tests/app/test_browser_offline.py).
ICON = Path(__file__).resolve().parent / "ui" / "assets" / "icon.png"
st.set_page_config(page_title="PagedAttention Lab", page_icon=str(ICON), layout="wide")

# The screens live in app_pages/, not pages/: Streamlit treats a folder named pages/ beside the entry point as the
# old multipage layout until st.navigation first runs, so a shared deep link (/planner?...) opened on a fresh
# server would run the page without this file (no sidebar, no wide layout).
PAGES = [
    st.Page(
        "app_pages/playground.py", title="Block manager playground", icon=":material/grid_view:", default=True
    ),
    st.Page("app_pages/kernels.py", title="Kernels", icon=":material/bolt:"),
    st.Page("app_pages/simulator.py", title="Serving simulator", icon=":material/traffic:"),
    st.Page("app_pages/planner.py", title="Capacity planner", icon=":material/straighten:"),
    st.Page("app_pages/slo_planner.py", title="SLO planner", icon=":material/speed:"),
    st.Page("app_pages/engine.py", title="Engine", icon=":material/smart_toy:"),
    st.Page("app_pages/live.py", title="Live", icon=":material/monitor_heart:"),
    st.Page("app_pages/about.py", title="About this server", icon=":material/info:"),
]

navigation = st.navigation(PAGES)
render_sidebar()
navigation.run()
