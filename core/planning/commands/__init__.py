"""`python -m core.planning`: argv -> JSON (or a table). The capacity command (`capacity`), `predict` and
`max-rate` (`predict_cli`), `ramp` (`ramp_cli`) and `slo` (`slo_cli`). Imports every planning layer below it."""
