"""Streamlit-facing helpers: figure builders (plotly, no Streamlit), shared widgets and validation."""
