"""A GPT trained on short windows samples as well past its window as inside it (nanoGPT's crop), and
worse without the crop: positions it never trained make the difference."""

import collections

import numpy as np
from pydoc_data.topics import topics

from tests.helpers.processes import train_alone
from zoo.configuration import Config, DataConfig, OptimConfig, TrainConfig
from zoo.data.tokenizers import ByteTokenizer
from zoo.infer.sample import generate
from zoo.models.gpt import GptConfig
from zoo.training import runs

WINDOW, NEW, INSIDE = 32, 120, 28  # trained length, tokens sampled, of which inside the first window


def bigram_scorer():
    """Mean log-probability of consecutive byte pairs under the corpus' own (smoothed) byte bigrams."""
    text = "".join(topics[k] for k in sorted(topics)).encode()
    pairs, firsts = collections.Counter(zip(text, text[1:])), collections.Counter(text[:-1])
    return lambda ids: float(np.mean([np.log((pairs[a, b] + 0.01) / (firsts[a] + 2.56)) for a, b in zip(ids, ids[1:])]))


def test_samples_past_the_trained_window_stay_as_good_as_inside_it(cache_dir, tmp_path):
    cfg = Config(task="gpt_lm",
                 model=GptConfig(vocab_size=264, max_len=128, num_layers=2, d_model=64, num_heads=4, d_ff=256,
                                 dropout=0.0),
                 data=DataConfig(seq_len=WINDOW, cache_dir=cache_dir), optim=OptimConfig(lr=3e-3, warmup=20),
                 train=TrainConfig(steps=500, batch_size=32, log_every=100, eval_every=0, save_every=500))
    train_alone(cfg, tmp_path / "run", level=1)  # 500 steps: at the suite's level 0 they took 28 s instead of 19
    model, params, _, _ = runs.load_run(str(tmp_path / "run"), "gpt_lm")
    score = bigram_scorer()
    prompt = ByteTokenizer().encode("The ")

    def quality(window):
        outs = generate(model, params, prompt, NEW, temperature=0.8, seed=0, num_samples=16, window=window)
        assert all(len(o) == NEW for o in outs)
        return (np.mean([score(prompt + o[:INSIDE]) for o in outs]), np.mean([score(o[INSIDE:]) for o in outs]))

    inside, past = quality(WINDOW)  # what zoo-sample and the end-of-run sample do: the run's data.seq_len
    _, uncropped = quality(cfg.model.max_len)  # positions 32..127 were never trained
    assert past > inside - 0.15, (inside, past)
    assert uncropped < past - 0.2, (past, uncropped)
