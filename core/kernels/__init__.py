"""Paged attention: the public API with backend dispatch, one module per backend, and kernel timing."""
