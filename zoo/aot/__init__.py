"""Ahead-of-time compilation for a machine zoo is not running on (`train.py CONFIG --compile-for v5e:2x2`):
the run's own step built with abstract arrays on a target's devices, compiled there, and read back as a report
(bytes per chip beside the chip's HBM, FLOPs, collectives, kernels, a roofline estimate of the step time).

  chips.py   the TPU chips' published figures (HBM, bf16 peak, HBM bandwidth, ICI), each with its source
  target.py  "v5e:2x2" / "v5e-8" -> the compile-only devices of that topology (libtpu's client on any host)
  report.py  a compiled program -> the report's figures; the text and JSON forms
  train.py   a run's config -> its train step compiled for a target, and the largest batch that fits
  decode.py  a checkpoint -> its generation programs (prefill, decode) compiled for a target
  serve.py   a checkpoint -> zoo-serve's engine (its decode chunk over every row, a row's prefill) for a target
  pods.py    the shipped presets on the pods people rent: one table (`python -m zoo.aot.pods --write README.md`)

MaxText's train_compile.py answers the same question ("does it fit on the pod I am about to rent?") the same
way; nothing here trains, writes a checkpoint or needs an accelerator.
"""
