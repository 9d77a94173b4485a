"""BERT base (12 layers, width 768), masked-LM pretraining as BERT's phase 1 (T=128), on an accelerator.

    python train.py configs/bert_base_mlm.py --set data.source=hub:wikitext/wikitext-103-raw-v1 --workdir runs/bert_base

Online: the GPT-2 BPE (`gpt2`, downloaded once) replaces BERT's WordPiece, so the word embedding has
50304 rows (50257 + [CLS] [SEP] [MASK] [PAD], rounded up to a multiple of 64): 124.7M params in the
MLM model instead of bert-base-uncased's 109.5M. The schedule is BERT's (Adam 1e-4, b2 0.999, weight
decay 0.01, linear decay after 10k warmup steps, batch 256), shortened to 100k steps.
Not measured: this needs the network (dataset, tokenizer) and an accelerator; no result is claimed.
"""

import dataclasses

from zoo.configuration import Config, DataConfig, OptimConfig, TrainConfig
from zoo.models.bert import BERT_BASE


def get_config() -> Config:
    return Config(
        task="bert_mlm",
        model=dataclasses.replace(BERT_BASE, vocab_size=50304, dtype="bfloat16"),
        data=DataConfig(source="builtin", tokenizer="gpt2", seq_len=128),
        optim=OptimConfig(lr=1e-4, schedule="linear", warmup=10_000, b1=0.9, b2=0.999, eps=1e-6, weight_decay=0.01),
        train=TrainConfig(steps=100_000, batch_size=256, log_every=100, eval_every=2000, eval_batches=16,
                          save_every=5000, keep=3),
    )
