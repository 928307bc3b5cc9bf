"""One :class:`~lm_eval_probes.capture.plan.ProbePlan` per loaded model: built once at load, read by every call."""

from __future__ import annotations

import dataclasses

import pytest
from lm_eval.api.instance import Instance

from test_diffusion import MODEL_ARGS, generate, masked_lm_dir, mask_tokenizer  # noqa: F401
from lm_eval_probes import registry
from lm_eval_probes.capture import plan as plan_module
from lm_eval_probes.capture.plan import ProbePlan
from lm_eval_probes.capture.positions import position_probes
from lm_eval_probes.config import ProbeConfig
from lm_eval_probes.models.autoregressive import ProbeHFLM
from lm_eval_probes.models.diffusion import DiffusionProbeHFLM
from lm_eval_probes.records import probe_of

LL = [("Question: 2 + 2 =", " 4"), ("Question: 2 + 2 =", " 5"), ("The sky is", " blue")]
PROMPTS = ["Question: 2 + 2 =", "The sky is"]


def _planned_once(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """Each probe's :attr:`~lm_eval_probes.api.Probe.position_probe` call from here on, by probe name (a plan builds
    them)."""
    built: list[str] = []

    def counting(probe):
        def build(options, num_layers):
            built.append(probe.name)
            return probe.position_probe(options, num_layers)

        build.reads_lens = getattr(probe.position_probe, "reads_lens", True)  # read from the class by hf-probes-diffusion
        return dataclasses.replace(probe, position_probe=build)

    counted = tuple(probe if probe.position_probe is None else counting(probe) for probe in registry.probes())
    monkeypatch.setattr(registry, "probes", lambda: counted)
    return built


def _no_more_plans(monkeypatch: pytest.MonkeyPatch) -> None:
    def refuse(*_args, **_kwargs):
        raise AssertionError("a plan was built after load")

    monkeypatch.setattr(plan_module.ProbePlan, "of", classmethod(refuse))
    monkeypatch.setattr(plan_module.ProbePlan, "_planned", classmethod(refuse))


def test_hf_probes_plans_once_at_load_and_every_call_reads_that_plan(tiny_model_dir, monkeypatch):
    """``probes=all``: every enabled probe's position probe is built once, at load; loglikelihood and generation (both
    capture modes) build none."""
    built = _planned_once(monkeypatch)
    lm = ProbeHFLM(pretrained=tiny_model_dir("llama"), device="cpu", batch_size=2, probes="all",
                   probe_gen_capture="generate")
    assert sorted(built) == sorted(lm.plan.captures) and lm.plan.config is lm.probe_config
    assert lm.probes_skipped == dict(lm.plan.skipped) and lm.kept_layers == lm.plan.kept_layers
    _no_more_plans(monkeypatch)
    answers = lm.loglikelihood([Instance("loglikelihood", {}, r, 0, ("t", i, 1)) for i, r in enumerate(LL)])
    texts = lm.generate_until([Instance("generate_until", {}, (p, {"until": ["\n"], "max_gen_toks": 4}), 0, ("t", i, 1))
                               for i, p in enumerate(PROMPTS)])
    assert all(probe_of(a) is not None for a in answers) and all(probe_of(t) is not None for t in texts)
    assert sorted(built) == sorted(lm.plan.captures)  # still the load's calls only


def test_hf_probes_diffusion_plans_once_before_any_weight_loads(masked_lm_dir, monkeypatch):
    built = _planned_once(monkeypatch)
    lm = DiffusionProbeHFLM(pretrained=masked_lm_dir("bert"), device="cpu", batch_size=2, probes="all", **MODEL_ARGS)
    # each probe's position probe once (those asking for an autoregressive capture then skipped, before any weight)
    assert len(built) == len(set(built)) and set(built) == set(lm.plan.captures) | set(lm.probes_skipped) & set(built)
    assert lm.plan.captures and lm.state_layers == lm.plan.state_layers
    before = list(built)
    _no_more_plans(monkeypatch)
    texts = generate(lm, ["<never>"])
    assert all(probe_of(t) is not None for t in texts) and built == before


def test_a_plan_without_a_probe_keeps_the_other_probes_position_probes():
    """:meth:`ProbePlan.without` (a capture the loaded model refused): the remaining probes' position probes are the
    same objects, the skipped probe and its reason join ``skipped``; a probe named explicitly refuses the run."""
    every = ProbeConfig.from_model_args({"probes": "all"})
    plan = ProbePlan.of(every, 4, {"earlier": "why"})
    dropped = next(iter(plan.captures))
    less = plan.without({dropped: "refused"})
    assert dropped not in less.captures and dropped not in less.config.probes
    assert all(less.captures[name] is plan.captures[name] for name in less.captures)
    assert less.skipped == {"earlier": "why", dropped: "refused"} and plan.without({}) is plan
    assert less.kept_layers <= plan.kept_layers and 4 in less.kept_layers
    named = ProbePlan.of(ProbeConfig.from_model_args({"probes": dropped}), 4)
    with pytest.raises(ValueError, match=f"probes={dropped}: refused"):
        named.without({dropped: "refused"})


class _OnlyCaptureRequests:
    """A position probe with none of the hooks at a response's positions: it only asks for a whole-forward capture."""

    reads_lens = False
    states_folder = None


def test_a_probe_needs_only_the_hooks_it_uses():
    """Without ``layers``, ``at_positions`` and ``reduce`` a probe reads no layer and measures nothing at a response's
    positions; the other probes' values are as without it."""
    import torch

    config = ProbeConfig.from_model_args({"probes": "reader"})
    plan = ProbePlan.of(config, 4)
    bare = ProbePlan._planned(config, 4, {**plan.captures, "bare": _OnlyCaptureRequests()}, {})
    assert bare.read_layers == plan.read_layers and bare.kept_layers == plan.kept_layers
    assert "bare" in bare.captures and "bare" not in bare.position_captures(lens=False)
    torch.manual_seed(0)
    states = [torch.randn(3, 8) for _ in range(5)]
    want = position_probes(states, None, plan, lens=False).summarize(0, 3, generation=True)
    got = position_probes(states, None, bare, lens=False).summarize(0, 3, generation=True)
    assert got == want


class _AsksForANewCapture:
    reads_lens = False

    def __init__(self, request: str) -> None:
        self.window_sums = request  # the attribute named after the registered capture


def test_a_registered_capture_is_found_by_name_set_up_and_may_refuse_the_model(monkeypatch):
    """A whole-forward capture registered by name (``capture/captures.py``): a probe asks for it with the attribute of
    that name; the plan sets it up at load; a model it refuses skips the probe under ``probes=all``."""
    from lm_eval_probes.capture import captures
    from lm_eval_probes.capture.parts import UnsupportedModelError

    monkeypatch.setattr(captures, "_REGISTERED", dict(captures._REGISTERED))
    seen = []

    def set_up(request, setup):
        seen.append((request, setup.model))
        if setup.model == "refusing":
            raise UnsupportedModelError("no window here")
        return f"held {request}"

    captures.register_capture(captures.WholeForwardCapture("window_sums", set_up=set_up))
    with pytest.raises(ValueError, match="registered already"):
        captures.register_capture(captures.WholeForwardCapture("window_sums"))
    every = ProbeConfig.from_model_args({"probes": "all"})
    plan = ProbePlan._planned(every, 4, {"reader": _AsksForANewCapture("w")}, {})
    assert plan.requested.of("window_sums") == ("reader", "w") and plan.requested.prompt_means is None
    kept, held = plan.set_up(captures.SetUp("model", None, every, None))
    assert held == {"window_sums": "held w"} and kept is plan
    skipped, held = plan.set_up(captures.SetUp("refusing", None, every, None))
    assert held == {} and skipped.skipped == {"reader": "no window here"} and "reader" not in skipped.captures
    named = ProbePlan._planned(ProbeConfig.from_model_args({"probes": "reader"}), 4,
                               {"reader": _AsksForANewCapture("w")}, {})
    with pytest.raises(UnsupportedModelError, match="no window here"):
        named.set_up(captures.SetUp("refusing", None, named.config, None))


def test_hf_probes_diffusion_sets_up_the_states_folder_capture(masked_lm_dir, tmp_path):
    """``probe_save_states`` on ``hf-probes-diffusion``: its registered capture is set up at load, as on ``hf-probes``,
    and each generation's states are written."""
    lm = DiffusionProbeHFLM(pretrained=masked_lm_dir("bert"), device="cpu", batch_size=2, probes="reader",
                            probe_save_states=str(tmp_path), **MODEL_ARGS)
    assert set(lm.held) == {"states_folder"} and lm.captures.hooks["states_folder"].writer is lm.held["states_folder"]
    generate(lm, ["<never>"])
    assert list(tmp_path.glob("states-rank0-*.safetensors"))


def test_a_registered_capture_takes_part_in_the_calls_through_the_hooks_it_implements(monkeypatch):
    """``capture/calls.py``: a capture implements only the hooks it needs; ``CallCaptures`` calls those, by
    capture name, and leaves the others out (no empty methods anywhere)."""
    from contextlib import contextmanager

    from lm_eval_probes.capture import captures
    from lm_eval_probes.capture.calls import CallCaptures

    monkeypatch.setattr(captures, "_REGISTERED", dict(captures._REGISTERED))
    seen = []

    class Part:  # reads HFLM's loglikelihood forwards only, and sees the responses
        def __init__(self, context):
            self.context = context

        def forwards(self, kind):
            if kind != "loglikelihood":
                return None

            @contextmanager
            def hooked():
                seen.append("enter")
                yield {"held": self.context.held, "request": self.context.request}
                seen.append("exit")
            return hooked()

        def answers(self, recorded, locate):
            part = self

            class Tap:
                fields = {}

                def on_answer(self, attr, key, answer):
                    self.fields[key] = {"window": (recorded["request"], locate(key), part.context.probe)}
            return Tap()

        def attached(self, requests, responses):
            seen.append(("attached", list(requests), list(responses)))

    captures.register_capture(captures.WholeForwardCapture("window_sums", set_up=lambda request, setup: "held",
                                                           calls=Part))
    every = ProbeConfig.from_model_args({"probes": "all"})
    plan = ProbePlan._planned(every, 4, {"reader": _AsksForANewCapture("w")}, {})
    plan, held = plan.set_up(captures.SetUp("model", None, every, None))
    calls = CallCaptures(plan, held)
    assert list(calls.hooks) == ["window_sums"] and calls.reads("loglikelihood") and not calls.reads("generate")
    with calls.forwards("generate") as recorded:
        assert recorded == {}
    assert calls.answers({}, locate=len) is None and calls.prompt_layers == () and calls.span_fields({}, 3) == {}
    with calls.forwards("loglikelihood") as recorded:
        assert seen == ["enter"] and recorded == {"window_sums": {"held": "held", "request": "w"}}
        tap = calls.answers(recorded, locate=len)
        tap.on_answer("loglikelihood", "abc", (0.0, True))
    assert seen == ["enter", "exit"] and tap.fields("abc") == {"window": ("w", 3, "reader")} and tap.fields("x") == {}
    assert [row.fields(2) for row in calls.generated({}, 5, [1, 2])] == [{}, {}]  # no generated hook: nothing
    calls.attached(["request"], ["response"])
    assert seen[-1] == ("attached", ["request"], ["response"])
    assert calls.position_values(recorded, None, [(0, 0, 1)]) == [{}]  # no position_values hook
