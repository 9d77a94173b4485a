"""Training: the one loop (`trainer`), its state and step functions (`step`), checkpoints and the run
loader (`checkpoint`), the mesh and sharding rules (`sharding`), optimizers and schedules (`optim`),
metrics files (`metrics`), input prefetch (`prefetch`) and peak FLOP/s for MFU (`flops`)."""
