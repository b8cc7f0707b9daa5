"""The team host: Streamlit replicas on loopback ports behind nginx, one shared worker pool, one shared result
cache on disk. Run it with `python -m hosting --port 8501 [--replicas N]` (see hosting/launcher.py)."""
