"""Model families, one file each (config, presets, modules), and FAMILIES: the one registry that config
parsing, tasks and conversion read. A new family is a new file here and one entry below."""

from zoo.models import bert, encdec, gpt
from zoo.models.base import Family, ModelConfig

FAMILIES: dict[str, Family] = {f.name: f for f in (
    Family("gpt", gpt.GptConfig, gpt.PRESETS, tasks={"gpt_lm": "zoo.tasks.lm:LmTask", "sft": "zoo.tasks.sft:SftTask",
                                                 "dpo": "zoo.tasks.preference:DpoTask", "grpo": "zoo.tasks.rl:GrpoTask",
                                                 "embed": "zoo.tasks.embed_decoder:DecoderEmbedTask"},
           hf={"gpt2": "zoo.hf.gpt2", "qwen2": "zoo.hf.qwen2", "qwen3": "zoo.hf.qwen3", "mistral": "zoo.hf.mistral",
               "mixtral": "zoo.hf.mixtral", "qwen3_moe": "zoo.hf.qwen3_moe", "phi3": "zoo.hf.phi3",
               "gpt_neox": "zoo.hf.gpt_neox", "gemma": "zoo.hf.gemma", "gemma2": "zoo.hf.gemma2",
               "gemma3_text": "zoo.hf.gemma3", "llama": "zoo.hf.llama"}),
    Family("bert", bert.BertConfig, bert.PRESETS,
           tasks={"bert_mlm": "zoo.tasks.mlm:MlmTask", "bert_cls": "zoo.tasks.classify:ClsTask",
                  "bert_encoder": "zoo.tasks.classify:EncoderTask",
                  "bert_tokens": "zoo.tasks.token_classify:TokenTask",
                  "embed": "zoo.tasks.embed:EmbedTask"},
           hf={"bert": "zoo.hf.bert", "roberta": "zoo.hf.roberta", "xlm-roberta": "zoo.hf.roberta",
               "distilbert": "zoo.hf.distilbert"}),
    Family("encdec", encdec.EncDecConfig, encdec.PRESETS, tasks={"seq2seq": "zoo.tasks.seq2seq:Seq2SeqTask"},
           hf={"t5": "zoo.hf.t5", "mt5": "zoo.hf.t5", "bart": "zoo.hf.bart"}),  # mT5 is T5 v1.1; exports as t5
)}
# Every task name -> its family; embed, which encoders and decoders both train (the model config says which), ->
# bert, the family of a fine-tune's defaults and of a config that names no model.
TASK_FAMILY: dict[str, str] = {**{t: f.name for f in FAMILIES.values() for t in f.tasks}, "embed": "bert"}
PRESETS: dict[str, ModelConfig] = {name: cfg for f in FAMILIES.values() for name, cfg in f.presets.items()}


def family_of(model_cfg: ModelConfig) -> Family:
    return FAMILIES[model_cfg.family]
