"""GPT-2 small (124M) on a real corpus with the GPT-2 tokenizer. Accelerator-sized.

    python train.py configs/gpt2_small.py --set data.source=hub:openwebtext   # online
    python train.py configs/gpt2_small.py --set data.tokenizer=/path/r50k_base.tiktoken   # offline BPE file

Expect, on 8 GPUs for ~100k steps: validation loss ~3.0 (nanoGPT's reproduction of GPT-2 124M).
"""

from zoo.configuration import Config, DataConfig, OptimConfig, TrainConfig
from zoo.models.gpt import GPT2_SMALL


def get_config() -> Config:
    return Config(
        task="gpt_lm",
        model=GPT2_SMALL,
        data=DataConfig(source="hub:openwebtext", tokenizer="gpt2", seq_len=1024),
        optim=OptimConfig(lr=6e-4, schedule="cosine", warmup=2000, weight_decay=0.1, b2=0.95),
        train=TrainConfig(steps=100_000, batch_size=480, grad_accum=8, log_every=10, eval_every=1000,
                          eval_batches=20, save_every=2000),
    )
