"""Structured output in zoo-serve's engine: rows with a JSON schema's grammar (zoo.infer.grammar) decode beside rows
without one in the same batch; a tiny model of random weights writes JSON that parses and validates against each
of 20 schemas, because the grammar's bitmask leaves nothing else to sample (an object that allows more keys than
it names may run on to max_tokens with such a model: two of these close theirs); a row without a grammar decodes
the tokens it decodes alone; max_tokens reached before the JSON closes ends the row with "length"."""

import json

import jsonschema
import numpy as np
import pytest

import zoo
from tests.helpers.engine_runs import decode_all
from zoo.infer import grammar, sample
from zoo.engine.batching import Engine, Sequence

S = {"type": "string", "maxLength": 6}
I = {"type": "integer", "minimum": -50, "maximum": 999}
SCHEMAS = [
    {"type": "object", "properties": {"ok": {"type": "boolean"}}, "required": ["ok"]},
    {"type": "object", "properties": {"name": S, "age": I}, "required": ["name", "age"]},
    {"type": "object", "properties": {"color": {"enum": ["red", "green", "blue"]}}, "required": ["color"]},
    {"type": "object", "properties": {"tags": {"type": "array", "items": S, "maxItems": 3}}, "required": ["tags"]},
    {"type": "object", "properties": {"point": {"type": "object", "properties": {"x": I, "y": I},
                                                "required": ["x", "y"]}}, "required": ["point"]},
    {"type": "array", "items": {"type": "boolean"}, "minItems": 1, "maxItems": 4},
    {"type": "object", "properties": {"n": {"type": "number", "minimum": 0, "maximum": 10}}, "required": ["n"]},
    {"enum": ["yes", "no", 3, None]},
    {"type": "object", "properties": {"a": {"type": "object", "properties": {"b": {"type": "object", "properties": {
        "c": {"type": "boolean"}}, "required": ["c"]}}, "required": ["b"]}}, "required": ["a"]},
    {"type": "object", "properties": {"kind": {"const": "user"}, "id": I}, "required": ["kind", "id"]},
    {"type": "object", "properties": {"x": {"type": "null"}, "y": {"type": "boolean"}}, "required": ["x", "y"]},
    {"type": "object", "properties": {"opt": S, "must": {"type": "boolean"}}, "required": ["must"]},
    {"type": "array", "items": {"type": "object", "properties": {"k": {"enum": [1, 2]}}, "required": ["k"]},
     "maxItems": 2},
    {"type": "object", "properties": {"v": {"anyOf": [{"type": "boolean"}, {"type": "null"}]}}, "required": ["v"]},
    {"type": "object", "properties": {"code": {"type": "string", "pattern": "^[A-Z]{2}[0-9]{2}$"}},
     "required": ["code"], "additionalProperties": False},
    {"type": "object", "properties": {"m": {"type": "array", "items": {"type": "array", "items": I, "maxItems": 2},
                                            "maxItems": 2}}, "required": ["m"]},
    {"type": "object", "properties": {"p": {"type": "integer", "enum": [7, 11, 13]}, "q": {"type": "boolean"}},
     "required": ["p", "q"], "additionalProperties": False},
    {"type": "boolean"},
    {"type": "object", "properties": {"s": {"type": "string", "minLength": 2, "maxLength": 4}}, "required": ["s"]},
    {"type": "object", "properties": {"user": {"type": "object", "properties": {"name": S, "role": {
        "enum": ["admin", "guest"]}, "langs": {"type": "array", "items": {"enum": ["py", "go"]}, "maxItems": 2}},
        "required": ["name", "role", "langs"], "additionalProperties": False}}, "required": ["user"]},
]


@pytest.fixture(scope="module")
def lm():
    return zoo.load("llama_tiny")  # random weights, the byte tokenizer, a 256-token window


def _run(engine, seqs):
    """Decode `seqs` to the end on the engine's loop; (their ids, their finish reasons)."""
    chunks, finish = decode_all(engine, seqs)
    return [sum(c, []) for c in chunks], finish


@pytest.fixture(scope="module")
def decoded(lm):
    """The 20 schemas' rows (greedy and sampled in turn) and two rows without a grammar, one engine, 8 slots."""
    eos = sample.stop_ids(lm.tokenizer)
    rng = np.random.default_rng(0)
    plain = [rng.integers(1, 256, 20).tolist() for _ in range(2)]
    seqs = [Sequence(prompt=plain[0], max_tokens=30, temperature=0.0)]
    for i, schema in enumerate(SCHEMAS):
        g = grammar.compile_schema(lm.tokenizer, eos, schema)
        seqs.append(Sequence(prompt=list(b"JSON please: "), max_tokens=150, temperature=0.0 if i % 2 else 1.0,
                             key=np.asarray([0, i], np.uint32), grammar=g.matcher()))
    seqs.append(Sequence(prompt=plain[1], max_tokens=30, temperature=0.0))
    short = grammar.compile_schema(lm.tokenizer, eos, SCHEMAS[1])  # cut before it closes
    seqs.append(Sequence(prompt=list(b"JSON please: "), max_tokens=4, temperature=0.0, grammar=short.matcher()))
    return plain, _run(Engine(lm, slots=8, max_len=256, chunk=4), seqs)


@pytest.mark.parametrize("i", range(len(SCHEMAS)))
def test_every_row_with_a_schema_writes_json_that_validates(decoded, lm, i):
    _, (got, finish) = decoded
    text = lm.tokenizer.decode(got[1 + i])
    assert finish[1 + i] == "stop", text
    jsonschema.validate(json.loads(text), SCHEMAS[i])


def test_rows_without_a_grammar_decode_as_alone_and_a_cut_row_ends_with_length(decoded, lm):
    plain, (got, finish) = decoded
    model, params = lm.decoding()
    for p, ids in zip(plain, (got[0], got[-2])):
        want = sample.generate(model, params, p, 30, temperature=0.0, eos_id=sample.stop_ids(lm.tokenizer),
                               vocab_limit=lm.tokenizer.n_vocab)[0]
        assert ids == want
    assert finish[-1] == "length" and len(got[-1]) == 4 and lm.tokenizer.decode(got[-1]) == '{"na'


def test_a_schema_the_compiler_refuses_is_named(lm):
    with pytest.raises(grammar.SchemaError, match="nope"):
        grammar.compile_schema(lm.tokenizer, (256,), {"type": "object", "properties": {"a": {"type": "nope"}}})


def test_generate_and_chat_with_a_json_schema_write_json_that_validates(lm):
    """Pretrained.generate / .chat(json_schema=...): the same mask on zoo-serve's engine, from Python; n rows per
    prompt; a schema the compiler refuses is a ZooError naming the problem."""
    schema, short = ({**SCHEMAS[i], "additionalProperties": False} for i in (19, 1))  # no free keys to run on
    texts = lm.generate(["Give me a user: ", "A user, as JSON: "], max_new_tokens=120, temperature=1.0, seed=1, n=2,
                        json_schema=schema)
    answers = lm.chat("Who are you?", max_new_tokens=120, json_schema=short)
    for text in [*texts[0], *texts[1]]:
        jsonschema.validate(json.loads(text), schema)
    jsonschema.validate(json.loads(answers), short)
    assert len({*texts[0], *texts[1]}) > 1  # sampled rows differ: the mask does not write one text for all
    with pytest.raises(zoo.errors.ZooError, match="Invalid type: nope"):
        lm.generate("x", json_schema={"type": "nope"})
