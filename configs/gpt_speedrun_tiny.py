"""The GPT-2 speedrun's architecture (configs/gpt_speedrun.py) at gpt_tiny's shape on the built-in corpus. CPU.

    python train.py configs/gpt_speedrun_tiny.py --workdir runs/gpt_speedrun_tiny

The model (zoo.models.gpt.GPT_SPEEDRUN_TINY): 4 layers of width 128, rope, RMSNorm, QK-norm, a relu2 MLP, no
biases, an untied head, zero-initialised residual projections, U-net skips, a value embedding (layers 0 and 3),
logits capped at 15; Muon on a warmup-stable-decay schedule.

Expect: not yet measured over the whole run (tests/train/test_gpt_speedrun_configs.py trains its first steps and
sees the loss fall).
"""

from zoo.configuration import Config, DataConfig, OptimConfig, TrainConfig
from zoo.models.gpt import GPT_SPEEDRUN_TINY


def get_config() -> Config:
    return Config(
        task="gpt_lm",
        model=GPT_SPEEDRUN_TINY,
        data=DataConfig(source="builtin", tokenizer="bytes", seq_len=128),
        optim=OptimConfig(name="muon", lr=5e-3, schedule="wsd", warmup=20, decay_fraction=0.4, min_lr_ratio=0.1,
                          weight_decay=0.0, b1=0.8, b2=0.95),
        train=TrainConfig(steps=800, batch_size=16, log_every=50, eval_every=250, eval_batches=8,
                          save_every=400, sample_tokens=200, sample_prompt="The "),
    )
