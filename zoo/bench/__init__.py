"""Benchmarks (the command is zoo.cli.bench): workloads and shapes (`shapes`), one worker process per
framework (`worker` for zoo, `torch_peer` for transformers), and the parent that alternates their rounds
and reports ratios measured in the same run (`run`)."""
