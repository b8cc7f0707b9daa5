"""`python -m core.planning`: argv -> JSON (or a table). The capacity command (`capacity`), `predict` and
`max-rate` (`predict_cli`) and `slo` (`slo_cli`). Imports every planning layer below it."""
