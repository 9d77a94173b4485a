"""zoo.train(config, *, workdir, overrides=..., resume=False, init_from=None) trains from Python and returns a Run:
it is zoo.api.training.train, the call `train.py` makes (zoo.callable_module makes this package callable).

The package holds the training machinery: the one loop (`trainer`), its state and step functions (`step`),
checkpoints (`checkpoint`) and reading a run (`runs`), the mesh and sharding rules (`sharding`), optimizers and
schedules (`optim`), metrics files (`metrics`), input prefetch (`prefetch`) and peak FLOP/s for MFU (`flops`)."""

from zoo.callable_module import make_callable

make_callable(__name__, "zoo.api.training:train")
