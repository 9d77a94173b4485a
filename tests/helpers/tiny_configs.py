"""The small configs the tests train, one builder per task: each trains a few steps in about a second
on the offline data (the built-in corpus, labelled set or word-reversal pairs), dropout on.

TINY maps each task name (and llama_lm, gpt_lm's task on the Llama-style decoder) to its builder, for
the checks written once for every task (tests/train/test_invariants.py)."""

import dataclasses
import functools

from zoo.configuration import Config, DataConfig, OptimConfig, TrainConfig
from zoo.models.bert import BERT_TINY
from zoo.models.encdec import EncDecConfig
from zoo.models.gpt import GptConfig


def gpt_lm(cache_dir):
    """A GPT small enough to train a few steps in about a second, with dropout on."""
    return Config(
        task="gpt_lm",
        model=GptConfig(vocab_size=384, max_len=64, num_layers=2, d_model=64, num_heads=4, d_ff=128, dropout=0.1),
        data=DataConfig(source="builtin", tokenizer="bytes", seq_len=32, cache_dir=cache_dir),
        optim=OptimConfig(lr=1e-3, schedule="cosine", warmup=2),
        train=TrainConfig(steps=6, batch_size=16, log_every=1, eval_every=0, save_every=3, keep=5),
    )


def llama_lm(cache_dir):
    """gpt_lm's run with the Llama switches: rope, RMSNorm, SwiGLU, 2 key/value heads for 4 query heads, no
    biases, an untied head (dropout kept on, for the rng replay checks)."""
    cfg = gpt_lm(cache_dir)
    return dataclasses.replace(cfg, model=dataclasses.replace(
        cfg.model, positions="rope", norm="rmsnorm", mlp="swiglu", num_kv_heads=2, qkv_bias=False, out_bias=False,
        mlp_bias=False, tie_embeddings=False))


BERT_MODEL = dataclasses.replace(BERT_TINY, vocab_size=264, max_len=64, num_layers=2, d_model=32, num_heads=2,
                                 d_ff=64, dropout=0.1, num_classes=4)
BERT_TRAIN = dict(steps=6, batch_size=16, log_every=1, eval_every=0, eval_batches=2, save_every=3, keep=5)


def bert(task, cache_dir, source="builtin", **data):
    """A 2-layer, width-32 BERT for bert_mlm or bert_cls (4 classes), on `source` (further data fields
    in `data`)."""
    return Config(task=task, model=BERT_MODEL,
                  data=DataConfig(**{"source": source, "tokenizer": "bytes", "seq_len": 32, "cache_dir": cache_dir,
                                     **data}),
                  optim=OptimConfig(lr=1e-3, schedule="linear", warmup=2, weight_decay=0.01),
                  train=TrainConfig(**BERT_TRAIN))


def seq2seq(cache_dir):
    """A 1+1-layer encoder-decoder on the offline task, dropout and label smoothing on."""
    return Config(
        task="seq2seq",
        model=EncDecConfig(vocab_size=264, max_len=32, num_encoder_layers=1, num_decoder_layers=1, d_model=32,
                           num_heads=4, d_ff=64, dropout=0.1, pre_ln=True),
        data=DataConfig(source="builtin", tokenizer="bytes", seq_len=16, cache_dir=cache_dir),
        optim=OptimConfig(lr=1e-3, schedule="cosine", warmup=2),
        train=TrainConfig(steps=6, batch_size=16, log_every=1, eval_every=0, save_every=3, keep=5,
                          label_smoothing=0.1),
    )


def jsonl(cache_dir, name: str, rows: list[dict]) -> str:
    """CACHE_DIR/name holding `rows` as JSON lines, written once (atomically: xdist workers share the cache)."""
    import json
    import os
    path = os.path.join(cache_dir, name)
    if not os.path.exists(path):
        tmp = f"{path}.{os.getpid()}.tmp"
        with open(tmp, "w") as f:
            f.writelines(json.dumps(r) + "\n" for r in rows)
        os.replace(tmp, path)
    return path


