"""The sidebar every page shares: what torch computes on."""

import streamlit as st
import torch

from core.device import default_device, device_label, format_bytes, memory_budget_bytes


@st.cache_resource
def _device_summary() -> dict[str, str]:
    return {
        "device": device_label(default_device()),
        "torch": torch.__version__,
        "budget": format_bytes(memory_budget_bytes()),
    }


def render_sidebar() -> None:
    summary = _device_summary()
    with st.sidebar:
        st.markdown("**PagedAttention Lab**")
        st.caption(f"Torch device: `{summary['device']}`  \nTorch {summary['torch']}")
        st.caption(f"Tensor memory budget: {summary['budget']} (set `PAGED_LAB_MAX_BYTES` to change)")
