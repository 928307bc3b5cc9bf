"""Ω where the model's remaining computation is more than its last blocks: looped models (Dory: a recurrent block run
once per loop, each loop started by a norm and an input injection of the forward's own code; HRM: two stacks, each
ending in a norm of its own, run in cycles on the sum of two streams; Inkling-2-loop: loop passes that restart from
the pre-loop states and read messages of the previous pass) and Inkling-2 (block attention residuals: a running list of
block-boundary states that later blocks read, and a residual over it before the final norm).

The depth axis is the sequence of block calls (pass p of block k): state i is ``hidden_states[i]``, the output of call
i (state 0: the first call's input). The reference: per source state H_i, one forward of the model itself on the
request alone with its state N − m replaced by H_i — the output of its block call N − m, counting calls over every
block in the order the forward makes them (the first call's input for m = N) — and the top-K masses of its own
logits. It is written here, independently of the decoder's replay: hooks on the model's blocks, its own final norm
named by family.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from torch import nn

from test_last_families import architectures  # benchmarks/architectures.py, imported once

OVERRIDES: dict[str, dict] = {
    "dory": {"n_recurrent_loops": 3},  # 1 input, 1 recurrent, 1 output block: passes (0, 1, 1, 1, 2)
    "hrm_text": {"num_layers_per_stack": 2, "H_cycles": 2, "L_cycles": 2, "L_bp_cycles": [1], "num_hidden_layers": 12},
    "inkling2_text": {"n_layers_per_attn_res_block": 1},  # every block a boundary: later blocks read earlier states
    "inkling2_loop_text": {"n_layers_per_attn_res_block": 1, "loop_layer_index_start": 1, "loop_layer_index_end": 2,
                           "loop_num_passes": 2},  # passes (0, 1, 1, 2)
}
"""Each family's builder config (``benchmarks/architectures.py``'s small config, 3 blocks of width 64) with these
fields: loops and block boundaries that put the forward's own code between the re-run block calls."""

PASSES = {"dory": (0, 1, 1, 1, 2), "hrm_text": (0, 1, 0, 1, 2, 3) * 2, "inkling2_text": (0, 1, 2),
          "inkling2_loop_text": (0, 1, 1, 2)}

FINAL_NORMS = {"dory": "model.norm", "hrm_text": "model.H_module.final_norm", "inkling2_text": "model.norm",
               "inkling2_loop_text": "model.norm"}
"""The module whose last call's input is the lens's last state (the norm the head reads), by family."""


def _build(model_type: str, folder: Path, **fields) -> str:
    import transformers
    from tiny_models import build_tokenizer

    tokenizer = build_tokenizer()
    config = architectures.small_config(model_type, vocab_size=len(tokenizer), pad=tokenizer.pad_token_id,
                                        eos=tokenizer.eos_token_id)
    for name, value in {**OVERRIDES[model_type], **fields}.items():
        setattr(config, name, value)
    torch.manual_seed(0)
    model = transformers.AutoModelForCausalLM.from_config(config).eval()
    model.save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return str(folder)


def _blocks(model: nn.Module) -> list[nn.Module]:
    """Every decoder block of the four families (HRM: both stacks')."""
    if hasattr(model.model, "H_module"):
        return [*model.model.L_module.layers, *model.model.H_module.layers]
    return list(model.model.layers)


@torch.no_grad()
def state_replaced_reference(model: nn.Module, token_ids: list[int], depth: int, k: int, start: int,
                             stop: int) -> torch.Tensor:
    """``[N + 1, stop − start]`` top-k masses of the model's own logits, per source state H_i (``hidden_states[i]``,
    i < N; state N the final norm's last input) with state N − m of the model's own forward replaced by H_i."""
    final_norm = model.get_submodule(FINAL_NORMS[model.config.model_type])
    ids = torch.tensor([token_ids])
    norm_inputs: list[torch.Tensor] = []
    handle = final_norm.register_forward_pre_hook(lambda _module, args: norm_inputs.append(args[0]))
    try:
        out = model(ids, output_hidden_states=True, use_cache=False)
    finally:
        handle.remove()
    calls = len(out.hidden_states) - 1
    entry = calls - depth
    rows = []
    for state in [*out.hidden_states[:-1], norm_inputs[-1]]:
        made = [0]

        def before(_module, args, kwargs, state=state):
            made[0] += 1
            if entry == 0 and made[0] == 1:
                return (state, *args[1:]), kwargs
            return None

        def after(_module, _args, output, state=state):
            if entry and made[0] == entry:
                return (state, *output[1:]) if isinstance(output, tuple) else state
            return None

        handles = []
        for block in _blocks(model):
            handles += [block.register_forward_pre_hook(before, with_kwargs=True), block.register_forward_hook(after)]
        try:
            logits = model(ids, use_cache=False).logits[0, start:stop]
        finally:
            for handle in handles:
                handle.remove()
        assert made[0] == calls
        probs = torch.softmax(logits.double(), -1)
        rows.append(probs.sort(-1, descending=True).values[..., :k].sum(-1))
    return torch.stack(rows)


