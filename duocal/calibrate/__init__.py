"""DuoAttention calibration: gates trained on synthetic passkey data, sharded by DeepSpeed.

Components (one concept per file): `gates` (the trainable gates and their clamp), `key_blocks`
(blocked sink-window attention), `gated_attention` (the registered attention function of the teacher
and student passes), `objective` (the module DeepSpeed wraps, and its losses), `engine` (DeepSpeed
set-up and the `Distributed` context of a process), `ulysses` (sequence parallelism), `checkpoint`,
`recipe`, `model` (the model, its checks and the gated objective, shared by the run, the ranking and
the step benchmark), `run` (the training loop and its lr schedule), `launch` (torchrun), `ranking`
(tie-resolving head ranking), `report` (the run folder's outputs), `plan_loss` (losses of candidate
plans).
"""
