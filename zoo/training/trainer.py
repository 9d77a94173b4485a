"""The one training loop: setup (task, mesh, optimizer, shardings), init or restore, steps, evaluation,
checkpoints, logging. Its parts live beside it: the evaluation pass in zoo.training.evaluation, an interval's record
and the console lines in zoo.training.records, SIGTERM/Ctrl-C in zoo.training.stops, the workdir's lock and checks in
zoo.training.workdir_claim, and the errors a run ends with (a blow-up, a full disk) in zoo.training.run_errors. Names
other modules read from here (to_device, eval_line, stops_at_once, disk_failure, ...) are imported here too.

The host stays at most one step ahead of the device: after dispatching step n it waits for step n - 1,
so at most 2 steps are ever dispatched and unfinished, the progress bar counts finished steps, and a
stop (SIGTERM, Ctrl-C, stop_at_step) saves within about one step of the request. The device still
always has the next step queued. Process 0 prints a line per evaluation (step, train and eval loss,
the task's metrics, tokens/s) unless quiet; the bar shows only on a terminal.

The trainer knows a Task (model + loss + data) and never which family it is. State is created
already sharded (eval_shape of the boxed state -> logical axes -> jit with out_shardings); the step
(zoo.training.step) is jitted once over the mesh with the state donated; batches are laid out over the
`data`/`fsdp` axes.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import math
import os
import sys
import time
from typing import Any

import flax.linen as nn
import jax
from tqdm.auto import tqdm

from zoo import tasks
from zoo.tasks import distill
from zoo.configuration import Config
from zoo.errors import ConfigError, TrainError
from zoo.runtime import is_terminal as _is_terminal  # (the tests replace it: a bar under pytest)
from zoo.eval import during
from zoo.training import (checkpoint, data_state, flops, freeze, memory, optim, orbax_errors, peers, programs,
                          run_once, runs, sharding)
from zoo.training.evaluation import evaluate, to_device
from zoo.training import objective_watch
from zoo.training.guard import Guard
from zoo.training.metrics import MetricsWriter
from zoo.training.prefetch import Prefetcher
from zoo.training.records import eval_line, summarise
from zoo.training.run_errors import DISK_ERRNOS, disk_failure, diverged
from zoo.training.first_step import compile_ahead, time_left
from zoo.training.sizing import size_warning, steps_of_epochs
from zoo.training.stops import Stopped, Stopper, stops_at_once  # noqa: F401 (Stopped, stops_at_once: read from here)
from zoo.training.workdir import own_tokenizer, remove_new
from zoo.training.workdir_claim import check_workdir, claimed
from zoo.training.start import init_from, load_frozen, start_from  # noqa: F401 (init_from: the API tests call)
from zoo.training.step import TrainState, make_eval_step, make_train_step, state_init


@dataclasses.dataclass
class Setup:
    """Everything derived from a config before the first step: task, mesh, optimizer, shardings."""
    cfg: Config
    task: Any
    mesh: Any
    tx: Any
    schedule: Any
    abstract_params: Any  # boxed (logical names attached)
    state_shardings: Any
    abstract_state: Any  # ShapeDtypeStructs with shardings, for restore
    init_fn: Any  # rng -> TrainState (unsharded function; init_state jits it sharded)
    trainable: Any = None  # the param paths that train (zoo.training.freeze); None: all
    # name -> jitted or compiled program: shared by the setups of one config in this process (zoo.training.programs)
    programs: dict = dataclasses.field(default_factory=dict)

    def full_params(self, state: TrainState):
        """The model's whole param tree: what trains joined with what is frozen."""
        return freeze.join(state.params, state.frozen)

    def init_state(self, rng) -> TrainState:
        return programs.once(self.programs, "init", lambda: run_once.jit(
            self.init_fn, self.mesh.devices.flat[0].platform, out_shardings=self.state_shardings))(rng)

    def jit_train_step(self):
        """train_step jitted once over the mesh: state sharded as initialised and donated, batch over data."""
        return programs.once(self.programs, "train", lambda: jax.jit(
            make_train_step(self.task, self.tx, self.schedule, self.cfg.train.grad_accum),
            in_shardings=(self.state_shardings, sharding.batch_sharding(self.mesh)),
            out_shardings=(self.state_shardings, sharding.replicated(self.mesh)), donate_argnums=0))

    def jit_eval_step(self):
        return programs.once(self.programs, "eval", lambda: jax.jit(make_eval_step(self.task)))


