"""Both wrappers in lm_eval's ``hf_steered`` shape: few HFLM methods overridden, the public ones shared."""

from __future__ import annotations

from lm_eval.models.huggingface import HFLM

from lm_eval_probes.config import joined_list_args, split_model_args
from lm_eval_probes.harness.wrapper import ProbeWrapper
from lm_eval_probes.models.autoregressive import ProbeHFLM
from lm_eval_probes.models.diffusion import DiffusionProbeHFLM

SHARED = {"loglikelihood", "generate_until", "get_model_info"}
"""Defined once for both (:class:`~lm_eval_probes.harness.wrapper.ProbeWrapper`)."""
OWN = {"_loglikelihood_tokens", "_model_generate"}
"""Each wrapper's own: where the requests' token ids and a generation's ids exist (``hf-probes-diffusion``: replaced)."""


def hflm_overrides(cls: type) -> dict[str, str]:
    """Every attribute of HFLM (its bases' included; ``__init__`` and other dunders aside) that ``cls`` takes from a
    class outside HFLM's own hierarchy, with that class's name."""
    found = {}
    for name in dir(HFLM):
        if name.startswith("__") or name == "_abc_impl":
            continue
        owner = next(klass for klass in cls.__mro__ if name in vars(klass))
        if owner not in HFLM.__mro__:
            found[name] = owner.__name__
    return found


def test_each_wrapper_overrides_five_hflm_methods_three_of_them_shared():
    for wrapper in (ProbeHFLM, DiffusionProbeHFLM):
        overrides = hflm_overrides(wrapper)
        assert set(overrides) == SHARED | OWN, (wrapper.__name__, overrides)
        assert len(overrides) <= 5
        assert {name for name, owner in overrides.items() if owner == wrapper.__name__} == OWN
        assert issubclass(wrapper, ProbeWrapper)
        assert isinstance(vars(ProbeWrapper)["cache_hook"], property)  # --use_cache's table: set with the hook


def test_a_list_option_split_at_its_commas_is_joined_again():
    """lm_eval's parser gives ``probes=tcb,bte`` as ``probes="tcb"`` and a bare ``bte=""``; the wrappers join them."""
    assert joined_list_args({"pretrained": "m", "probes": "tcb", "bte": "", " margin": "", "dtype": "x"}) == \
        {"pretrained": "m", "probes": "tcb+bte+margin", "dtype": "x"}
    assert joined_list_args({"pretrained": "m", "x": ""}) == {"pretrained": "m", "x": ""}  # not after a list option
    plugin, rest = split_model_args({"probes": "tcb", "bte": "", "probe_tcb_eps": 2, "dtype": "float32"})
    assert plugin == {"probes": "tcb+bte", "probe_tcb_eps": 2} and rest == {"dtype": "float32"}


def test_the_wrappers_name_no_whole_forward_capture():
    """A new capture is registered and given its part in ``capture/calls.py``; neither wrapper changes."""
    from pathlib import Path

    import lm_eval_probes.models
    from lm_eval_probes.capture.captures import registered_captures

    names = [capture.name for capture in registered_captures()]
    assert len(names) >= 4
    for path in Path(lm_eval_probes.models.__file__).parent.glob("*.py"):
        named = [name for name in names if name in path.read_text()]
        assert not named, (path.name, named)
