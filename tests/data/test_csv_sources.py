"""CSV and TSV files as data.source (zoo.data.corpus): quoted commas, tabs and newlines read as text, a cell
"NA" or "None" kept as text, an empty cell missing; the LM corpus and the labelled set read them; a .csv
and a .tsv under one source are refused; unsupported types and malformed rows are one-line errors; and
bert_cls batches come from a CSV file."""

import json

import pytest

from conftest import replace
from tests.helpers.tiny_configs import bert as cfg_for
from tests.helpers.tiny_configs import data_cfg
from zoo import tasks
from zoo.data import corpus
from zoo.errors import ZooDataError
from zoo.tasks import classify as classify_data
from zoo.tasks import mlm

# Header, then: a quoted comma, a quoted newline and doubled quote, a cell "NA", an empty text cell.
CSV = ('id,text,label\n'
       '1,"Hello, world",pos\n'
       '2,"two\nlines, and a ""quote""",neg\n'
       '3,NA,None\n'
       '4,,pos\n')
# A quoted tab, unquoted commas, a string label in a tab-separated file.
TSV = ('text\tlabel\n'
       '"a\ttab inside"\tneg\n'
       'commas, stay, in the text\tpos\n')


def write(tmp_path, name, text):
    path = tmp_path / name
    path.write_text(text)
    return str(path)


def test_csv_and_tsv_documents(tmp_path):
    cfg = data_cfg(tmp_path, source=write(tmp_path, "d.csv", CSV))
    # The empty cell is dropped (no document); "NA" stays text (pandas' default would read it as missing).
    assert corpus.load_documents(cfg)["text"] == ["Hello, world", 'two\nlines, and a "quote"', "NA"]
    cfg = data_cfg(tmp_path, source=write(tmp_path, "d.tsv", TSV))
    assert corpus.load_documents(cfg)["text"] == ["a\ttab inside", "commas, stay, in the text"]


def test_csv_directory_reads_every_file(tmp_path):
    (tmp_path / "src").mkdir()
    write(tmp_path, "src/b.csv", "text,n\nsecond,2\n")
    write(tmp_path, "src/a.csv", "text,n\nfirst,1\n")
    cfg = data_cfg(tmp_path, source=str(tmp_path / "src"))
    assert corpus.load_documents(cfg)["text"] == ["first", "second"]


def test_csv_and_tsv_labelled_examples(tmp_path):
    path = write(tmp_path, "d.csv", CSV.replace("4,,pos\n", ""))
    d = data_cfg(tmp_path, source=path)
    ds = classify_data.load_examples(d)
    assert ds["text"] == ["Hello, world", 'two\nlines, and a "quote"', "NA"]
    assert ds["id"] == [1, 2, 3]  # a column of whole numbers reads as int64
    ids, names = classify_data.resolve_labels(ds, d, 3)
    assert names == ["None", "neg", "pos"] and ids.tolist() == [2, 1, 0]  # "None" is a label, not missing
    d = data_cfg(tmp_path, source=write(tmp_path, "d.tsv", TSV), label_names="pos,neg")
    ds = classify_data.load_examples(d)
    ids, names = classify_data.resolve_labels(ds, d, 2)
    assert ds["text"] == ["a\ttab inside", "commas, stay, in the text"]
    assert names == ["pos", "neg"] and ids.tolist() == [1, 0]
    # Int labels in a TSV: ids as written.
    d = data_cfg(tmp_path, source=write(tmp_path, "n.tsv", "text\tlabel\nx, y\t1\nz\t0\n"))
    ids, names = classify_data.resolve_labels(classify_data.load_examples(d), d, 2)
    assert ids.tolist() == [1, 0] and names == ["0", "1"]


def test_empty_text_cell_is_named_for_classification(tmp_path):
    cfg = replace(cfg_for("bert_cls", str(tmp_path)), data=dict(source=write(tmp_path, "d.csv", CSV)),
                  model=dict(num_classes=0))
    with pytest.raises(ZooDataError) as e:
        tasks.check_data(cfg)
    assert str(e.value) == ("row 3 of data.text_column='text' is empty (1 empty rows); remove them from the "
                            "source")


def test_mixed_csv_and_tsv_are_refused(tmp_path):
    write(tmp_path, "a.csv", "text\nx\n")
    write(tmp_path, "b.tsv", "text\ny\n")
    with pytest.raises(ZooDataError) as e:
        corpus.load_documents(data_cfg(tmp_path, source=str(tmp_path)))
    assert str(e.value) == f"data.source={str(tmp_path)!r} mixes file types .csv, .tsv; point it at one type"


def test_unsupported_type_lists_csv_and_tsv(tmp_path):
    path = write(tmp_path, "notes.xlsx", "x")
    with pytest.raises(ZooDataError) as e:
        corpus.load_documents(data_cfg(tmp_path, source=path))
    assert str(e.value) == (f"data.source={path!r} has files of unsupported type .xlsx; "
                            f"supported: .txt, .json, .jsonl, .parquet, .csv, .tsv")


def test_malformed_csv_names_the_line(tmp_path):
    path = write(tmp_path, "bad.csv", "text,label\na,1\nb,2,3\n")
    with pytest.raises(ZooDataError) as e:
        corpus.load_documents(data_cfg(tmp_path, source=path))
    assert str(e.value) == (f"data.source={path!r} could not be read as csv (ParserError: Error tokenizing data. "
                            f"C error: Expected 2 fields in line 3, saw 3)")


def test_bert_cls_batches_from_a_csv_file(tmp_path):
    """The whole bert_cls data path on a CSV (check, class count, encoding, batches); training itself
    reads only batches, so a run (seconds of compiling) would test nothing more about CSV."""
    rows = "".join(f'"{w} number {i}, of {n}",{w}\n' for i in range(24) for w, n in (("red", "a"), ("blue", "b")))
    src = write(tmp_path, "d.csv", "text,label\n" + rows)
    cfg = replace(cfg_for("bert_cls", str(tmp_path), source=src), model=dict(num_classes=0))
    cfg = tasks.check_data(cfg)
    assert cfg.model.num_classes == 2
    data = tasks.build(cfg).make_data(cfg, 0, 1)
    assert json.loads(data.files["labels.json"]) == ["blue", "red"]
    b = data.train(0)
    sp = mlm.bert_specials(data.tokenizer)
    for ids_T, valid_T, label in zip(b["inputs"], b["valid"], b["labels"]):
        text = data.tokenizer.decode([int(t) for t in ids_T[valid_T] if t not in (sp.cls, sp.sep)])
        assert text.startswith(("blue", "red")[label] + " number ") and ", of " in text


def test_a_quote_left_open_is_named_not_read_as_merged_rows(tmp_path):
    """A stray quote at row 10 and another at row 35 made pandas read 26 rows as one (texts merged, labels
    shifted): refused naming the row and cell; a real multi-line cell with a comma in it still reads."""
    q = '"'
    lines = ["text,label"] + [f"{q if i == 10 else ''}sentence {i}{q if i == 35 else ''},{i % 3}" for i in range(50)]
    bad = tmp_path / "bad.csv"
    bad.write_text("\n".join(lines) + "\n")
    with pytest.raises(ZooDataError) as e:
        corpus.load_local(data_cfg(tmp_path, source=str(bad)))
    assert "row 10's 'text' cell spans 26 lines, and 24 of them read as whole rows ('sentence 11,2')" in str(e.value)
    good = tmp_path / "good.csv"
    good.write_text('text,label\n"a line\nover two, with a comma",0\nplain,1\n')
    assert len(corpus.load_local(data_cfg(tmp_path, source=str(good)))) == 2
