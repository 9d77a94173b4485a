"""BERT tiny, [CLS] classification fine-tuned from bert_tiny_mlm: which family of Python's docs
(statements, expressions, data model, library) a paragraph of the built-in corpus comes from.

    python train.py configs/bert_tiny_mlm.py --workdir runs/mlm
    python train.py configs/bert_tiny_cls.py --workdir runs/cls --set init_from=runs/mlm
    zoo-classify runs/cls --text 'The "for" statement is used to iterate over the elements of a sequence'

Expect (`python -m zoo.cli.results bert_tiny_cls`, 2-core CPU, 2026-11-26): 1m23s wall; loss 1.36 ->
0.80 over 400 steps, eval_loss 1.105, eval_accuracy 0.5535, eval_macro_f1 0.5328; 20,443 tokens/s,
MFU 0.31.

For scale: chance (always the largest family) is 0.27 accuracy, and the same model trained from
scratch (without init_from) scores lower. Paragraphs longer than data.seq_len bytes are truncated;
the count is printed at start.
"""

import dataclasses

from zoo.configuration import Config, DataConfig, OptimConfig, TrainConfig
from zoo.models.bert import BERT_TINY

# Must match configs/bert_tiny_mlm.py in every shape but the head, so init_from copies the encoder.
MODEL = dataclasses.replace(BERT_TINY, vocab_size=264, max_len=128, num_classes=4)


def get_config() -> Config:
    return Config(
        task="bert_cls",
        model=MODEL,
        data=DataConfig(source="builtin", tokenizer="bytes", seq_len=128, val_fraction=0.2),
        optim=OptimConfig(lr=1e-3, schedule="linear", warmup=0.1, weight_decay=0.01, b2=0.99),
        train=TrainConfig(steps=400, batch_size=32, log_every=50, eval_every=100, eval_batches=16, save_every=400),
    )