def preference_pairs(n: int = 48) -> list[dict]:
    """Offline preference pairs a byte-level model can learn: sums, the right one chosen over one a little off."""
    import random
    r = random.Random(0)
    out = []
    for _ in range(n):
        a, b = r.randint(1, 9), r.randint(1, 9)
        out.append({"prompt": f"{a}+{b}=", "chosen": str(a + b), "rejected": str(a + b + r.choice([-2, -1, 1, 2]))})
    return out


def dpo(cache_dir):
    """gpt_lm's model (dropout on) preference-tuned on preference_pairs (the reference precomputed: no LoRA)."""
    path = jsonl(cache_dir, "pairs.jsonl", preference_pairs())
    cfg = gpt_lm(cache_dir)
    return dataclasses.replace(cfg, task="dpo", data=dataclasses.replace(cfg.data, source=path, seq_len=16,
                                                                          val_fraction=0.2),
                               train=dataclasses.replace(cfg.train, batch_size=8, eval_every=6))


def sums(n: int = 64) -> list[dict]:
    """Offline prompts with a checkable answer: "a+b=" and the sum."""
    import random
    r = random.Random(1)
    return [{"prompt": f"{a}+{b}=", "answer": str(a + b)} for a, b in ((r.randint(1, 9), r.randint(1, 9))
                                                                       for _ in range(n))]


def grpo(cache_dir):
    """gpt_lm's model (dropout on) trained from rewards on sums' prompts: 4 prompts x 4 completions of up to 8 bytes
    a step, rewarded for digits (tests/helpers/tiny_rewards); full fine-tuning, so no KL penalty (grpo.beta=0)."""
    from zoo.configuration import RlConfig
    path = jsonl(cache_dir, "sums.jsonl", sums())
    cfg = gpt_lm(cache_dir)
    return dataclasses.replace(cfg, task="grpo", data=dataclasses.replace(cfg.data, source=path, val_fraction=0.1),
                               grpo=RlConfig(num_generations=4, max_completion_tokens=8, beta=0.0,
                                             rewards="tests.helpers.tiny_rewards:digits"),
                               train=dataclasses.replace(cfg.train, batch_size=4))


TINY = {"gpt_lm": gpt_lm, "llama_lm": llama_lm, "bert_mlm": functools.partial(bert, "bert_mlm"),
        "bert_cls": functools.partial(bert, "bert_cls"), "seq2seq": seq2seq, "dpo": dpo, "grpo": grpo}


def bert_mlm_pretrain(cache_dir, **train):
    """A width-64 BERT that learns masked-LM on the built-in corpus in 150 steps (no dropout)."""
    model = dataclasses.replace(BERT_TINY, vocab_size=264, max_len=64, num_layers=2, d_model=64, num_heads=2,
                                d_ff=128, dropout=0.0)
    return Config(task="bert_mlm", model=model,
                  data=DataConfig(source="builtin", tokenizer="bytes", seq_len=64, cache_dir=cache_dir),
                  optim=OptimConfig(lr=3e-3, schedule="linear", warmup=10, weight_decay=0.01),
                  train=TrainConfig(**{**dict(steps=150, batch_size=16, log_every=10, eval_every=150, eval_batches=4,
                                              save_every=1000), **train}))


def seq2seq_learnable(cache_dir):
    """A 2+2-layer, width-64 encoder-decoder that learns the offline task's short phrases (<= 15 bytes)."""
    return Config(
        task="seq2seq",
        model=EncDecConfig(vocab_size=264, max_len=16, num_encoder_layers=2, num_decoder_layers=2, d_model=64,
                           num_heads=4, d_ff=256, dropout=0.0, positions="sinusoidal", pre_ln=True,
                           activation="gelu", embed_scale=True),
        data=DataConfig(source="builtin", tokenizer="bytes", seq_len=16, cache_dir=cache_dir),
        optim=OptimConfig(lr=2e-3, schedule="cosine", warmup=50, weight_decay=0.01, b2=0.98),
        train=TrainConfig(steps=1600, batch_size=32, log_every=400, eval_every=0, save_every=1600, eval_batches=4),
    )


def data_cfg(tmp_path, **kw):
    """A DataConfig (built-in corpus, byte tokenizer unless `kw` says otherwise) whose token stores live
    under `tmp_path`."""
    return DataConfig(cache_dir=str(tmp_path / "cache"), **kw)
