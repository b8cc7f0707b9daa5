"""Live: the client of a running vLLM (or core.serve) server, and nothing above it.

`addresses` (which endpoints may be read), `fetch` and `poller` (its /metrics), `metrics` and `histogram` (parsed
in vLLM's vocabulary, `core.metric_names`), `history` and `window` (polls over time; a window between two scrapes),
`subscriber` and `tree` (its KV cache events and the cached-block tree they describe), `watch` (all of it for one
page). Planning against what it reads lives in `core.planning.observed`; starting our server, in
`core.serve.launcher`.
"""
