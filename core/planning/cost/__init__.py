"""What a step costs: the step-time model (`step_model`: `StepTimeModel`, how a step is
priced; `step_time`: its builders, `from_specs` for a deployment), speculative decoding (`speculative`) and our CPU engine's
roofline (`cpu_roofline`). Imports `catalog` and `memory` (of planning). The fits of the step-time model, the
published runs they are fitted to and the serving engines' fitted profiles live one folder below, in `fits`."""
