"""The release differences of :mod:`lm_eval_probes.stack_api`, one test per branch: how a model reads a list
``output_hidden_states`` (the L + 1 indices of transformers ≥ 5.23, the blocks' indices of 5.17–5.22, a plain flag
before), learnt at load from the model itself; the installed release's reading on a real tiny model."""

from __future__ import annotations

from importlib import metadata

import pytest
import torch
from packaging.version import Version

from lm_eval_probes import stack_api
from lm_eval_probes.stack_api import (
    hidden_states_of,
    hidden_states_request,
    hidden_states_selection,
    learn_hidden_states_selection,
)

LAYERS = 4
EVERY = tuple(torch.randn(1, 3, 8, generator=torch.Generator().manual_seed(i)) for i in range(LAYERS + 1))
"""The L + 1 ``hidden_states`` of a ``True`` request (embeddings, blocks, final norm's output last)."""


class Emulated:
    """A model whose forward reads a list ``output_hidden_states`` as ``how``: as transformers' output recorder does
    in each release (``utils/output_capturing.py``), or wrongly (``"shifted"``)."""

    def __init__(self, how: str, every: tuple[torch.Tensor, ...] = EVERY) -> None:
        self.how, self.every = how, every

    def forward(self, request: bool | list[int]) -> tuple[torch.Tensor | None, ...]:
        every, layers = self.every, len(self.every) - 1
        if request is True or self.how == "flag":
            return every
        if self.how == "hidden_states":
            return tuple(state if i in request else None for i, state in enumerate(every))
        if self.how == "blocks":  # no embeddings entry; index i is block i's output, the last one tied to the norm's
            return tuple(state if i in request else None for i, state in enumerate(every[1:]))
        return tuple(every[i + 1] if i in request and i < layers else None for i in range(layers + 1))


@pytest.mark.parametrize("how", ["hidden_states", "blocks", "flag"])
def test_each_reading_is_learnt_and_its_requests_give_the_l_plus_1_states(how):
    model = Emulated(how)
    assert hidden_states_request(model, [2, 4]) is True  # not learnt yet: every state
    assert learn_hidden_states_selection(model, model.forward, EVERY) == how
    assert hidden_states_selection(model) == how
    request = hidden_states_request(model, [4, 2, 2])
    assert request == {"hidden_states": [2, 4], "blocks": [1, 3], "flag": True}[how]
    states = hidden_states_of(model, request, model.forward(request))
    assert len(states) == LAYERS + 1
    for i in (2, 4):
        assert torch.equal(states[i], EVERY[i])
    if how != "flag":  # the others are never held
        assert all(states[i] is None for i in (0, 1, 3))
    kept = hidden_states_of(model, request, model.forward(request), [2, 4])  # the same states whatever the reading
    assert [state is None for state in kept] == [i not in (2, 4) for i in range(LAYERS + 1)]
    assert torch.equal(kept[2], EVERY[2]) and torch.equal(kept[4], EVERY[4])
    assert hidden_states_request(model, None) is True


def test_the_embeddings_cannot_be_named_by_a_blocks_reading_so_every_state_is_asked():
    model = Emulated("blocks")
    learn_hidden_states_selection(model, model.forward, EVERY)
    request = hidden_states_request(model, [0, 3])
    assert request is True
    states = hidden_states_of(model, request, model.forward(request))
    assert torch.equal(states[0], EVERY[0]) and torch.equal(states[3], EVERY[3])


def test_a_reading_that_matches_none_is_forgotten_and_every_request_stays_true():
    model = Emulated("shifted")
    assert learn_hidden_states_selection(model, model.forward, EVERY) is None
    assert hidden_states_selection(model) is None
    assert hidden_states_request(model, [1, 2]) is True


def test_a_model_of_one_block_and_a_relearn():
    model = Emulated("hidden_states", EVERY[:2])
    assert learn_hidden_states_selection(model, model.forward, EVERY[:2]) == "hidden_states"
    model.how, model.every = "shifted", EVERY
    assert learn_hidden_states_selection(model, model.forward, EVERY) is None  # the old reading is dropped
    assert hidden_states_request(model, [1]) is True


def installed_reading() -> str:
    release = Version(Version(metadata.version("transformers")).base_version)
    return "hidden_states" if release >= Version("5.23") else "blocks" if release >= Version("5.17") else "flag"


def test_the_installed_transformers_reading_on_a_real_tiny_model(tiny_model_dir):
    """The reading learnt from the installed release's own output recorder, and the states it gives are the
    ``True`` forward's."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir("llama")).eval()
    ids = torch.tensor([[5, 9, 13, 2]])
    with torch.no_grad():
        every = model(input_ids=ids, output_hidden_states=True).hidden_states
        forward = lambda request: model(input_ids=ids, output_hidden_states=request).hidden_states  # noqa: E731
        assert learn_hidden_states_selection(model, forward, every) == installed_reading()
        layers = len(every) - 1
        request = hidden_states_request(model, [1, layers])
        states = hidden_states_of(model, request, forward(request))
    assert len(states) == layers + 1
    for i in (1, layers):
        torch.testing.assert_close(states[i], every[i])
    assert model in stack_api._SELECTION
