"""Hugging Face <-> zoo checkpoint conversion (GPT-2, Llama, Qwen2, Mistral, BERT, T5, BART; see zoo.hf).

    zoo-convert from-hf PATH_OR_HUB_ID runs/base    # config.json + model.safetensors (or .bin) -> zoo run
    zoo-convert from-gguf model.Q4_1.gguf runs/base  # a llama.cpp GGUF file, dequantised -> zoo run
    zoo-convert to-hf runs/finetuned out/            # -> config.json + model.safetensors + tokenizer files
    zoo-convert to-hf runs/lora out/ --adapter       # a LoRA run's adapters -> a PEFT adapter directory
    zoo-convert from-hf adapter/ runs/lora [--base BASE]  # a PEFT LoRA adapter -> a zoo LoRA run on BASE
"""

from __future__ import annotations

import argparse
import sys

from zoo import runtime
from zoo.cli import BAD_INPUT, error


def main(argv=None) -> int:
    runtime.prepare_command()  # the compilation cache, XLA's log level: before jax starts
    ap = argparse.ArgumentParser(prog="zoo-convert", description=__doc__.split("\n")[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    a = sub.add_parser("from-hf", help="a Hugging Face checkpoint (directory or hub id) -> a zoo run directory")
    a.add_argument("source", help="a directory with config.json and *.safetensors (or pytorch_model.bin), a hub id, "
                                  "or a PEFT LoRA adapter directory (adapter_config.json + adapter_model.safetensors)")
    a.add_argument("run_dir", help="the new zoo run directory (must not hold checkpoints)")
    a.add_argument("--base", help="for a PEFT adapter directory: its base, a zoo run or a Hugging Face directory "
                                  "(converted into RUN_DIR/base); default: adapter_config.json's "
                                  "base_model_name_or_path")
    g = sub.add_parser("from-gguf", help="a GGUF file (llama.cpp; quantised or not) -> a zoo run directory, "
                                         "dequantised through transformers (needs the test extras)")
    g.add_argument("source", help="the .gguf file")
    g.add_argument("run_dir", help="the new zoo run directory (must not hold checkpoints)")
    b = sub.add_parser("to-hf", help="a zoo run directory -> a directory transformers loads")
    b.add_argument("run_dir", help="a zoo run directory (its latest checkpoint is exported)")
    b.add_argument("out_dir", help="the directory to write config.json, model.safetensors and tokenizer files to")
    b.add_argument("--adapter", action="store_true",
                   help="a LoRA run's adapters alone, as a PEFT adapter (adapter_config.json + "
                        "adapter_model.safetensors) for its base; without it, a LoRA run exports merged")
    args = ap.parse_args(argv)
    from zoo import hf
    from zoo.errors import ConversionError
    from zoo.hf import peft
    try:
        if args.cmd == "to-hf":  # a non-empty output directory is refused before anything loads
            from zoo.hf.convert import check_out_dir
            check_out_dir(args.out_dir)
        if args.cmd == "from-hf" and peft.is_adapter_dir(args.source):
            peft.from_peft(args.source, args.run_dir, args.base)
        elif args.cmd == "from-hf":
            if args.base is not None:
                raise ConversionError(f"--base applies to a PEFT adapter directory; {args.source!r} has no "
                                      f"adapter_config.json")
            hf.from_hf(args.source, args.run_dir)
        elif args.cmd == "from-gguf":
            from zoo.hf.gguf import from_gguf
            from_gguf(args.source, args.run_dir)
        elif args.adapter:
            from zoo.hf.peft_export import to_peft
            to_peft(args.run_dir, args.out_dir)
        else:
            hf.to_hf(args.run_dir, args.out_dir)
    except BAD_INPUT as e:
        return error(e)
    return 0


if __name__ == "__main__":
    sys.exit(main())