def _omega_answers(folder: str, depth: int, *, patch=None):
    import transformers
    from test_capture import ll_instances

    from lm_eval_probes.models.autoregressive import ProbeHFLM

    model = transformers.AutoModelForCausalLM.from_pretrained(folder).eval()
    if patch is not None:
        patch(model)
    with torch.no_grad():
        model.get_output_embeddings().weight.mul_(50.0)  # the top-1 masses spread
    lm = ProbeHFLM(pretrained=model, tokenizer=folder, device="cpu", batch_size=3, probes="omega",
                   probe_omega_depth=depth)
    return lm, lm.loglikelihood(ll_instances())


def _assert_omega_equals_the_reference(lm, answers, depth: int) -> None:
    from test_capture import LL_REQUESTS

    for (context, continuation), answer in zip(LL_REQUESTS, answers, strict=True):
        ctx_ids, cont_ids = lm._encode_pair(context, continuation)
        seen = ctx_ids + cont_ids
        want = state_replaced_reference(lm.model, seen, depth, 1, len(ctx_ids) - 1, len(seen) - 1).mean(-1).tolist()
        assert answer.probe.get("omega_trajectory") == pytest.approx(want, rel=2e-5, abs=2e-6)
        assert answer.probe.get("omega") == pytest.approx(sum(1 - c for c in want), rel=2e-5, abs=2e-6)


@pytest.mark.parametrize("model_type", sorted(OVERRIDES))
def test_omega_of_each_request_equals_the_models_own_forward_from_the_focal_state(model_type, tmp_path):
    """At a focal depth whose re-run crosses the forward's own code between block calls (and at m = N: from the first
    call's input), every request's Ω trajectory equals the reference; the decoder replays the model's forward (the
    blocks alone are not its computation), its re-run calls are the last m of the unrolled sequence."""
    lm = None
    for depth in (3, len(PASSES[model_type])):
        lm, answers = _omega_answers(_build(model_type, tmp_path / str(depth)), depth)
        decoder = lm.held["focal_depth"]
        assert lm.readout.passes == PASSES[model_type] and decoder.replays, decoder.replay_why
        assert decoder.skips_earlier  # the calls before the focal depth given their captured outputs
        assert decoder.blocks == decoder.calls[len(PASSES[model_type]) - depth:]
        _assert_omega_equals_the_reference(lm, answers, depth)
    assert ("looped model" in lm.held["focal_depth"].replay_why) == (model_type != "inkling2_text")


def test_blocks_whose_other_arguments_follow_the_states_are_replayed(tmp_path):
    """Inkling-2 with its final residual over the block states made an identity: the last 2 blocks re-run alone on
    their captured input reproduce their captured output, but the last one reads the block-boundary states (a list
    the forward extends with the states as they pass), so on another row's state they give another output than the
    model's own forward: found at load, and Ω replays the forward, equal to the reference."""
    def identity_residual(model: nn.Module) -> None:
        model.model.final_input.forward = lambda block_states, partial: (partial,)

    lm, answers = _omega_answers(_build("inkling2_text", tmp_path), 2, patch=identity_residual)
    decoder = lm.held["focal_depth"]
    assert decoder.replays and "depend on the states" in decoder.replay_why, decoder.replay_why
    _assert_omega_equals_the_reference(lm, answers, 2)


