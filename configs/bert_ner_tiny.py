"""BERT tiny, token classification (task bert_tokens): named-entity tags (PER, LOC, ORG in IOB2) on zoo's
built-in synthetic NER set, from scratch, byte tokens. CPU.

    python train.py configs/bert_ner_tiny.py --workdir runs/ner
    zoo-eval runs/ner --data builtin --text-column tokens --label-column ner_tags   # entity P/R/F1 per type

The data is synthetic, not real text: zoo.data.ner fills 12 sentence templates ("Yesterday {PER} joined
{ORG} in {LOC} .") with names from short lists of people, places and organisations (1-3 words each),
3,000 sentences drawn deterministically, tagged by construction; capitalised non-entities (sentence-initial
words, days, months) and one ambiguous name (Jordan: a person and a place) make capitals alone
insufficient. It checks that the pipeline (word-to-piece label alignment, the loss over first pieces, the
entity scores) learns; it says nothing about accuracy on real NER data such as conll2003 (a hub:NAME
source with the same two columns, where the hub is reachable: not tried here).
Each word's tag sits on its first byte; eval_accuracy is over words, eval_entity_f1 over IOB2 spans
(zoo.tasks.entities, seqeval's default scoring).

Expect (`python -m zoo.cli.results bert_ner_tiny`, 2-core CPU, 2026-11-27): 0m50s wall; loss 1.21 ->
0.09 over 300 steps, eval_loss 0.1012, eval_accuracy 0.9624, eval_entity_f1 0.8585; 11,414 tokens/s,
MFU 0.15.

For scale: a fresh (zero-initialised) head tags every word O, entity F1 0; always guessing O scores word
accuracy 0.58 on this set.

The model has configs/bert_tiny_mlm.py's shapes, so `--set init_from=runs/mlm` starts from that encoder.
"""

import dataclasses

from zoo.configuration import Config, DataConfig, OptimConfig, TrainConfig
from zoo.models.bert import BERT_TINY

# 257 byte ids + [CLS] [SEP] [MASK] [PAD], rounded up, as bert_tiny_mlm; 7 tags: O and B-/I- of PER, LOC, ORG.
MODEL = dataclasses.replace(BERT_TINY, vocab_size=264, max_len=128, num_classes=7)


def get_config() -> Config:
    return Config(
        task="bert_tokens",
        model=MODEL,
        data=DataConfig(source="builtin", text_column="tokens", label_column="ner_tags", tokenizer="bytes", seq_len=80,
                        val_fraction=0.1),
        optim=OptimConfig(lr=2e-3, schedule="linear", warmup=0.1, weight_decay=0.01, b2=0.99),
        train=TrainConfig(steps=300, batch_size=32, log_every=50, eval_every=100, eval_batches=8, save_every=300),
    )
