"""Structured output: a JSON schema compiled by llguidance into a grammar, and one `Matcher` per sequence that says,
before each token, which tokens keep the text on the grammar (a bitmask of ceil(V / 32) int32 words, bit v of word
v // 32 set: token v allowed) and follows the tokens sampled. The mask is applied inside the jitted sampler
(zoo.engine.programs, zoo.infer.sample's `masked`): a token off the grammar gets -inf, so even a model of random
weights writes text that parses and validates. End-of-text is allowed only once the grammar accepts, and a grammar
that admits nothing more ends its row.

llguidance (not xgrammar): one wheel for every CPython >= 3.9 (abi3) with no dependencies (xgrammar requires torch,
triton and transformers), numpy bitmasks, and tokenizers built from a `tokenizers` JSON, a tiktoken encoding or any
id -> bytes table, which covers each of zoo's tokenizer classes.
"""

from __future__ import annotations

import json
import threading

import numpy as np

from zoo.errors import ZooError

_BUILT: dict = {}  # id(zoo tokenizer) -> (the tokenizer, its llguidance tokenizer): built once (~1 s for 150k ids)
_LOCK = threading.Lock()


class SchemaError(ZooError):
    """A schema the grammar compiler refuses (its message names the problem)."""


def _import():
    try:
        import llguidance
    except ImportError:
        raise ZooError("structured output needs llguidance: pip install llguidance (zoo's serve extra)") from None
    return llguidance


def words(vocab: int) -> int:
    """The int32 words of a bitmask over `vocab` ids."""
    return (vocab + 31) // 32


def _table(tokenizer) -> list[bytes]:
    """Each id's bytes for a tokenizer that is neither a `tokenizers` JSON nor a plain tiktoken encoding (zoo's byte
    tokenizer, a GPT-2 BPE remapped to its checkpoint's ids); specials as their text."""
    if hasattr(tokenizer, "id_to_rank"):  # zoo.data.hf_tokenizers.RemappedBpe
        enc = tokenizer.encoding
        out = [b""] * tokenizer.n_vocab
        for i, r in tokenizer.id_to_rank.items():
            if i < tokenizer.n_vocab:
                out[i] = enc.decode_single_token_bytes(r)
        out[tokenizer.eot_token] = tokenizer.eot_text.encode()
        return out
    out = [bytes([i]) if i < 256 else b"" for i in range(tokenizer.n_vocab)]
    out[tokenizer.eot_token] = tokenizer.eot_text.encode()
    return out


def ll_tokenizer(tokenizer, eos: tuple[int, ...]):
    """The llguidance tokenizer of a zoo tokenizer, built once; `eos` its end ids (zoo.infer.sample.stop_ids)."""
    llg = _import()
    with _LOCK:
        got = _BUILT.get(id(tokenizer))
        if got is not None and got[0] is tokenizer:
            return got[1]
        n, eos = tokenizer.n_vocab, [int(e) for e in eos]
        if hasattr(getattr(tokenizer, "tok", None), "to_str"):  # zoo.data.hf_tokenizers.HfTokenizer
            built = llg.LLTokenizer(tokenizer.tok.to_str(), n_vocab=n, eos_token=eos)
        elif hasattr(tokenizer, "encoding") and not hasattr(tokenizer, "id_to_rank"):  # zoo.data.bpe's tiktoken
            enc = tokenizer.encoding
            built = llg.LLTokenizer.from_tiktoken(encoder=enc._mergeable_ranks, special_tokens=enc._special_tokens,
                                                  pattern=enc._pat_str, eos_token=eos, n_vocab=n)
        else:
            table = _table(tokenizer)

            class Wrapped:  # what llguidance.TokenizerWrapper reads
                eos_token_id, bos_token_id, tokens = eos[0], None, table
                special_token_ids = [e for e in eos if e < n]

                def __call__(self, s):
                    return tokenizer.encode(s.decode("utf-8", "replace") if isinstance(s, bytes) else s)
            built = llg.LLTokenizer(llg.TokenizerWrapper(Wrapped()), n_vocab=n, eos_token=eos)
        _BUILT[id(tokenizer)] = (tokenizer, built)
        return built