def setup(cfg: Config, devices=None, *, abstract_base: bool = False) -> Setup:
    """`abstract_base`: a LoRA or partial run without init_from takes its own model's shapes as the base's (a
    step compiled for another machine and never run, zoo.aot)."""
    task = tasks.build(cfg)
    mesh = sharding.make_mesh(cfg.mesh, devices)
    key = programs.key_of(cfg, mesh, abstract_base, task)
    kept = programs.get(key)
    if kept is not None:  # this config ran in this process: its programs, with this run's own task
        return dataclasses.replace(kept, cfg=cfg, task=task)
    platform = mesh.devices.flat[0].platform
    if getattr(cfg.model, "attention_impl", None) == "cudnn" and platform not in ("gpu", "cuda"):
        raise ConfigError(f"model.attention_impl='cudnn' needs an NVIDIA GPU; this run's devices are {platform}; "
                          f"use auto (einsum on CPU, cuDNN on a GPU), xla or einsum")
    dp = sharding.data_parallel_size(mesh)
    micro = cfg.train.batch_size // cfg.train.grad_accum
    if micro % dp:
        raise ConfigError(f"train.batch_size={cfg.train.batch_size} (per microbatch {micro}) is not divisible "
                          f"by the data-parallel size mesh.data*mesh.fsdp{'*mesh.expert' * (mesh.shape['expert'] > 1)}"
                          f"={dp}")
    rng = jax.random.PRNGKey(cfg.train.seed)
    abstract_params = jax.eval_shape(task.init, rng)
    base = runs.base_of(cfg)  # the init_from run's shapes: what stays frozen, what is new to it
    trainable = freeze.trainable_paths(cfg, abstract_params, getattr(task, "seen", ()), base, abstract_base)
    schedule = optim.make_schedule(cfg.optim, cfg.train.steps, cfg.model.d_model)
    trains = freeze.split(abstract_params, trainable)[0]
    tx = optim.make_optimizer(cfg.optim, schedule, optim.decay_mask(trains), optim.new_mask(trains, base),
                              boxed=trains)
    boxed_init = state_init(task, tx, trainable, cfg.model.quantize_base, cfg.model.scan_layers)
    # The optimizer state is made from boxed params, so its moments carry the params' logical axis names
    # and one rule table gives every leaf of the state its sharding.
    boxed = jax.eval_shape(boxed_init, rng)
    state_sh = sharding.shardings(boxed, mesh)
    abstract_state = jax.tree.map(lambda a, sh: jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=sh),
                                  nn.unbox(boxed), state_sh)
    init_fn = lambda r: nn.unbox(boxed_init(r))  # noqa: E731
    s = Setup(cfg, task, mesh, tx, schedule, abstract_params, state_sh, abstract_state, init_fn, trainable)
    programs.keep(key, dataclasses.replace(s))  # a copy: this run may change its own (s.cfg)
    return s


def train(cfg: Config, path: str, *, resume: bool = False, stop_at_step: int | None = None,
          devices=None, progress: bool = True, quiet: bool = False, resume_step: int | None = None,
          config_of=None, teacher_of=None) -> dict:
    """Train `cfg` in workdir `path` (a fresh run, or the continuation of the newest checkpoint that restores
    when resume). The workdir is locked for the run; nothing in it changes until the state is restored.

    `resume_step` resumes from that checkpoint, not the newest (newer ones are moved aside, kept).
    `config_of(step)`, given, is the config of a run resumed from `step` (its saved config with the command's
    overrides): when the step that restores is older than the one `cfg` was read from, the run goes on under it.
    `teacher_of` reads a distilled run's teacher (zoo.load, which zoo.train hands down: zoo.tasks.distill).
    `stop_at_step` stops (and checkpoints) early as if interrupted. `progress` shows a progress bar
    (only when stdout and stderr are a terminal); `quiet` shows neither the bar nor the line printed
    after each evaluation. Returns the final state, the last eval metrics, the data's tokenizer and the
    setup.
    """
    try:
        return _train(cfg, path, resume, stop_at_step, devices, progress, quiet, resume_step, config_of, teacher_of)
    except OSError as e:
        if e.errno not in DISK_ERRNOS:
            raise
        raise disk_failure(e, path) from None


