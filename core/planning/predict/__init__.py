"""What one deployment does at one load, in steady state: the traffic (`load`), the deployment (`deployment`:
`Deployment`), the prediction (`prediction`: `predict`), disaggregated prefill and decode (`disagg`), the highest
rate within targets (`max_rate`, stopped early by `early_stop`), and llm-d's published fleet run as a prediction (`published_fleet`). Imports
`catalog`, `memory` and `cost` (of planning)."""
