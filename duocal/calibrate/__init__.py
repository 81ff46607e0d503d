"""DuoAttention calibration: gates trained on synthetic passkey data, sharded by DeepSpeed.

Components (one concept per file): `gates` (the trainable gates and their clamp), `window_blocks`
(blocked sink-window attention), `gated_attention` (the registered attention function of the
teacher and student passes), `loss`, `schedule`, `objective` (the module DeepSpeed wraps),
`engine` (DeepSpeed set-up), `ulysses` (sequence parallelism), `checkpoint`, `recipe`, `model`
(the model, its checks and the gated objective, shared by the run, the ranking and the step
benchmark), `run` (the training loop), `launch` (torchrun), `ranking` (tie-resolving head
ranking), `report` (the run folder's outputs), `plan_loss` (losses of candidate plans).
"""
