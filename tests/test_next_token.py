"""``probes_next_token``: every prompt and continuation read back from its source text, the match rule, errors."""

from __future__ import annotations

import collections

import pytest

from loader_fixtures import write_data_dir
from lm_eval_probes.tasks import next_token
from lm_eval_probes.tasks.next_token import FORMS, SOURCES, cut, next_token_dataset, next_token_match
from lm_eval_probes.tasks.seeded_generation import seeded_random


@pytest.fixture(scope="module")
def docs(tmp_path_factory):
    data = write_data_dir(tmp_path_factory.mktemp("data"), n=12)
    return list(next_token_dataset(n_per_source=6, probes_data_dir=str(data))["test"]), str(data)


def test_every_document_is_a_cut_of_its_source_text(docs):
    docs, data = docs
    texts = {name: load(6, 1234, {"probes_data_dir": data}) for name, load in SOURCES.items()}
    assert len(docs) == 6 * len(SOURCES)
    assert set(collections.Counter(doc["form"] for doc in docs)) == set(FORMS)
    for doc in docs:
        index = int(doc["id"].rsplit("-", 1)[1])
        text, question, answer = texts[doc["source"]][index]
        forms = list(next_token._forms_from(index))  # the i-th text's form is FORMS[i % 3], or the next that cuts it
        assert forms[0] == FORMS[index % 3]
        for skipped in forms[: forms.index(doc["form"])]:
            assert cut(text, question, answer, skipped, seeded_random("x")) is None
        whole = " ".join(text.split())
        if doc["form"] == "answer":
            assert doc["prompt"] == question and question.endswith("Answer:") and doc["continuation"] == f" {answer}"
        elif doc["form"] == "open":  # after a whole word, at least four in
            assert whole.startswith(doc["prompt"] + doc["continuation"])
            assert whole[len(doc["prompt"])] == " " and len(doc["prompt"].split()) >= 4
        else:  # inside a word of six letters or more, at least three words in, two letters or more into it
            assert whole.startswith(doc["prompt"] + doc["continuation"])
            word = whole[: len(doc["prompt"]) + len(doc["continuation"])].split()[len(doc["prompt"].split()) - 1]
            assert doc["prompt"].split()[-1] != word and word.startswith(doc["prompt"].split()[-1])
            assert len(doc["prompt"].split()[-1]) >= 2 and len(doc["prompt"].split()) >= 4
            assert sum(c.isalpha() for c in word) >= 6


def test_documents_alternate_over_the_sources_and_are_the_same_every_time(docs):
    docs, data = docs
    assert [doc["source"] for doc in docs[: len(SOURCES)]] == list(SOURCES)  # any --limit prefix holds them all
    again = list(next_token_dataset(n_per_source=6, probes_data_dir=data)["test"])
    assert again == docs
    other = list(next_token_dataset(n_per_source=6, seed=7, probes_data_dir=data)["test"])
    assert other != docs


def test_a_subset_of_sources_offline():
    docs = list(next_token_dataset(n_per_source=3, sources="synth_recall+synth_arith")["test"])
    assert [doc["source"] for doc in docs] == ["synth_recall", "synth_arith"] * 3


def test_a_text_that_cannot_be_cut_takes_the_next_form():
    rng = seeded_random("test")
    assert cut("two words", "Q: two words\nAnswer:", "x", "open", rng) is None
    assert cut("all tiny wee bits of it", "Q\nAnswer:", "x", "inside", rng) is None
    assert list(next_token._forms_from(1)) == ["inside", "answer", "open"]
    with pytest.raises(ValueError, match="unknown form"):
        cut("a b c d e f", "q", "a", "sideways", rng)


@pytest.mark.parametrize("generated,continuation,match", [
    (" eggs", " eggs per day", 1),
    ("eggs", " eggs per day", 1),   # a tokenizer that decodes a lone token without its space
    (" egg", " eggs per day", 1),   # a prefix of the next word
    (" ducks", " eggs per day", 0),
    ("sed", "sed the value", 1),
    ("\n", " eggs", 0),              # blank
    ("", " eggs", 0),
])
def test_next_token_match(generated, continuation, match):
    assert next_token_match({"continuation": continuation}, [generated]) == {"next_token_match": match}


@pytest.mark.parametrize("kwargs,message", [
    ({"sources": "gsm8k+wikipedia"}, "unknown source"),
    ({"n_per_source": 0, "sources": "synth_arith"}, "n_per_source must be >= 1"),
])
def test_bad_arguments(kwargs, message):
    with pytest.raises(ValueError, match=message):
        next_token_dataset(**kwargs)
