"""What is given: model architectures (`models`, presets in `data/models.json`), GPUs (`hardware`) and the bytes of a
model's stored weights (`weights`). Imports nothing else of planning."""
