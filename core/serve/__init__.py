"""core.serve: our engine served the way vLLM serves (OpenAI-compatible HTTP, vLLM's /metrics, KV cache events on
ZMQ), so the Live page, Grafana or a KV-aware router can be pointed at the lab. Run `python -m core.serve -h`."""
