"""What the processes of a multi-process run (zoo.distributed) settle outside the collectives: a step that
process 0 takes alone (the workdir lock, building the token store) and the others wait for. Its verdict goes
through the coordination service's key-value store, so a refusal on process 0 ends every process with the same
one-line error instead of leaving the others waiting in the first collective. With one process, nothing."""

from __future__ import annotations

import itertools

import jax

from zoo.errors import TrainError

WAIT_MS = 24 * 3600 * 1000  # building a token store can take hours; a lost process 0 is caught by the heartbeat
_serial = itertools.count()


def _client():
    from jax._src import distributed
    return distributed.global_state.client


def several() -> bool:
    return jax.process_count() > 1 and _client() is not None


def key(name: str) -> str:
    """A key unique to this call on every process (each process makes the same calls in the same order)."""
    return f"zoo/{name}/{next(_serial)}"


def tell(k: str, error: BaseException | None) -> None:
    """Process 0: publish the verdict of `k` (None: went well)."""
    if several() and jax.process_index() == 0:
        _client().key_value_set(k, "ok" if error is None else f"{type(error).__name__}: {error}")


def wait(k: str, what: str) -> None:
    """Processes other than 0: wait for process 0's verdict of `k`; its error is raised here too, in one line."""
    if not several() or jax.process_index() == 0:
        return
    try:
        verdict = _client().blocking_key_value_get(k, WAIT_MS)
    except Exception as e:
        raise TrainError(f"process {jax.process_index()} got no word from process 0 on {what} "
                         f"({str(e).strip().splitlines()[0][:200] if str(e).strip() else type(e).__name__})") from None
    if verdict != "ok":
        raise TrainError(f"process 0 stopped on {what}: {verdict}")


STOP = "zoo/stop"


def stop_step(proposed: int | None) -> int | None:
    """The step every process stops after, once one of them was signalled: the first proposal stands (`proposed`:
    this process's, a few steps ahead of where it is; None: only look)."""
    client = _client()
    if proposed is not None:
        try:
            client.key_value_set(STOP, str(proposed))
        except Exception:  # another process proposed first: its step stands
            pass
    try:
        return int(client.key_value_try_get(STOP))
    except Exception:  # not proposed yet
        return None


def share(items: list) -> list:
    """This process's share of `items` (every process_count-th from its index; all of them with one process)."""
    return items[jax.process_index()::jax.process_count()]


def gather(name: str, value: dict) -> list[dict] | None:
    """Every process's `value` (JSON), in process order, on process 0; None on the others. With one process:
    [value]. For sums a command adds up once (zoo-eval's log-likelihoods: exact float64, unlike a collective
    of float32 arrays)."""
    import json
    if not several():
        return [value]
    k, me = key(name), jax.process_index()
    _client().key_value_set(f"{k}/{me}", json.dumps(value))
    if me != 0:
        return None
    try:
        return [json.loads(_client().blocking_key_value_get(f"{k}/{p}", WAIT_MS)) for p in range(jax.process_count())]
    except Exception as e:
        raise TrainError(f"process 0 got no {name} from every process ({str(e).strip()[:200] or type(e).__name__})") \
            from None
