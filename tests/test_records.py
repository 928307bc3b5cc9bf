"""Records survive pickling (lm_eval's gather_object), JSON, filters; aggregations match scipy."""

from __future__ import annotations

import dataclasses
import json
import math
import pickle
import warnings

import numpy as np
import pytest
from scipy import stats

from lm_eval_probes.estimators import response_confidence
from lm_eval_probes.metrics import UndefinedMetricWarning, spearman_score
from lm_eval_probes.records import ProbeLL, ProbeStr, ResponseProbe, probe_of, with_probe

PROBE = ResponseProbe(n_tokens=3, mean_token_logprob=-0.5, tcb_log10_mean=2.5, tcb_log10_min=2.0, tcb_argmin=1,
                      bte_profile=(0.1, 0.2), bte_energy=0.15)


def test_pickle_round_trip_keeps_probes():
    for response in (ProbeLL((-1.5, True), PROBE), ProbeStr("42", PROBE)):
        back = pickle.loads(pickle.dumps(response))
        assert back == response and type(back) is type(response) and back.probe == PROBE


def test_each_probe_s_values_travel_in_its_typed_record_and_older_layouts_unpickle():
    """Each enabled probe's values are one instance of its record dataclass (``None`` where its probe was off), read
    with ``of`` or by field with ``get``; a record pickled with every probe field as an attribute of its own (an older
    ``--use_cache`` table) or in one flat ``probe_fields`` mapping unpickles to the same record."""
    from lm_eval_probes.probes.bte.probe import BteRecord
    from lm_eval_probes.probes.tcb.probe import TcbRecord

    assert PROBE.by_probe == {"tcb": TcbRecord(tcb_log10_mean=2.5, tcb_log10_min=2.0, tcb_argmin=1),
                              "bte": BteRecord(bte_energy=0.15, bte_profile=(0.1, 0.2))}
    assert isinstance(PROBE.of("tcb"), TcbRecord) and PROBE.of("tcb").tcb_argmin == 1 and PROBE.of("omega") is None
    assert PROBE.get("tcb_argmin") == 1 and PROBE.get("omega") is None and PROBE.get("answer_states") is None
    moved = dataclasses.replace(PROBE, omega=1.5)
    assert moved.of("omega").omega == 1.5 and moved.get("bte_energy") == 0.15 and moved.of("bte") == PROBE.of("bte")
    flat = {"tcb_log10_mean": 2.5, "tcb_log10_min": 2.0, "tcb_argmin": 1, "bte_profile": (0.1, 0.2), "bte_energy": 0.15}
    own = {name: value for name, value in PROBE.__dict__.items() if name != "by_probe"}
    for older_layout in ({**own, **flat, "omega": None, "answer_states": None}, {**own, "probe_fields": flat}):
        older = object.__new__(ResponseProbe)
        older.__dict__.update(older_layout)
        assert pickle.loads(pickle.dumps(older)) == PROBE
    with pytest.raises(KeyError, match="omeg.*Did you mean 'omega'"):
        PROBE.of("omeg")
    with pytest.raises(TypeError, match="must be a TcbRecord"):
        ResponseProbe(n_tokens=1, mean_token_logprob=0.0, by_probe={"tcb": BteRecord(bte_energy=1.0)})


def test_responses_behave_like_plain_values():
    ll, text = ProbeLL((-1.5, False), PROBE), ProbeStr(" 42", PROBE)
    assert ll == (-1.5, False) and ll[0] == -1.5 and text.strip() == "42"
    assert json.loads(json.dumps({"r": ll, "s": text})) == {"r": [-1.5, False], "s": " 42"}
    assert probe_of(text.strip()) is None and probe_of(with_probe(text.strip(), PROBE)) is PROBE
    assert type(text)("x") == "x"  # lm_eval rebuilds the gold with type(result)(gold)


def test_record_is_json_native():
    assert json.loads(json.dumps(PROBE.to_dict()))["bte_profile"] == [0.1, 0.2]
    assert math.isclose(response_confidence(PROBE), math.exp(-0.5))


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


def test_partial_spearman_matches_residual_rank_regression():
    import numpy as np

    from lm_eval_probes.metrics import partial_spearman_score

    rng = np.random.default_rng(0)
    length = rng.integers(5, 400, size=200).astype(float)
    difficulty = np.digitize(length + rng.normal(0, 80, 200), [100, 200, 300]) + 1.0
    value = 0.001 * length + rng.normal(0, 0.05, 200)
    ranks = [stats.rankdata(c) for c in (value, difficulty, length)]
    design = np.column_stack([np.ones(200), ranks[2]])
    resid = [r - design @ np.linalg.lstsq(design, r, rcond=None)[0] for r in ranks[:2]]
    want = np.corrcoef(*resid)[0, 1]
    got = partial_spearman_score(list(zip(value, difficulty, length)))
    assert got == pytest.approx(want, abs=1e-12)
    assert abs(got) < 0.25 < spearman_score(list(zip(value, difficulty)))  # the raw ρ was length


def test_partial_spearman_undefined_cases():
    from lm_eval_probes.metrics import partial_spearman_score

    constant_length = [(1, 1, 5), (2, 3, 5), (3, 2, 5), (4, 4, 5)]
    assert partial_spearman_score(constant_length) == pytest.approx(spearman_score([r[:2] for r in constant_length]))
    with pytest.warns(UndefinedMetricWarning):
        assert math.isnan(partial_spearman_score([(1, 1, 1), (2, 2, 2), (3, 3, 3)]))  # length explains all


