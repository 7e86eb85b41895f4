"""Training: device meshes and logical-axis partitioning, optimizers, checkpoints, the gin trainer loop."""
