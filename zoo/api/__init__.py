"""zoo's Python API, above the trainer, the converters and the evaluators, below the commands (zoo.cli), which
parse their arguments and call it. `zoo/__init__.py` exports its names, imported on first use:

    load       a checkpoint of any kind -> Pretrained (zoo.api.load)
    Pretrained the loaded model: generate, chat, logprobs, classify, translate, apply, loss_fn, save (pretrained)
    train      the one trainer from Python -> Run; config: a validated Config (zoo.api.training)

The rest are the functions behind those methods, one module per kind of model or job: decoder (text
generation and scoring), encoder (BERT's classify, fill_mask, tag), seq2seq (translate), batches (texts ->
a task's batch), save (zoo, Hugging Face and PEFT directories), configs (shipped configs by name),
start (how a run starts: its source, final config, base, conversion and resume step, in one value), fine_tune
(what --init-from starts from and with which settings).
"""
