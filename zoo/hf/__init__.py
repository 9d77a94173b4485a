"""Hugging Face checkpoints in and out, torch-free (GPT-2, Llama, Qwen2, Qwen3, Mistral, Phi-3, GPT-NeoX, Gemma,
Gemma 2, Gemma 3 (text), BERT, RoBERTa, XLM-R, DistilBERT, T5, mT5, BART):

    from_hf(path_or_id, run_dir)  -> a zoo run directory (weights-only checkpoint, config, tokenizer)
    to_hf(run_dir, out_dir)       -> config.json + model.safetensors (+ tokenizer files) for transformers
    from_pretrained(path)         -> (model, params, tokenizer, config) from either kind of directory
    peft_export.to_peft(lora_run, out_dir)       -> a PEFT LoRA adapter (adapter_config.json, adapter_model.safetensors,
                                                    tokenizer files)
    peft.from_peft(adapter_dir, run_dir, base)   -> a zoo LoRA run on `base` (a zoo run or a Hugging Face directory)

Each architecture is one module holding its two-way key table (gpt2, llama, phi3, gpt_neox, gemma, bert, t5,
bart; qwen2, qwen3 and mistral share llama's; gemma2 and gemma3 share gemma's; t5 serves mt5 too; roberta
(serving xlm-roberta too) and distilbert share bert's rows and helpers), built with `table` and satisfying the
`base.Converter` protocol; `convert` runs them. PEFT adapters are derived from the same key tables (zoo.hf.peft,
zoo.hf.peft_export).
"""

from zoo.hf.convert import from_hf, from_pretrained, to_hf

__all__ = ["from_hf", "from_pretrained", "to_hf"]
