"""zoo-serve's `/v1/embeddings` (OpenAI's shape): `input` a string or a list of them, or token ids (a list of ints,
or a list of lists of them: the model's own ids without special tokens, framed and cut as a text's, so equal to
the text's vector), `encoding_format` "float" (the default) or "base64" (little-endian float32, what the openai
client asks for by default and decodes), `dimensions` the model's own width or, for a checkpoint whose config.json
declares Matryoshka widths (zoo.api.embed.matryoshka), one of those (each vector cut and normalised again, as vLLM
does). The vectors are Pretrained.embed's, pooled and normalised as the checkpoint's sentence-transformers files say
(zoo.api.embed), equal to SentenceTransformer.encode's. A decoder's server computes them between two decode chunks,
on the engine's thread; an encoder's server (zoo-serve of an all-MiniLM-L6-v2 directory) answers only this route and
/v1/models, a request at a time."""

from __future__ import annotations

import base64

import numpy as np

from zoo.serve.request_checks import ApiError, _field

FIELDS = ("input", "model", "encoding_format", "dimensions", "user")


class TokenIds(list):
    """The request's inputs given as token ids: a list of lists of ints."""


def _ids(x) -> bool:
    return isinstance(x, int) and not isinstance(x, bool)


def texts_of(body: dict, max_inputs: int) -> list[str] | TokenIds:
    """The request's texts, or its token-id lists (TokenIds); empty inputs and more than `max_inputs` refused with
    OpenAI's errors."""
    unknown = sorted(set(body) - set(FIELDS))
    if unknown:
        raise ApiError(400, f"'{unknown[0]}' is not a field of an embeddings request; it takes "
                            f"{', '.join(FIELDS)}", param=unknown[0])
    given = body.get("input")
    texts = [given] if isinstance(given, str) else given
    if isinstance(texts, list) and texts and all(_ids(t) for t in texts):
        texts = TokenIds([texts])  # one text's ids
    elif isinstance(texts, list) and texts and all(isinstance(t, list) for t in texts):
        if not all(t and all(_ids(x) for x in t) for t in texts):
            raise ApiError(400, "'input' as token ids must be a non-empty list of ints or a list of them",
                           param="input")
        texts = TokenIds(texts)
    elif not isinstance(texts, list) or not texts or not all(isinstance(t, str) and t for t in texts):
        raise ApiError(400, "'input' must be a non-empty string, a list of them, a list of token ids or a list of "
                            "those", param="input")
    if len(texts) > max_inputs:
        raise ApiError(413, f"'input' holds {len(texts)} texts; this server takes at most {max_inputs} a request "
                            f"(--max-prompts)", param="input", code="too_many_inputs")
    return texts


def vectors(lm, inputs: list[str] | TokenIds) -> np.ndarray:
    """float32[N, D] of texts (Pretrained.embed) or of token ids (zoo.api.embed.embed_ids); an id out of the
    vocabulary is a 400."""
    if not isinstance(inputs, TokenIds):
        return lm.embed(inputs)
    from zoo.api.embed import embed_ids
    from zoo.errors import ZooError
    try:
        return embed_ids(lm, inputs)
    except ZooError as e:
        raise ApiError(400, f"'input' {e}", param="input") from None


def _widths(widths: tuple, width: int) -> str:
    shown = sorted(set(widths) | {width})
    return f"1 to {width}" if len(shown) == width else ", ".join(map(str, shown))


def response(lm, body: dict, texts: list[str], vectors: np.ndarray, model_id: str) -> dict:
    """OpenAI's embeddings response of `vectors` ([N, D] float32) in the encoding the body asks for."""
    fmt = _field(body, "encoding_format", str, "float", check=lambda v: v in ("float", "base64"),
                 what="'float' or 'base64'")
    from zoo.api.embed import matryoshka, pooling_of, truncate
    width, widths = vectors.shape[1], matryoshka(lm) or ()
    what = f"one of the widths the model declares (config.json), {_widths(widths, width)}" if widths else \
        f"the model's own width, {width} (its config.json declares no Matryoshka widths to cut to)"
    dims = _field(body, "dimensions", int, width, check=lambda v: v == width or v in widths, what=what)
    if dims < width:
        vectors = truncate(vectors, dims, pooling_of(lm).normalize)
    tokens = sum(len(x) for x in (texts if isinstance(texts, TokenIds) else lm.tokenizer.encode_batch(texts)))
    encode = (lambda v: base64.b64encode(np.asarray(v, "<f4").tobytes()).decode()) if fmt == "base64" \
        else (lambda v: [float(x) for x in v])
    return {"object": "list", "model": model_id,
            "data": [{"object": "embedding", "index": i, "embedding": encode(v)} for i, v in enumerate(vectors)],
            "usage": {"prompt_tokens": tokens, "total_tokens": tokens}}