def compile_schema(tokenizer, eos: tuple[int, ...], schema) -> "Grammar":
    """The grammar of a JSON schema (a dict; {"type": "object"} for any object), written compactly (no whitespace
    between tokens: a model's whitespace could run to max_tokens); a schema the compiler refuses raises
    SchemaError naming the problem."""
    llg = _import()
    if not isinstance(schema, dict):
        raise SchemaError(f"a JSON schema must be an object; got {json.dumps(schema)[:80]}")
    tok = ll_tokenizer(tokenizer, eos)
    compact = {"whitespace_flexible": False}
    text = _checked(tok, lambda: llg.LLMatcher.grammar_from_json_schema(schema, defaults=compact),
                    "the JSON schema is refused by the grammar compiler")
    return Grammar(tok, text, schema)


def schema_problem(schema) -> str | None:
    """Why the grammar compiler refuses a JSON schema (e.g. 'Invalid type: nope'), or None: no tokenizer needed."""
    llg = _import()
    if not isinstance(schema, (dict, bool)):
        return f"a JSON schema is an object; got {json.dumps(schema)[:80]}"
    problem = llg.LLMatcher.validate_grammar(llg.LLMatcher.grammar_from_json_schema(schema), None)
    return problem if problem and not problem.startswith("WARNING") else None


def compile_lark(tokenizer, eos: tuple[int, ...], lark: str) -> "Grammar":
    """The grammar of a Lark text in llguidance's dialect (%json {schema} embeds a JSON schema; zoo.infer.tool_calls
    writes them); one the compiler refuses raises SchemaError."""
    llg = _import()
    tok = ll_tokenizer(tokenizer, eos)
    return Grammar(tok, _checked(tok, lambda: llg.LLMatcher.grammar_from_lark(lark),
                                 "the grammar is refused by its compiler"), None)


def _checked(tok, build, refused: str) -> str:
    """The grammar text `build()` makes, validated against the tokenizer; SchemaError "<refused>: why" when the
    compiler refuses it (warnings pass)."""
    try:
        text = build()
    except ValueError as e:
        raise SchemaError(f"{refused}: {e}") from None
    problem = _import().LLMatcher.validate_grammar(text, tok)
    if problem and not problem.startswith("WARNING"):
        raise SchemaError(f"{refused}: {problem}")
    return text


class Grammar:
    """A compiled schema: `matcher()` gives each sequence its own state."""

    def __init__(self, tok, text: str, schema: dict):
        self.tok, self.text, self.schema = tok, text, schema

    def matcher(self) -> "Matcher":
        return Matcher(self)


class Matcher:
    """One sequence's place in its grammar: `fill(mask, row)` writes the allowed tokens' bits into a bitmask row,
    `advance(token)` follows a sampled token and says whether the sequence ends there (end-of-text, or nothing more
    is allowed)."""

    def __init__(self, grammar: Grammar):
        llg = _import()
        self.m = llg.LLMatcher(grammar.tok, grammar.text, log_level=0)
        self.eos = set(grammar.tok.eos_tokens)

    def fill(self, mask_BW: np.ndarray, row: int) -> None:
        """Row `row` of a C-contiguous int32 bitmask [B, words(V)] set to the tokens allowed next."""
        from llguidance.numpy import fill_next_token_bitmask
        fill_next_token_bitmask(self.m, mask_BW, row)

    def advance(self, token: int) -> bool:
        """Follow `token`; True when the sequence ends with it (end-of-text, the grammar complete, or off it)."""
        if token in self.eos:
            return True
        ok = self.m.consume_token(int(token))
        return not ok or self.m.is_stopped()