def _train(cfg, path, resume, stop_at_step, devices, progress, quiet, resume_step, config_of, teacher_of) -> dict:
    main, asked = jax.process_index() == 0, cfg
    built = peers.key("data")
    with claimed(path, main, lambda: check_workdir(path, resume)) as created:
        try:
            cfg = tasks.check_data(cfg)  # the source, columns and labels, before any model is built
            if resume and freeze.partial(cfg) and cfg.init_from:  # the base gone or changed: said first, once
                runs.check_base(path, cfg)
            s = setup(cfg, devices)
            if resume:
                start, state = checkpoint.restore_latest(path, s.abstract_state, resume_step)
                if config_of is not None and config_of(start) != asked:
                    # The newest config was read first, but its step did not restore and an older one did: go
                    # on under that step's own config (a resumed run's steps may hold different ones).
                    cfg = tasks.check_data(config_of(start))
                    s = setup(cfg, devices)
                    with checkpoint.manager(path, read_only=True) as m:
                        state = checkpoint.restore(m, start, s.abstract_state, path)
                state = load_frozen(s, state, path)
                if start >= cfg.train.steps:
                    raise TrainError(f"the run in {path!r} is at step {start} and train.steps={cfg.train.steps}: "
                                     f"nothing to train; continue it with --set train.steps=N for some N > {start}")
            else:
                state = s.init_state(jax.random.PRNGKey(cfg.train.seed))
                if cfg.init_from:
                    state, base_step = start_from(s, state, cfg.init_from)
            # The token store is built once, by process 0; the others open it (a shared data.cache_dir).
            peers.wait(built, "building the token store")
            s.task.prepare_data(lambda: s.full_params(state), path, resume)  # e.g. sft's replay of the base's answers
            data = s.task.make_data(cfg, jax.process_index(), jax.process_count())
            if cfg.train.epochs and not resume:  # train.steps from the data's rows; the state fits either schedule
                cfg = steps_of_epochs(cfg, data.rows, main, data.packed_examples)
                s = setup(cfg, devices)
            state = distill.attach(s, state, teacher_of)  # a distilled run's teacher, loaded from its source (never checkpointed)
            peers.tell(built, None)
        except BaseException as e:
            peers.tell(built, e)
            if created:  # a config, data or restore error: no empty workdir left behind
                remove_new(path)
            raise
        # Only now, with the state restored, does the run's directory change.
        if not resume:
            cfg = own_tokenizer(cfg, path, write=main)
            s.cfg = cfg
        if main:
            with open(os.path.join(path, "config.json"), "w") as f:
                f.write(json.dumps(checkpoint.portable(cfg.to_dict(), path), indent=2, sort_keys=True))
            if s.trainable is not None and not resume:  # what the frozen half is: readers load the same step
                runs.write_base(path, cfg.init_from, base_step)
            for name, text in data.files.items():  # what the task keeps beside the run, e.g. labels.json
                with open(os.path.join(path, name), "w") as f:
                    f.write(text)
        s.task.prepare(s.full_params(state), data, path, resume, s.mesh)  # e.g. dpo's reference log-probabilities
        mngr = checkpoint.manager(path, keep=cfg.train.keep)
        if resume:
            checkpoint.prune(mngr, cfg.train.keep)
        try:
            with orbax_errors.held(), sharding.kernels_mesh(s.mesh):
                return _loop(cfg, path, s, state, data, mngr, stop_at_step, progress, quiet)
        except orbax_errors.SaveError as e:
            raise TrainError(f"{e}; the run stopped (free space or fix permissions, then --resume {path})") from None
        except OSError:  # a write of the run failed (zoo.training.run_errors.DISK_ERRNOS): Orbax's saves end first
            with contextlib.suppress(Exception), orbax_errors.held():
                checkpoint.finish(mngr)
            raise


