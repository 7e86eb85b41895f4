"""Training: device meshes and logical-axis rules, optimizers, checkpoints, the sharded train state, the one training
loop, and the two trainers that use it (T5 and Transformer-XL)."""
