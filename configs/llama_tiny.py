"""Llama tiny: a 4-layer, width-128 byte-level Llama-architecture decoder on the built-in corpus. CPU.
Rotary positions, RMSNorm, a SwiGLU MLP, grouped-query attention (4 query heads, 2 key/value heads),
no biases, an untied output head: gpt_tiny's size and data, the modern decoder's parts.

    python train.py configs/llama_tiny.py --workdir runs/llama_tiny
    zoo-sample runs/llama_tiny --prompt 'The "for" statement' --temperature 0

Expect (`python -m zoo.cli.results llama_tiny`, 2-core CPU, 2026-11-27): 2m18s wall; loss 3.95 ->
1.16 over 800 steps, eval_loss 1.27, eval_accuracy 0.6331; 13,105 tokens/s, MFU 0.35.
"""

from zoo.configuration import Config, DataConfig, OptimConfig, TrainConfig
from zoo.models.gpt import LLAMA_TINY


def get_config() -> Config:
    return Config(
        task="gpt_lm",
        model=LLAMA_TINY,
        data=DataConfig(source="builtin", tokenizer="bytes", seq_len=128),
        optim=OptimConfig(lr=2e-3, schedule="cosine", warmup=50, weight_decay=0.1, b2=0.99),
        train=TrainConfig(steps=800, batch_size=16, log_every=50, eval_every=250, eval_batches=8,
                          save_every=400, sample_tokens=200, sample_prompt="The "),
    )