def test_a_replay_that_cannot_skip_the_earlier_calls_runs_them_again(tmp_path, monkeypatch):
    """Where the replay given the captured outputs of the calls before the focal depth does not reproduce the model's
    own (here: those outputs made wrong, as a block that leaves something for later ones would make them), the check
    runs those calls again instead, and Ω equals the reference."""
    from lm_eval_probes.capture.forward_replay import ForwardReplay

    run = ForwardReplay.run

    def spoilt(self, states, entry, args, kwargs, earlier=None):
        if earlier:
            earlier = [(output[0] + 1.0, *output[1:]) if isinstance(output, tuple) else output + 1.0
                       for output in earlier]
        return run(self, states, entry, args, kwargs, earlier)

    monkeypatch.setattr(ForwardReplay, "run", spoilt)
    lm, answers = _omega_answers(_build("dory", tmp_path), 3)
    decoder = lm.held["focal_depth"]
    assert decoder.replays and not decoder.skips_earlier
    _assert_omega_equals_the_reference(lm, answers, 3)


def test_a_looped_model_without_a_body_of_its_own_is_refused_in_one_line(tmp_path):
    """Where the forward cannot be replayed (no ``base_model`` holding the blocks), a looped model's Ω is refused,
    naming the passes and why; the lens (m = 0) still reads it. A model whose blocks chain re-runs the blocks alone."""
    import transformers

    from lm_eval_probes.capture.parts import UnsupportedModelError
    from lm_eval_probes.capture.readouts import FocalDepthDecoder, LensReadout, check_lens

    model = transformers.AutoModelForCausalLM.from_pretrained(_build("dory", tmp_path)).eval()
    readout = LensReadout(model)
    check_lens(model, readout)
    decoder = FocalDepthDecoder(model, readout, depth=2, source_layers=(0, readout.num_layers + 1))
    decoder.replay = None
    with pytest.raises(UnsupportedModelError, match=r"^Ω cannot re-run the last 2 of the 5 passes of 3 blocks of "
                                                    r"model_type 'dory': a looped model: .* cannot be replayed"):
        decoder.check()
    assert FocalDepthDecoder(model, readout, depth=0, source_layers=(0, 6)).check() == 0.0


def test_blocks_that_chain_are_re_run_alone(tiny_model_dir):
    """Llama's blocks chain (each takes the previous one's output, its other arguments the same whatever the states):
    the decoder re-runs the last m blocks alone, the model's forward is not replayed."""
    import transformers

    from lm_eval_probes.capture.readouts import FocalDepthDecoder, LensReadout, check_lens

    model = transformers.AutoModelForCausalLM.from_pretrained(tiny_model_dir("llama")).eval()
    readout = LensReadout(model)
    check_lens(model, readout)
    for depth in (1, readout.num_layers):
        decoder = FocalDepthDecoder(model, readout, depth=depth, source_layers=(0, readout.num_layers + 1))
        assert decoder.check() < 1e-4 and not decoder.replays and decoder.replay is not None


@pytest.mark.parametrize("model_type", ["dory", "inkling2_loop_text"])
def test_generation_omega_of_a_replayed_model_in_a_left_padded_batch(model_type, tmp_path):
    """``generate_until`` at batch size 3 (left padding: each row's mask and positions go to the replayed body) with
    Ω on the teacher-forced forward, one sequence per chunk: each text's trajectory over source states 1..3 equals the
    reference on its prompt and kept tokens alone."""
    from test_capture import PROMPTS, _free_generation, _prompt_ids, gen_instances

    from lm_eval_probes.models.autoregressive import ProbeHFLM

    folder = _build(model_type, tmp_path)
    lm = ProbeHFLM(pretrained=folder, device="cpu", batch_size=3, probes="omega", probe_gen_capture="teacher_forced",
                   probe_omega_layers="1:4", probe_omega_depth=3, probe_omega_chunk_tokens=7)
    assert lm.held["focal_depth"].replays
    for prompt, text in zip(PROMPTS, lm.generate_until(gen_instances(until=["\n"], max_gen_toks=6)), strict=True):
        n = max(text.probe.n_tokens, 1)
        prompt_ids = _prompt_ids(lm, prompt)
        seen = prompt_ids + _free_generation(lm, prompt, 6)[:n]
        want = state_replaced_reference(lm.model, seen, 3, 1, len(prompt_ids) - 1, len(prompt_ids) - 1 + n)
        assert text.probe.get("omega_trajectory") == pytest.approx(want[1:4].mean(-1).tolist(), rel=2e-5, abs=2e-6)
