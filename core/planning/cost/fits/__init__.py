"""The step-time model fitted: the least-squares fit to measured steps (`step_fit`), published GPU figures and the
efficiencies fitted to them (`published`), measured vLLM runs (`published_vllm_rows`, from
`data/`) and the vLLM parameters fitted to them (`published_vllm`), and the serving engines' profiles that store those fits
(`engine_profiles`). Imports `catalog`, `memory` and `cost` (of planning)."""
