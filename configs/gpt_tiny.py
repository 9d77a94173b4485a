"""GPT tiny: a 4-layer, width-128 byte-level GPT on the built-in corpus (Python's own docs). CPU.

    python train.py configs/gpt_tiny.py --workdir runs/gpt_tiny

Expect (`python -m zoo.cli.results gpt_tiny`, 2-core CPU, 2026-11-27): 2m21s wall; loss 3.92 -> 1.53
over 800 steps, eval_loss 1.617, eval_accuracy 0.5355; 12,800 tokens/s, MFU 0.39.
"""

from zoo.configuration import Config, DataConfig, OptimConfig, TrainConfig
from zoo.models.gpt import GPT_TINY


def get_config() -> Config:
    return Config(
        task="gpt_lm",
        model=GPT_TINY,
        data=DataConfig(source="builtin", tokenizer="bytes", seq_len=128),
        optim=OptimConfig(lr=2e-3, schedule="cosine", warmup=50, weight_decay=0.1, b2=0.99),
        train=TrainConfig(steps=800, batch_size=16, log_every=50, eval_every=250, eval_batches=8,
                          save_every=400, sample_tokens=200, sample_prompt="The "),
    )
