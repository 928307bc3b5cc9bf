"""Records survive pickling (lm_eval's gather_object), JSON, filters; aggregations match scipy."""

from __future__ import annotations

import json
import math
import pickle
import warnings

import pytest
from scipy import stats

from lm_eval_probes.metrics import UndefinedMetricWarning, spearman_score
from lm_eval_probes.records import ProbeLL, ProbeStr, ResponseProbe, probe_of, with_probe

PROBE = ResponseProbe(n_tokens=3, mean_token_logprob=-0.5, tcb_log10_mean=2.5, tcb_log10_min=2.0, tcb_argmin=1,
                      bte_profile=(0.1, 0.2), bte_energy=0.15)


def test_pickle_round_trip_keeps_probes():
    for response in (ProbeLL((-1.5, True), PROBE), ProbeStr("42", PROBE)):
        back = pickle.loads(pickle.dumps(response))
        assert back == response and type(back) is type(response) and back.probe == PROBE


def test_responses_behave_like_plain_values():
    ll, text = ProbeLL((-1.5, False), PROBE), ProbeStr(" 42", PROBE)
    assert ll == (-1.5, False) and ll[0] == -1.5 and text.strip() == "42"
    assert json.loads(json.dumps({"r": ll, "s": text})) == {"r": [-1.5, False], "s": " 42"}
    assert probe_of(text.strip()) is None and probe_of(with_probe(text.strip(), PROBE)) is PROBE
    assert type(text)("x") == "x"  # lm_eval rebuilds the gold with type(result)(gold)


def test_record_is_json_native():
    assert json.loads(json.dumps(PROBE.to_dict()))["bte_profile"] == [0.1, 0.2]
    assert math.isclose(PROBE.geometric_mean_probability, math.exp(-0.5))


def test_spearman_matches_scipy_and_skips_missing():
    pairs = [(0.1, 1), (0.3, 2), (0.2, 3), (0.5, 4), (None, 5), (float("nan"), 2), (0.4, None)]
    want = stats.spearmanr([0.1, 0.3, 0.2, 0.5], [1, 2, 3, 4]).statistic
    assert spearman_score(pairs) == pytest.approx(want)


def test_spearman_undefined_warns_and_is_nan():
    with pytest.warns(UndefinedMetricWarning):
        assert math.isnan(spearman_score([(0.1, 1), (0.2, 1), (0.3, 1)]))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        with pytest.raises(UndefinedMetricWarning):
            spearman_score([])
