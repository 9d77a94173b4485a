"""Where a run's params start when they are not fresh: another run's (`init_from`: every param whose path
and shape match is copied, a new head or LoRA adapters start fresh), and, for a run that trains only part
of its model, the frozen half read whole from that run, at the step it started from (base.json), quantized
as the model config says and laid out as the state's shardings."""

from __future__ import annotations

import flax.linen as nn
import jax

from zoo.errors import ConfigError
from zoo.training import freeze, runs, sharding
from zoo.training.step import TrainState


def _base_params(s, source: str, step: int | None = None) -> tuple[int, dict]:
    """(the step read, path -> array on the host) of the params of run `source` (a LoRA run's merged into its
    plain model's): the newest step that restores, or `step`."""
    # Its config and params from one step (the config says how to read the params: LoRA, a frozen base).
    step, other, params = runs.load_weights(source, sharding.replicated(s.mesh), step)
    if other.model.family != s.cfg.model.family:
        raise ConfigError(f"init_from={source!r} holds a {other.model.family} model; this config trains "
                          f"a {s.cfg.model.family} model")
    return step, freeze.flat(jax.device_get(params))


def init_from(s, state: TrainState, source: str) -> TrainState:
    """Copy every param of run `source` whose path and shape match this model's; the rest stay fresh (a
    new head, LoRA adapters). The frozen part (when not everything trains) comes from `source` whole."""
    return start_from(s, state, source)[0]


def start_from(s, state: TrainState, source: str) -> tuple[TrainState, int]:
    """init_from, and the step of `source` it read."""
    base_step, theirs = _base_params(s, source)
    copied = []

    def pick(path, mine):
        key = "/".join(str(getattr(k, "key", k)) for k in path)
        if key not in theirs:
            return mine
        if theirs[key].shape != mine.shape:
            raise ConfigError(f"init_from={source!r}: param {jax.tree_util.keystr(path)} has shape {theirs[key].shape} there "
                              f"but {mine.shape} here (model width or size differs)")
        copied.append(key)
        return jax.device_put(theirs[key].astype(mine.dtype), mine.sharding)
    params = jax.tree_util.tree_map_with_path(pick, state.params)
    if not copied and not state.frozen:
        raise ConfigError(f"init_from={source!r}: no parameter matches this model")
    return state.replace(params=params, frozen=_frozen(s, state.params, theirs)), base_step


def _frozen(s, params, theirs: dict):
    """The frozen half of the state from the base's params `theirs` (path -> array): quantized as the model
    config says and laid out as the state's shardings."""
    if s.trainable is None:
        return {}
    abstract = freeze.split(nn.unbox(s.abstract_params), s.trainable)[1]
    frozen = {}
    for key, a in freeze.flat(abstract).items():
        if key not in theirs or theirs[key].shape != a.shape:
            raise ConfigError(f"init_from={s.cfg.init_from!r} has no param {key} of shape {a.shape}, which this "
                              f"run keeps frozen")
        frozen[key] = theirs[key].astype(a.dtype)
    frozen = freeze.quantize_frozen(freeze.unflat(frozen), params, s.cfg.model.quantize_base, s.cfg.model.scan_layers)
    return jax.device_put(frozen, s.state_shardings.frozen)


def load_frozen(s, state: TrainState, workdir: str) -> TrainState:
    """A restored state's frozen half, read again from its init_from run at the step the run started from
    (checkpoints hold what trains)."""
    if s.trainable is None:
        return state
    abstract = freeze.flat(freeze.split(nn.unbox(s.abstract_params), s.trainable)[1])
    theirs = runs.base_weights(workdir, s.cfg, abstract, sharding.replicated(s.mesh))[2]
    return state.replace(frozen=_frozen(s, state.params, {k: v for k, v in jax.device_get(theirs).items()}))
