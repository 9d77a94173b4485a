#!/usr/bin/env python
"""Train a zoo model from a config file.

    python train.py configs/gpt_tiny.py [--workdir DIR] [--set key=value ...]
    python train.py --resume DIR [--set train.steps=4000]
"""

import sys

from zoo import accel

accel.configure()  # XLA's GPU flags, before anything starts jax's backend

from zoo.cli.train import train_main  # noqa: E402

if __name__ == "__main__":
    sys.exit(train_main())
