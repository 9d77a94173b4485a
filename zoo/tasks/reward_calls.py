"""Reward functions as task=grpo calls them (zoo.tasks.rl): grpo.rewards loaded (MODULE:FUNCTION or FILE.py:FUNCTION)
and weighted, each called outside jit with TRL's signature and its values checked, whatever a user's code does
(raises, exits, returns a string or NaN) said in one line naming the function and the source's row.
"""

from __future__ import annotations

import importlib
import importlib.util
import math
import numbers
import os
import warnings

import numpy as np

from zoo.errors import ConfigError, TrainError


def load_rewards(rcfg) -> list[tuple[str, object]]:
    """[(name, function)] of grpo.rewards: MODULE:FUNCTION or FILE.py:FUNCTION, each found and callable."""
    out = []
    for ref in (r.strip() for r in rcfg.rewards.split(",") if r.strip()):
        where, _, name = ref.rpartition(":")
        if not where or not name:
            raise ConfigError(f"grpo.rewards entry {ref!r} must be MODULE:FUNCTION or FILE.py:FUNCTION")
        try:
            if where.endswith(".py"):
                path = os.path.expanduser(where)
                spec = importlib.util.spec_from_file_location(f"zoo_reward_{os.path.basename(path)[:-3]}", path)
                if spec is None or not os.path.isfile(path):
                    raise FileNotFoundError(path)
                module = importlib.util.module_from_spec(spec)
                spec.loader.exec_module(module)
            else:
                module = importlib.import_module(where)
        except KeyboardInterrupt:
            raise
        except BaseException as e:  # noqa: BLE001 - a user's file: whatever it raised (sys.exit too), in one line
            raise ConfigError(f"grpo.rewards: {where!r} does not load (it {_did(e)} at import)") from None
        fn = getattr(module, name, None)
        if not callable(fn):
            raise ConfigError(f"grpo.rewards: {where!r} has no function {name!r}")
        out.append((name, fn))
    return out


def weights_of(rcfg, n: int) -> np.ndarray:
    return np.asarray([float(w) for w in rcfg.reward_weights.split(",")] if rcfg.reward_weights else [1.0] * n,
                      np.float32)


class RewardInterrupt(KeyboardInterrupt):
    """A KeyboardInterrupt raised in a reward function: the run stops as on Ctrl-C (a checkpoint, one line naming
    the reward), not with a traceback."""


def call_reward(name: str, fn, prompts, completions, columns: dict, where: list[int]) -> np.ndarray:
    """float64[len(completions)] of one reward function, checked. What it raised (an exception, sys.exit) names the
    first prompt (row of the source) whose completion raises it; a KeyboardInterrupt stops the run (RewardInterrupt).
    Its values must be real numbers that fit a float32 (bool, int, float, or a numpy / jax / torch scalar; a bool is
    0 or 1, as TRL's torch.tensor takes it), one per completion: a string ("1.0", or "1111" read as four characters),
    None, NaN/Inf or a value beyond float32's range is refused in one line naming the function and the row."""
    try:
        got = fn(prompts, completions, **columns)
    except KeyboardInterrupt:
        raise RewardInterrupt(f"a KeyboardInterrupt in reward {name}") from None
    except BaseException as e:  # noqa: BLE001 - the user's code: find which prompt, say it in one line
        for i in range(len(completions)):
            try:
                fn(prompts[i:i + 1], completions[i:i + 1], **{k: v[i:i + 1] for k, v in columns.items()})
            except KeyboardInterrupt:
                raise RewardInterrupt(f"a KeyboardInterrupt in reward {name}") from None
            except BaseException as e1:  # noqa: BLE001
                raise TrainError(f"reward {name} {_did(e1)} on row {where[i]} of the source "
                                 f"(its prompt {_short(prompts[i])})") from None
        raise TrainError(f"reward {name} {_did(e)} on the batch") from None
    if isinstance(got, (str, bytes, dict)) or not hasattr(got, "__iter__"):
        raise TrainError(f"reward {name} returned {type(got).__name__} {_short(got)}, not a list of numbers (one per "
                         f"completion)")
    got = list(got)
    if len(got) != len(completions):
        raise TrainError(f"reward {name} returned {len(got)} values for {len(completions)} completions")
    values = np.zeros(len(got), np.float64)
    for i, v in enumerate(got):
        number = _real(v)
        if number is None:
            raise TrainError(f"reward {name} returned {_short(v)} ({type(v).__name__}) for row {where[i]} of the "
                             f"source; a reward must be a number (bool, int or float)")
        if not math.isfinite(number) or abs(number) > F32_MAX:
            raise TrainError(f"reward {name} returned {number:g} for row {where[i]} of the source; a reward must be a "
                             f"finite number within float32's range (|r| <= {F32_MAX:.3g})")
        values[i] = number
    return values


F32_MAX = float(np.finfo(np.float32).max)


def _real(v) -> float | None:
    """v as a float if it is a real number (bool, int, float, a 0-d numpy / jax / torch number), else None: no
    string is parsed, no complex number or array taken."""
    if isinstance(v, (str, bytes)) or (isinstance(v, numbers.Complex) and not isinstance(v, numbers.Real)):
        return None
    if not isinstance(v, (numbers.Real, np.bool_)) and not (hasattr(type(v), "__float__") and
                                                           getattr(v, "shape", ()) == ()):
        return None
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("error")  # a complex array scalar's ComplexWarning
            return float(v)
    except OverflowError:  # an int past float64's range
        return math.inf
    except (TypeError, ValueError, Warning):
        return None


def _did(e: BaseException) -> str:
    """What a user's code did, as a line says it: "called sys.exit(3)", "raised KeyError: 'answer'"."""
    if isinstance(e, SystemExit):
        return f"called sys.exit({e.code!r})"
    return f"raised {type(e).__name__}: {e}"


def _short(value, n: int = 60) -> str:
    text = repr(value)
    return text if len(text) <= n else text[:n - 3] + "..."