def test_probe_rows_with_and_without_difficulty():
    from lm_eval_probes.tasks.probe_task import probe_metric_values

    rows = probe_metric_values(PROBE, 0.7, 3.0, declared=True)
    assert rows["bte_spearman"] == (0.15, 3.0) and rows["bte_spearman_partial"] == (0.15, 3.0, 3)
    assert rows["length_spearman"] == (3, 3.0) and rows["difficulty_missing"] == 0
    assert "bte_spearman_partial_prompt" not in rows  # the record knows no prompt length
    with_prompt = probe_metric_values(dataclasses.replace(PROBE, prompt_tokens=40), 0.7, 3.0, declared=True)
    assert with_prompt["bte_spearman_partial_prompt"] == (0.15, 3.0, 40) and with_prompt["prompt_length_spearman"] == (40, 3.0)
    missing = probe_metric_values(PROBE, 0.7, None, declared=True)
    assert missing["difficulty_missing"] == 1  # an unlabelled document's ρ records carry no difficulty (skipped)
    assert missing["bte_spearman"] == (0.15, None) and missing["bte_spearman_partial"] == (0.15, None, 3)
    undeclared = probe_metric_values(PROBE, 0.7, None)
    assert "difficulty_missing" not in undeclared and "bte_energy" in undeclared


def _states(shape, dtype=np.float32, seed=0):
    import numpy as np

    from lm_eval_probes.records import LayerStates

    values = np.random.default_rng(seed).normal(size=shape).astype(dtype)
    return LayerStates(tuple(range(3, 3 + shape[0])), values)


def test_states_and_reader_records_round_trip_pickle_and_json():
    from lm_eval_probes.records import LayerStates, ReaderRecord

    probe = dataclasses.replace(
        PROBE, answer_states=_states((3, 16)), prompt_states=_states((3, 16), seed=1),
        tail_states=_states((3, 3, 16), np.float16, seed=2), token_logprobs=(-0.1, -0.2, -1.2), token_ends=(2, 5, 7),
        answer_span=(1, 3),
    )
    for value in (probe, ReaderRecord(probe.get("answer_states"), 1, group=4), probe.get("tail_states")):
        assert pickle.loads(pickle.dumps(value)) == value
        back = type(value).from_dict(json.loads(json.dumps(value.to_dict(), allow_nan=False)))
        assert back == value
    assert probe != dataclasses.replace(probe, answer_states=_states((3, 16), seed=5))
    record = ReaderRecord(probe.get("answer_states"), 1)
    assert len(str(record)) < 200 and len(json.dumps({"lcr_auroc": record}, default=str)) < 200  # --log_samples
    with pytest.raises(ValueError, match="label must be 0 or 1"):
        ReaderRecord(probe.get("answer_states"), 2)
    with pytest.raises(ValueError, match=r"\[3, H\]"):
        LayerStates((1, 2, 3), np.zeros((2, 4), dtype=np.float32))


def test_mean_positions_of_per_position_states():
    tail = _states((2, 5, 4))
    np.testing.assert_allclose(tail.mean_positions(1, 4).values, tail.values[:, 1:4].mean(1), rtol=1e-6)
    with pytest.raises(ValueError, match="cannot average"):
        tail.mean_positions(3, 3)


def test_aggregations_report_undefined_as_json_null():
    from lm_eval_probes.harness.registry import task_aggregation
    from lm_eval_probes.metrics import CalibrationOptions
    from lm_eval_probes.rows import ROWS

    rows = {row.name: task_aggregation(row, CalibrationOptions()) for row in ROWS}
    with pytest.warns(UndefinedMetricWarning):
        assert rows["bte_spearman"]([(0.1, 1), (0.2, 1), (0.3, 1)]) is None
    with pytest.warns(UndefinedMetricWarning):
        assert rows["selective_auroc"]([(0.9, 1), (0.8, 1)]) is None
    assert json.dumps({"x": rows["ece"]([(0.9, 1), (0.6, 0)])}, allow_nan=False)


@pytest.mark.parametrize("scale", [1.0, 1e6])
def test_tail_states_keep_values_beyond_float16(scale):
    """Gemma's residual stream exceeds float16's ±65504: the kept tail falls back to float32 there."""
    import torch

    from lm_eval_probes.capture.positions import PositionProbes
    from lm_eval_probes.probes.reader.probe import ReaderOptions, ReaderPositions

    states = torch.linspace(-3.0, 3.0, 2 * 5 * 4, dtype=torch.float32).reshape(2, 5, 4) * scale
    reader = ReaderPositions(ReaderOptions(layers=(1, 2), tail=3), num_layers=4)
    probes = PositionProbes(num_positions=5, measured={"reader": (reader, {"states": states})})
    probe = probes.summarize(0, 5, mean_token_logprob=-1.0, generation=True)
    tail = probe.get("tail_states").values
    assert tail.dtype == (np.float16 if scale == 1.0 else np.float32) and np.isfinite(tail).all()
    np.testing.assert_allclose(tail, states[:, -3:].numpy(), rtol=1e-3)
    np.testing.assert_allclose(probe.get("tail_states").mean_positions(1, 3).values, states[:, -2:].double().mean(1).numpy(), rtol=1e-3)
