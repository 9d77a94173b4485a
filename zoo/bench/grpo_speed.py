"""The `grpo_train` workload's zoo side: the whole GRPO step of zoo's trainer (sampling, reward, train step), and
the in-loop sampler beside zoo.load(...).generate on the same rows; `grpo_final`, the throughput both sides report
(the peer, TRL's GRPOTrainer: zoo.bench.grpo_peer).

Counted the same way on both sides: tokens_per_s is the completion tokens sampled a step (B prompts x G x new,
no completion ending early) over the whole step's seconds; train_tokens_per_s the positions of the rows trained
(B x G rows of prompt + completion); decode_tokens_per_s the sampler's own rate (the same tokens over the seconds
the step spent sampling); gen_frac and reward_frac those shares of the step.
"""

from __future__ import annotations

import time

from zoo.bench.common import calibrate, grpo_final, timed_round
from zoo.bench.model_report import apply_preset, compute_dtype, device_peak_memory_mb, settings, versions_and_fallbacks


class IdWords:
    """grpo_train's tokenizer on zoo's side: ids written as words ("17 4 903"), the end-of-text id V just outside
    the V ids the sampler draws from (vocab_limit), so that no completion ends before max_completion_tokens."""

    def __init__(self, vocab_size: int):
        self.n_vocab = self.eot_token = vocab_size

    def decode(self, ids) -> str:
        return " ".join(str(int(i)) for i in ids)

    def encode_with_offsets(self, text):  # no special tokens read from text (zoo.infer.sample.stop_ids)
        raise NotImplementedError


class ZooGrpo:
    """grpo_train: zoo's whole GRPO step as the trainer's loop runs it (zoo.tasks.rl): the task's rollout on the
    current params (G completions of each of the spec's prompts by the in-loop sampler, GrpoTask.complete; the
    reward; the training rows), then the jitted train step (policy and reference, the base with the adapters off),
    waited for before the next rollout as the loop's next rollout waits for its params. The rollout's sampler and
    reward are timed where it calls them. Each round then times that sampler alone beside zoo.load(...).generate's
    (zoo.api.decoder.generate_ids: the loaded run's scanned decoder, made once) on the same B x G rows, seed and
    temperature: the first on the current params, the second on the base it loaded."""

    def __init__(self, spec):
        import dataclasses
        import jax
        import zoo
        from zoo.bench.model_report import frozen_base
        from zoo.overrides import apply_overrides, load_config_file
        from zoo.tasks.base import Data
        from zoo.tasks.rl import PromptSet
        from zoo.training import trainer
        self.jax, self.to_device, g = jax, trainer.to_device, spec["grpo"]
        cfg = load_config_file(spec["config"])
        over = [o for o in spec["overrides"] if not o.startswith("preset=")]
        cfg = apply_overrides(cfg, over + [f"model.dtype={compute_dtype(spec, jax)}", "train.steps=1000000"])
        cfg = apply_preset(cfg, spec)
        tok, ids = IdWords(cfg.model.vocab_size), [list(p) for p in g["prompts"]]
        pool = PromptSet(ids, [tok.decode(p) for p in ids], {}, list(range(len(ids))))
        self.data = Data(train=None, eval=[], tokenizer=tok, examples={"train": pool})
        with frozen_base(cfg) as cfg:
            self.s = trainer.setup(cfg)
            self.state = trainer.init_from(self.s, self.s.init_state(jax.random.PRNGKey(0)), cfg.init_from)
            self.lm = dataclasses.replace(zoo.load(cfg.init_from), tokenizer=tok)
        self.task, self.step, self.cfg = self.s.task, self.s.jit_train_step(), cfg
        self.rows = [p for p in ids for _ in range(g["G"])]  # what the rollout samples: each prompt G times
        self.index = list(range(len(ids)))
        grpo = getattr(self.task, "inner", self.task)  # a LoRA run's task wraps GrpoTask (zoo.tasks.adapted)
        for name in ("complete", "score"):  # the rollout's sampler and reward, timed where it calls them
            setattr(grpo, name, self._timed(name, getattr(grpo, name)))
        self.i, self.times, self.spent = 0, [], {}
        t = time.perf_counter()
        loop, load, _, _ = self._sample_alone()  # compiles both; on the base (adapters at zero) the same tokens
        self.same_tokens, sampler_compile_s = loop == load, time.perf_counter() - t
        compile_s, self.k = calibrate(self._steps)
        self.compile_s = sampler_compile_s + compile_s
        self.n_trainable = sum(x.size for x in jax.tree.leaves(self.state.params))
        self.settings, self.device = settings(cfg.model), jax.devices()[0]

    def _timed(self, name, fn):
        def call(*args, **kw):
            t = time.perf_counter()
            out = fn(*args, **kw)
            self.spent[f"{name}_s"] = self.spent.get(f"{name}_s", 0.0) + time.perf_counter() - t
            if name == "complete":  # the tokens each row sampled (cut at an end-of-text, which never comes here)
                self.spent["completion_tokens"] = self.spent.get("completion_tokens", 0) + sum(map(len, out[0]))
            return out
        return call

    def _steps(self, n):
        for _ in range(n):
            batch, self.host = self.task.rollout(self.s.full_params(self.state), {"index": self.index}, self.i,
                                                 self.data)
            self.state, self.m = self.step(self.state, self.to_device(batch, self.s.mesh))
            self.jax.block_until_ready(self.state)
            self.i += 1

    def _sample_alone(self):
        """(in-loop completions, zoo.load's, seconds of each) of self.rows at the rollout's temperature."""
        from zoo.api.decoder import generate_ids
        g = self.cfg.grpo
        t = time.perf_counter()
        loop, _, _ = self.task.complete(self.s.full_params(self.state), self.rows, self.lm.tokenizer, seed=self.i,
                                        temperature=g.temperature)
        t1 = time.perf_counter()
        load = generate_ids(self.lm, self.rows, max_new_tokens=g.max_completion_tokens, temperature=g.temperature,
                            seed=self.i)
        return loop, load, t1 - t, time.perf_counter() - t1

    def ready(self):
        return {"device_kind": self.device.device_kind, "device_count": 1, "compile_s": self.compile_s,
                "peak_flops": None, "settings": self.settings, "trainable_params": self.n_trainable,
                **versions_and_fallbacks()}

    def profile(self, path):
        with self.jax.profiler.trace(path):
            self._steps(2)

    def round(self):
        r = timed_round(self)
        self.spent = {}
        _, _, r["in_loop_sample_s"], r["load_generate_s"] = self._sample_alone()
        self.times.append(r)
        return r

    def final(self, since: int = 0):
        extra = {"peak_memory_mb": device_peak_memory_mb(self.device), "in_loop_same_tokens": self.same_tokens,
                 "reward_mean": self.host["reward_sum"] / self.host["completions"]}  # the last step's
        return grpo_final(self.times[since:], len(self.rows), float(self.m["tokens"]), extra)
