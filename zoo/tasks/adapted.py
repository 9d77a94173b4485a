"""A task whose model carries LoRA adapters (model.lora_rank > 0): the family's own task, with its model
initialised and applied under `zoo.nn.lora.intercept`, so every targeted Einsum layer gains its adapter
while no family module changes. Everything else (data, metrics, FLOPs of the base) is the task's own;
sampling and the task's extra evaluations run the plain model on the merged weights."""

from __future__ import annotations

from zoo.nn import lora


class AdaptedTask:
    """`inner` (any Task) with adapters of `spec`; `seen` collects the Einsum layers the model calls."""

    def __init__(self, inner, spec: lora.LoraSpec):
        self.inner, self.spec, self.seen = inner, spec, set()
        self.name, self.model, self.cfg = inner.name, inner.model, inner.cfg

    def __getattr__(self, name):  # the rest of the Task protocol: the task's own
        return getattr(self.inner, name)

    def init(self, rng):
        with lora.intercept(self.spec, False, self.seen):
            return self.inner.init(rng)

    def loss(self, params, batch, rng, train, **kw):  # kw: the teacher's params of a distilled run
        with lora.intercept(self.spec, train):
            return self.inner.loss(params, batch, rng, train, **kw)

    def prepare_data(self, params_of, workdir, resume):  # the base's answers (data.mix_source=replay): adapters merged
        return self.inner.prepare_data(lambda: lora.merge(params_of(), self.spec), workdir, resume)

    def evaluate_extra(self, params, data):
        return self.inner.evaluate_extra(lora.merge(params, self.spec), data)

    def sample(self, params, tokenizer, prompt: str, max_new_tokens: int):
        return self.inner.sample(lora.merge(params, self.spec), tokenizer, prompt, max_new_tokens)
