"""The load test's Streamlit protocol client is the team host's own (`hosting/protocol.py`), which also warms the
host's replicas before it says ready: one client, one place."""

from hosting.protocol import EARLY_FOR_RERUN, REFUSAL_MARKERS, Edit, ProtocolSession, Render

__all__ = ["EARLY_FOR_RERUN", "REFUSAL_MARKERS", "Edit", "ProtocolSession", "Render"]
