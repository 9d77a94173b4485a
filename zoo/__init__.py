"""zoo: a JAX/Flax model zoo of transformer language models (GPT, BERT, encoder-decoder) on one training loop.

    import zoo
    lm = zoo.load("runs/x")                      # a zoo run, a Hugging Face directory, a .gguf file, a PEFT
                                                 # adapter or a preset name -> zoo.Pretrained
    lm.generate(["The", "Once"], max_new_tokens=20)
    lm.chat("What is the capital of France?")
    lm.logprobs("some text"), lm.loss(["a", "b"])
    loss, metrics = lm.loss_fn(lm.params, lm.batch(texts))        # pure: jax.grad, jax.jit, your optax loop
    run = zoo.train("gpt_tiny", workdir="runs/y", overrides={"train.steps": 100})
    zoo.compile_for("gpt2_small", "v5e-8")       # its train step compiled for a TPU slice: fits? FLOPs, step time
    lm.save("out/hf", format="hf")

Every name below is imported on first use, so `import zoo` imports neither jax nor flax. Errors are the
typed exceptions of zoo.errors, each one line naming the culprit.
"""

from __future__ import annotations

import importlib
import sys

from zoo import errors, runtime

# libtpu (the `tpu` and test extras) prints its start-up lines on every jax start of a host without a TPU; set before
# any jax import of a zoo process (a command, a bench worker, a library user's script), jax-free (zoo.runtime).
runtime.quiet_libtpu()

__all__ = ["load", "Pretrained", "train", "config", "Run", "from_pretrained", "compile_for", "errors"]

# name -> "module:attribute" (or a module), imported when first asked for (PEP 562). zoo.train and zoo.config are
# plain functions (zoo.api.training); the trainer's package is zoo.training and Config's module zoo.configuration.
_LAZY = {"load": "zoo.api.load:load", "Pretrained": "zoo.api.pretrained:Pretrained", "Run": "zoo.api.training:Run",
         "train": "zoo.api.training:train", "config": "zoo.api.training:config", "compile_for": "zoo.aot.train:compile_for"}


def __getattr__(name: str):
    if name in _LAZY:
        if "jax" not in sys.modules:  # these names import jax: XLA's C++ log level is read then (zoo.runtime)
            runtime.quiet_xla()
        module, _, attr = _LAZY[name].partition(":")
        value = importlib.import_module(module)
        value = getattr(value, attr) if attr else value
        globals()[name] = value
        return value
    raise AttributeError(f"module 'zoo' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))


def from_pretrained(path: str):
    """zoo.load(path) (the name zoo had first): a Pretrained, which also unpacks as the old tuple
    `model, params, tokenizer, config = zoo.from_pretrained(path)`."""
    return __getattr__("load")(path)
