"""Live: read a running vLLM (or core.serve) server: its Prometheus metrics and KV cache events."""
