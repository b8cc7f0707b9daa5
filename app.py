"""PagedAttention Lab: entry point, navigation and the shared sidebar."""

import streamlit as st

from ui.sidebar import render_sidebar

st.set_page_config(page_title="PagedAttention Lab", page_icon="🧱", layout="wide")

PAGES = [
    st.Page("pages/playground.py", title="Block manager playground", icon="🧱", default=True),
    st.Page("pages/simulator.py", title="Serving simulator", icon="🚦"),
    st.Page("pages/planner.py", title="Capacity planner", icon="📐"),
    st.Page("pages/kernels.py", title="Kernels", icon="⚡"),
]

navigation = st.navigation(PAGES)
render_sidebar()
navigation.run()
