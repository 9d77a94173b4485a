"""BERT tiny, masked-LM pretraining: 2 layers, width 128, byte tokens, on the built-in corpus. CPU.

    python train.py configs/bert_tiny_mlm.py --workdir runs/mlm
    zoo-fill-mask runs/mlm --text 'The "wh[MASK]le" statement is used for repeated execution'

Expect (`python -m zoo.cli.results bert_tiny_mlm`, 2-core CPU, 2026-11-26): 8m14s wall; loss 4.61 ->
1.15 over 3000 steps, eval_loss 1.175, eval_accuracy 0.6727; 26,218 tokens/s, MFU 0.36; zoo-fill-
mask answers 'i' 0.633, 'o' 0.248, 'e' 0.036 for 'The "wh[MASK]le" statement is used for repeated
execution'.

For scale: the corpus' byte unigram entropy is 3.26 nats. MLM on bytes sits on a plateau near it (it
predicts frequent bytes: ' ', 'e') for about 1000 steps before it learns to spell from both sides, so
this run takes 3000 steps: with 1000 it ends at eval_loss ~2.7 and answers ' ' to the example above.
"""

import dataclasses

from zoo.configuration import Config, DataConfig, OptimConfig, TrainConfig
from zoo.models.bert import BERT_TINY

# 257 byte ids (256 bytes + the document separator) + [CLS] [SEP] [MASK] [PAD] = 261 rows, rounded up.
# num_classes only shapes a classifier's head: it matches configs/bert_tiny_cls.py for symmetry.
MODEL = dataclasses.replace(BERT_TINY, vocab_size=264, max_len=128, num_classes=4)


def get_config() -> Config:
    return Config(
        task="bert_mlm",
        model=dataclasses.replace(MODEL, dropout=0.0),  # a short run on a small corpus: no need to regularise
        data=DataConfig(source="builtin", tokenizer="bytes", seq_len=128),
        optim=OptimConfig(lr=2e-3, schedule="linear", warmup=0.05, weight_decay=0.01, b2=0.99),
        train=TrainConfig(steps=3000, batch_size=32, log_every=50, eval_every=500, eval_batches=8, save_every=1000),
    )
