"""The tuning bench's folds and corpus hold-outs: no golden fit is scored on a case (or corpus) it learnt from.

The bench itself runs on the real corpora (``python -m kb_retrieval.bench.tuning``, minutes); these tests pin how it
splits the cases.
"""

from __future__ import annotations

import pytest

from kb_retrieval.bench.quality import SETTINGS, Setting
from kb_retrieval.bench.tuning import fold_of, sharing_no_corpus
from kb_retrieval.retrieval.rank_fit import FOLDS

pytestmark = pytest.mark.unit


def test_a_case_falls_in_one_fold_whatever_setting_runs_it():
    # The pool holds a set once per setting that runs it: the fold is the case's, not its place in the pool.
    first_setting = [fold_of(i) for i in range(12)]
    second_setting = [fold_of(i) for i in range(12)]
    assert first_setting == second_setting
    assert set(first_setting) == set(range(FOLDS))


def test_a_held_out_corpus_is_left_out_of_every_setting_that_holds_it():
    alone, mixed, other = Setting("a", ("a",), ()), Setting("a+b", ("a", "b"), ()), Setting("c", ("c",), ())
    settings = [alone, mixed, other]
    assert sharing_no_corpus(alone, settings) == ["c"]
    assert sharing_no_corpus(mixed, settings) == ["c"]
    assert sharing_no_corpus(other, settings) == ["a", "a+b"]


def test_no_public_setting_learns_on_a_setting_that_shares_its_corpus():
    by_name = {s.name: s for s in SETTINGS}
    for name, held_out in by_name.items():
        learn_on = sharing_no_corpus(held_out, SETTINGS)
        assert name not in learn_on
        assert not any(set(by_name[n].corpora) & set(held_out.corpora) for n in learn_on)