def _loop(cfg: Config, workdir: str, s: Setup, state, data, mngr, stop_at_step, progress, quiet) -> dict:
    main = jax.process_index() == 0
    step_fn = s.jit_train_step()
    eval_fn = s.jit_eval_step()
    perplexity = getattr(s.task, "PERPLEXITY", True)
    if cfg.train.eval_sets and jax.process_count() > 1:
        raise ConfigError("train.eval_sets runs on one process for now; score the checkpoints with zoo-eval, which "
                          "runs on several")
    eval_sets = during.load(cfg)  # read and checked before the first step
    start = int(jax.device_get(state.step))
    # Records after `start` belong to a run that got further than its last checkpoint: dropped.
    writer = MetricsWriter(workdir, enabled=main, start_step=start)
    try:
        flops_per_token = freeze.flops_per_token(s.task, cfg.data.seq_len, s.abstract_params, s.trainable)
        peak = flops.total_peak(s.mesh.devices.flatten().tolist())
        local_devices = [d for d in s.mesh.devices.flatten().tolist() if d.process_index == jax.process_index()]
        last = cfg.train.steps if stop_at_step is None else min(stop_at_step, cfg.train.steps)
        bar = tqdm(total=cfg.train.steps, initial=start, dynamic_ncols=True,
                   disable=not (main and progress and not quiet and _is_terminal()))

        def say(line: str) -> None:  # a console line (process 0, unless quiet) that does not break the bar
            if not main or quiet:
                return
            if bar.disable:
                print(line, flush=True)
            else:
                tqdm.write(line)

        buffered, eval_metrics, t0, t0_step, compile_s, pace = [], {}, time.perf_counter(), start, None, None
        pending, compiled_at = None, None  # metrics of the newest step (may still run); when compile_ahead ended
        run_fn = step_fn  # the step compiled for the first batch's shapes (compile_ahead), once it is
        warn = optim.warmup_warning(cfg.optim, cfg.train.steps)
        if warn and main and start < last:  # said once, as training starts
            print(warn, file=sys.stderr, flush=True)
        size = size_warning(cfg, data.rows) if start == 0 else None
        if size and main and start < last:
            print(size, file=sys.stderr, flush=True)
        guard = Guard(cfg.train.spike_guard, math.log(cfg.model.vocab_size)
                      if getattr(s.task, "UNIFORM_OVER_VOCAB", False) else None)
        watch = objective_watch.of(s.task, main)  # reward, KL, chosen log-prob: warned (stderr), the best reward kept
        data_state.restore(data.train, workdir, start)
        # A task that samples its batch from the current params (grpo) gets its step's input on the host and rolls it
        # out first (zoo.tasks.rl): generation waits for the step before, so nothing of it is prefetched but the input.
        rollout = getattr(s.task, "rollout", None)
        make = (lambda i: data.train(i)) if rollout else (lambda i: to_device(data.train(i), s.mesh))
        prefetch = Prefetcher(make, start, last)
        host_metrics: dict = {}  # step -> what a rollout measured on the host
        with prefetch as batches, Stopper() as stopper:
            step = start
            while step < last and not stopper.stop(step):
                batch = batches.get(step)
                if rollout is not None:
                    try:
                        batch, host_metrics[step + 1] = rollout(s.full_params(state), batch, step, data)
                    except KeyboardInterrupt as e:  # raised in a reward: the run stops here, as on Ctrl-C
                        stopper.interrupted(e)
                        break
                    batch = to_device(batch, s.mesh)
                if compile_s is None and run_fn is step_fn:  # compiled ahead, to say what compiled and its cost
                    run_fn = compile_ahead(step_fn, state, batch, cfg, say, s.programs)
                    compiled_at = time.perf_counter() if run_fn is not step_fn and rollout is None else None
                try:
                    state, m = run_fn(state, batch)
                except TypeError:  # a batch unlike the first (no task's yet): the jitted step compiles for it
                    if run_fn is step_fn:
                        raise
                    run_fn = step_fn
                    state, m = run_fn(state, batch)
                step += 1
                buffered.append((step, m))
                if pending is not None:  # the host runs at most one step ahead: wait for the step before
                    jax.block_until_ready(pending)
                    bar.update(1)
                pending = m
                if compile_s is None:  # the first step compiles; time throughput from the second on
                    first = jax.device_get(m)
                    compile_s, t0, t0_step = time.perf_counter() - t0, time.perf_counter(), step
                    # A step's time: the first's own when its compile was apart (no rollout), else the second's
                    pace = (t0, step) if compiled_at is None else (compiled_at, step - 1)
                    say(f"first step: loss {float(first['loss_sum']) / max(float(first['weight']), 1e-9):.4g} "
                        f"(compiled and ran in {compile_s:.1f} s)")
                if pace is not None and step == pace[1] + 1 and last > step:  # the time left, from that step
                    jax.block_until_ready(m)
                    say(time_left(time.perf_counter() - pace[0], last - step))
                    pace = None
                do_eval = cfg.train.eval_every and (step % cfg.train.eval_every == 0 or step == last)
                do_save = step % cfg.train.save_every == 0 or step == last
                if step % cfg.train.log_every == 0 or do_eval or do_save or step == last:
                    host = jax.device_get(buffered)
                    bar.update(1)
                    pending = None
                    checkpoint.check_for_errors(mngr)  # a failed asynchronous save ends the run now, not at the next
                    bad = guard.check(host)
                    if bad is not None:
                        raise diverged(*bad, workdir, mngr, guard)
                    good = guard.confirmed(mngr.all_steps())
                    if good is not None:  # kept whatever `train.keep` rotates out
                        checkpoint.mark_good(mngr, good)
                        guard.forget_before(good)
                    record = summarise(host, step, t0, t0_step, flops_per_token, peak)
                    totals = {k: sum(float(m[k]) for _, m in host) for k in host[-1][1]}
                    for k in {k for st, _ in host for k in host_metrics.get(st, {})}:
                        totals[k] = sum(host_metrics.get(st, {}).get(k, 0.0) for st, _ in host)
                    for st, _ in host:
                        host_metrics.pop(st, None)
                    record.update(s.task.train_metrics(totals))
                    watch.check(step, record, mngr)
                    record["peak_memory_mb"] = memory.peak_memory_mb(local_devices)
                    if not writer.records:
                        record["compile_s"] = compile_s
                    buffered, t0, t0_step = [], time.perf_counter(), step
                    if do_eval:
                        eval_metrics = evaluate(eval_fn, s.full_params(state), data.eval, s.mesh, s.task.eval_metrics,
                                                perplexity=perplexity)
                        try:
                            eval_metrics.update(s.task.evaluate_extra(s.full_params(state), data))
                        except KeyboardInterrupt as e:  # raised in a reward scoring the held-out prompts: this
                            stopper.interrupted(e)          # step's record is written, then the loop stops
                        if eval_sets:
                            eval_metrics.update(during.score(eval_sets, s.task.model, s.full_params(state),
                                                             data.tokenizer, cfg))
                        record.update(eval_metrics)
                    writer.write(record)
                    bar.set_postfix(loss=f"{record['loss']:.3f}", lr=f"{record['lr']:.2e}",
                                    tok_s=f"{record.get('tokens_per_s', 0):.0f}", refresh=False)
                    if do_eval:
                        say(eval_line(record))
                    elif cfg.train.epochs and bar.disable:  # a run sized in epochs (a fine-tune) is said as it goes
                        say(f"step {step} of {last}: loss {record['loss']:.4g}, lr {record['lr']:.2e}")
                    if do_save:
                        _save(mngr, state, cfg, workdir, data, step)
            if pending is not None:
                jax.block_until_ready(pending)
                bar.update(1)
            if stopper.stopped or step < cfg.train.steps:
                jax.block_until_ready(state)
                if mngr.latest_step() != step:
                    _save(mngr, state, cfg, workdir, data, step, force=True)
                if main and stopper.stopped:
                    bar.close()
                    by = stopper.why or (f"signal {stopper.signal}" if stopper.signal else
                                         "a signal to another process")
                    print(f"stopped by {by} "
                          f"at step {step}; checkpoint saved. Continue with: "
                          f"python train.py --resume {workdir}", flush=True)
        checkpoint.finish(mngr)
        watch.finish(mngr, workdir, say)
        data_state.prune(workdir, mngr.all_steps())
        bar.close()
        writer.plot()
        writer.close()
        return {"state": state, "params": s.full_params(state), "eval": eval_metrics, "tokenizer": data.tokenizer,
                "setup": s, "records": writer.records, "interrupted": stopper.stopped}
    except BaseException:
        writer.abandon()  # a failed run (a full disk) leaves nothing to flush at exit
        raise


def _save(mngr, state, cfg: Config, workdir: str, data, step: int, force: bool = False) -> None:
    data_state.save(data.train, workdir, step, mngr.all_steps())  # before the checkpoint it belongs to
    try:
        checkpoint.save(mngr, state, cfg, force=force)
    except checkpoint.NonFiniteState:
        raise diverged(int(jax.device_get(state.step)), "params or optimizer state became non-finite (NaN/Inf)",
                        False, False, workdir, mngr) from None
    except orbax_errors.SaveError:
        try:  # stop Orbax's background work; the save's own error is the one reported
            checkpoint.finish(mngr)
        except orbax_errors.SaveError:
            pass
        raise
