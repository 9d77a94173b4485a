"""The GPT-2 speedrun's architecture (KellerJordan/modded-nanogpt) at GPT-2 124M's shape, trained with Muon on a
warmup-stable-decay schedule. Accelerator-sized; configs/gpt_speedrun_tiny.py is the same switches on the CPU.

    python train.py configs/gpt_speedrun.py   # online: FineWeb's 10B-token sample, the speedrun's data
    python train.py configs/gpt_speedrun.py --set data.tokenizer=/path/r50k_base.tiktoken   # offline BPE file

The model (zoo.models.gpt.GPT_SPEEDRUN, 278,124,306 params, 115,900,416 of them in its value embeddings): 12
layers of width 768, 6 heads of 128, rope, RMSNorm, QK-norm, a relu2 MLP, no biases, an untied head, residual
projections initialised to zero, U-net skips, 3 value embeddings (layers 0-2 and 9-11), output logits capped at
15, the vocabulary padded to 50304. Muon on the hidden matrices, AdamW on the rest; a flat learning rate, then a
linear decay to a tenth over the last 40% (the speedrun's cooldown). Not the speedrun's: its attention windows,
zero-initialised head, per-group learning rates and sequence lengths.

Expect: not yet run in zoo (the speedrun's target is 3.28 FineWeb validation loss); the learning rate is a
starting point (Muon's update RMS set to AdamW's, optim.muon_rms), not tuned.
"""

from zoo.configuration import Config, DataConfig, OptimConfig, TrainConfig
from zoo.models.gpt import GPT_SPEEDRUN


def get_config() -> Config:
    return Config(
        task="gpt_lm",
        model=GPT_SPEEDRUN,
        data=DataConfig(source="hub:HuggingFaceFW/fineweb/sample-10BT", tokenizer="gpt2", seq_len=1024),
        optim=OptimConfig(name="muon", lr=3e-3, schedule="wsd", warmup=0, decay_fraction=0.4, min_lr_ratio=0.1,
                          weight_decay=0.0, b1=0.8, b2=0.95, clip_norm=0.0),
        # 512 x 1024 = 524,288 tokens a step, the speedrun's early records' batch.
        train=TrainConfig(steps=3200, batch_size=512, grad_accum=8, log_every=10, eval_every=250,
                          eval_batches=20, save_every=1000),
    )
