"""How the first-attention capture records a layer's attention call (``capture/attention.py``): through one function
registered with transformers' ``AttentionInterface`` under the plugin's own name, which the recorded modules' copies of
their configs name while the block runs. The interface's other functions, the model's config (by which transformers
builds the masks) and, after the block, the modules' configs are as they were; a layer's code that tests the
implementation's name takes the branch of the model's own implementation."""

from __future__ import annotations


import pytest
import torch

from lm_eval_probes.capture.attention_calls import RECORDING, AttentionCall, _RecordedName, _Stop, attention_calls_recorded

def built(model_type: str, attn_implementation: str, **fields):
    """The builder's small ``model_type`` (``benchmarks/architectures.py``, seed 0) with ``fields``."""
    from test_margin_capture import _eager_built

    return _eager_built(model_type, attn_implementation, **fields)


def _configs(model: torch.nn.Module) -> dict[str, object]:
    return {name: vars(module)["config"] for name, module in model.named_modules() if "config" in vars(module)}


def test_recording_leaves_the_interface_and_the_models_config_as_they_are():
    """Inside the block every attention layer's call is recorded (the forward runs on, each call answered with zeros),
    while the interface's own functions and the model's config are untouched; after it, every module has its own
    config object back and the model's output is what it was."""
    from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS

    model = built("llama", "sdpa")
    ids = torch.arange(3, 11)[None]
    configs = _configs(model)
    functions = {name: ALL_ATTENTION_FUNCTIONS[name] for name in ALL_ATTENTION_FUNCTIONS if name != RECORDING}
    with torch.no_grad():
        want = model(ids).logits
    calls: list[AttentionCall] = []
    with torch.no_grad(), attention_calls_recorded(model, calls.append):
        inside = {name: ALL_ATTENTION_FUNCTIONS[name] for name in ALL_ATTENTION_FUNCTIONS if name != RECORDING}
        assert inside == functions
        assert type(model.config._attn_implementation) is str and model.config._attn_implementation == "sdpa"
        assert type(model.model.layers[0].self_attn.config._attn_implementation) is _RecordedName
        model(ids)
    assert [call.module for call in calls] == [layer.self_attn for layer in model.model.layers]
    assert all(call.queries.shape[-2] == ids.shape[1] for call in calls)
    after = _configs(model)
    assert after.keys() == configs.keys() and all(after[name] is configs[name] for name in configs)
    with torch.no_grad():
        assert torch.equal(model(ids).logits, want)


def test_the_modules_get_their_configs_back_when_the_block_raises():
    model = built("llama", "sdpa")
    configs = _configs(model)

    def refuse(_call: AttentionCall) -> None:
        raise ValueError("refused")

    with pytest.raises(ValueError, match="refused"), torch.no_grad(), attention_calls_recorded(model, refuse):
        model(torch.arange(3, 9)[None])
    after = _configs(model)
    assert all(after[name] is configs[name] for name in configs)


def test_the_recorded_name_reads_as_the_models_implementation_and_is_looked_up_as_the_plugins():
    from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS

    with attention_calls_recorded(torch.nn.Linear(1, 1), lambda call: None):  # registers the function
        pass
    name = _RecordedName("sdpa")
    assert name == "sdpa" and name in ("eager", "sdpa") and not name != "sdpa" and "dp" in name
    assert name != "eager" and name != "flash_attention_2" and "flash" not in name
    recording = ALL_ATTENTION_FUNCTIONS[RECORDING]
    assert ALL_ATTENTION_FUNCTIONS[name] is recording
    assert ALL_ATTENTION_FUNCTIONS.get_interface(_RecordedName("eager"), None) is recording
    assert ALL_ATTENTION_FUNCTIONS["sdpa"] is not recording


def test_recording_outside_a_block_refuses():
    from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS

    with attention_calls_recorded(torch.nn.Linear(1, 1), lambda call: None):
        recording = ALL_ATTENTION_FUNCTIONS[RECORDING]
    query = torch.zeros(1, 1, 2, 4)
    with pytest.raises(RuntimeError, match="only inside"):
        recording(torch.nn.Linear(1, 1), query, query, query, None)


@pytest.mark.parametrize("attn_implementation", ["sdpa", "eager"])
def test_an_indexer_that_folds_its_selection_for_named_implementations_folds_it_when_recorded(attn_implementation):
    """DeepSeek-V3.2's first attention layer folds its indexer's top-k keys into the mask it hands its attention only
    when the implementation's name is ``eager`` or ``sdpa`` (another name gets the selection as indices instead): the
    recorded mask attends to the keys the model's own eager attention weights are nonzero on — k of them per query past
    the first k, not every key before it."""
    topk, length = 4, 10
    ids = torch.arange(3, 3 + length)[None]
    eager = built("deepseek_v32", "eager", index_topk=topk)
    with torch.no_grad():
        weights = eager(ids, output_attentions=True).attentions[0][0]  # [H, T, T]
    attended = (weights != 0).any(0)
    model = built("deepseek_v32", attn_implementation, index_topk=topk)
    calls: list[AttentionCall] = []
    with torch.no_grad(), attention_calls_recorded(model, calls.append, stop=True):
        with pytest.raises(_Stop):
            model(ids)
    (call,) = calls
    mask = call.mask[0, 0]
    recorded = mask if mask.dtype == torch.bool else mask > torch.finfo(mask.dtype).min
    assert torch.equal(recorded, attended)
    assert recorded.sum(-1).tolist() == [min(t + 1, topk) for t in range(length)]
