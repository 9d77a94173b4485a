"""The training machinery behind zoo.train (zoo.api.training.train, the call `train.py` makes).

The package holds the training machinery: the one loop (`trainer`; beside it its evaluation pass `evaluation`,
its records and console lines `records`, signal stops `stops`, the workdir's claim `workdir_claim` and the errors a
run ends with `run_errors`), its state and step functions (`step`), checkpoints (`checkpoint`; the Orbax manager
and the last-good mark in `checkpoint_manager`, the config beside each checkpoint in `checkpoint_config`) and
reading a run (`runs`), the mesh and sharding rules (`sharding`), optimizers and schedules (`optim`), metrics files
(`metrics`), input prefetch (`prefetch`) and peak FLOP/s for MFU (`flops`)."""
