"""zoo.data.corpus: documents from the built-in corpus, local text, JSONL and Parquet files, the hub
(its failures in one line, its source syntax), and errors that name the culprit."""

import json

import pytest

from tests.helpers.tiny_configs import data_cfg
from zoo.configuration import DataConfig
from zoo.data import corpus
from zoo.errors import ZooDataError


def test_builtin_documents():
    from pydoc_data.topics import topics

    docs = corpus.load_documents(DataConfig())["text"]
    assert docs == [topics[k] for k in sorted(topics)] and len(docs) > 50


def test_local_txt_dir_and_glob(tmp_path):
    for name, text in [("b.txt", "second\nfile\n"), ("a.txt", "first file"), ("c.txt", "  \n")]:
        (tmp_path / name).write_text(text)
    cfg = data_cfg(tmp_path, source=str(tmp_path))
    assert corpus.load_documents(cfg)["text"] == ["first file", "second\nfile\n"]  # one row per file, blanks dropped
    cfg = data_cfg(tmp_path, source=str(tmp_path / "b*.txt"))
    assert corpus.load_documents(cfg)["text"] == ["second\nfile\n"]


def test_local_jsonl_with_text_column(tmp_path):
    path = tmp_path / "d.jsonl"
    path.write_text("\n".join(json.dumps({"body": f"doc {i}", "id": i}) for i in range(3)))
    ds = corpus.load_documents(data_cfg(tmp_path, source=str(path), text_column="body"))
    assert ds.column_names == ["text"] and ds["text"] == ["doc 0", "doc 1", "doc 2"]


def test_local_parquet(tmp_path):
    import datasets

    path = tmp_path / "d.parquet"
    datasets.Dataset.from_dict({"text": ["alpha", "", "beta"], "n": [1, 2, 3]}).to_parquet(str(path))
    assert corpus.load_documents(data_cfg(tmp_path, source=str(path)))["text"] == ["alpha", "beta"]


def test_document_errors_name_the_culprit(tmp_path):
    missing = str(tmp_path / "nowhere.txt")
    with pytest.raises(ZooDataError, match="nowhere.txt"):
        corpus.load_documents(data_cfg(tmp_path, source=missing))
    (tmp_path / "notes.md").write_text("x")
    with pytest.raises(ZooDataError, match=r"unsupported type \.md; supported: \.txt, \.json, \.jsonl, \.parquet"):
        corpus.load_documents(data_cfg(tmp_path, source=str(tmp_path / "notes.md")))
    path = tmp_path / "d.jsonl"
    path.write_text(json.dumps({"body": "x", "id": 1}))
    with pytest.raises(ZooDataError) as e:
        corpus.load_documents(data_cfg(tmp_path, source=str(path), text_column="text"))
    assert str(e.value) == f"data.text_column='text' is not a column of {path}; columns: body, id"
    path.write_text(json.dumps({"text": ""}) + "\n" + json.dumps({"text": "   "}))
    with pytest.raises(ZooDataError, match=f"data.source='{path}' has no non-empty text"):
        corpus.load_documents(data_cfg(tmp_path, source=str(path)))


def test_hub_failure_is_one_line(monkeypatch, tmp_path):
    seen = []

    def fail(name, config, split):
        seen.append((name, config, split))
        raise ConnectionError("Couldn't reach it\nmore detail")

    monkeypatch.setattr(corpus.datasets, "load_dataset", fail)
    monkeypatch.setattr(corpus, "hub_reachable", lambda timeout=3.0: True)
    with pytest.raises(ZooDataError) as e:
        corpus.load_documents(data_cfg(tmp_path, source="hub:owner/name/cfg", split="validation"))
    assert str(e.value) == ("data.source='hub:owner/name/cfg': dataset 'owner/name' could not be loaded "
                            "(ConnectionError: Couldn't reach it)")
    assert seen == [("owner/name", "cfg", "validation")]


@pytest.mark.parametrize("source, parsed", [
    ("hub:openwebtext", ("openwebtext", None)),
    ("hub:wikitext/wikitext-103-raw-v1", ("wikitext", "wikitext-103-raw-v1")),
    ("hub:Salesforce/wikitext/wikitext-2-raw-v1", ("Salesforce/wikitext", "wikitext-2-raw-v1")),
    ("hub:Skylion007/openwebtext/", ("Skylion007/openwebtext", None)),
])
def test_hub_source_syntax(source, parsed):
    assert corpus.parse_hub(source) == parsed


def test_an_unreachable_hub_fails_in_seconds_naming_the_source(monkeypatch, tmp_path):
    """Offline, a hub dataset not in the local cache is one error in seconds, not a minute of retries."""
    import time
    from zoo.data import corpus
    monkeypatch.setattr(corpus, "hub_reachable", lambda timeout=3.0: False)
    t0 = time.perf_counter()
    with pytest.raises(ZooDataError) as e:
        corpus.load_hub(DataConfig(source="hub:nonexistent/ds", cache_dir=str(tmp_path)))
    assert time.perf_counter() - t0 < 15
    assert str(e.value).startswith("data.source='hub:nonexistent/ds': dataset 'nonexistent' could not be loaded")
    assert str(e.value).endswith("huggingface.co is unreachable and it is not in the local cache")
