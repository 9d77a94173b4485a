"""zoo-serve's `/v1/embeddings` (OpenAI's shape): `input` a string or a list of them, `encoding_format` "float" (the
default) or "base64" (little-endian float32, what the openai client asks for by default and decodes), `dimensions`
the model's own width or, for a checkpoint whose config.json declares Matryoshka widths (zoo.api.embed.matryoshka),
one of those (each vector cut and normalised again, as vLLM does). The vectors are Pretrained.embed's, pooled and
normalised as the checkpoint's sentence-transformers files say (zoo.api.embed), equal to SentenceTransformer.encode's.
A decoder's server computes them between two decode chunks, on the engine's thread; an encoder's server (zoo-serve
of an all-MiniLM-L6-v2 directory) answers only this route and /v1/models, a request at a time."""

from __future__ import annotations

import base64

import numpy as np

from zoo.serve.request_checks import ApiError, _field

FIELDS = ("input", "model", "encoding_format", "dimensions", "user")


def texts_of(body: dict, max_inputs: int) -> list[str]:
    """The request's texts; token-id input, empty texts and more than `max_inputs` refused with OpenAI's errors."""
    unknown = sorted(set(body) - set(FIELDS))
    if unknown:
        raise ApiError(400, f"'{unknown[0]}' is not a field of an embeddings request; it takes "
                            f"{', '.join(FIELDS)}", param=unknown[0])
    given = body.get("input")
    texts = [given] if isinstance(given, str) else given
    if isinstance(texts, list) and texts and all(isinstance(t, int) or isinstance(t, list) for t in texts):
        raise ApiError(400, "'input' as token ids is not supported by this server; send the text", param="input")
    if not isinstance(texts, list) or not texts or not all(isinstance(t, str) and t for t in texts):
        raise ApiError(400, "'input' must be a non-empty string or a list of them", param="input")
    if len(texts) > max_inputs:
        raise ApiError(413, f"'input' holds {len(texts)} texts; this server takes at most {max_inputs} a request "
                            f"(--max-prompts)", param="input", code="too_many_inputs")
    return texts


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
    tokens = sum(len(x) for x in lm.tokenizer.encode_batch(texts))
    encode = (lambda v: base64.b64encode(np.asarray(v, "<f4").tobytes()).decode()) if fmt == "base64" \
        else (lambda v: [float(x) for x in v])
    return {"object": "list", "model": model_id,
            "data": [{"object": "embedding", "index": i, "embedding": encode(v)} for i, v in enumerate(vectors)],
            "usage": {"prompt_tokens": tokens, "total_tokens": tokens}}
