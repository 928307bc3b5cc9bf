"""``batch_size=auto`` counts the probes: on a simulated device whose memory fits the forward alone at a batch size
HFLM's plain detection picks, the probes' declared memory (:attr:`~lm_eval_probes.api.Probe.memory`) does not fit
beside it; with the reservation the detection picks a smaller batch size, and the run completes with every probe."""

from __future__ import annotations

import math

import pytest
import torch

from lm_eval_probes.capture import memory
from lm_eval_probes.models.autoregressive import ProbeHFLM
from test_capture import LL_REQUESTS, ll_instances

OOM = "DefaultCPUAllocator: can't allocate memory: the simulated device is full"  # accelerate halves on this text


class SimulatedDevice:
    """Memory of ``budget`` bytes: a forward of ``B`` rows takes ``B · per_row``; the probes' reservation is charged
    beside it; over budget, the allocator's out-of-memory error."""

    def __init__(self, budget: int, per_row: int) -> None:
        self.budget, self.per_row, self.forward = budget, per_row, 0
        self.reserved: list[tuple[int, int]] = []  # (rows, bytes) of every reservation that fitted

    def before_forward(self, _module, args, kwargs):
        ids = kwargs.get("input_ids", args[0] if args else None)
        self.forward = ids.shape[0] * self.per_row
        if self.forward > self.budget:
            raise RuntimeError(OOM)

    def allocate(self, size: int, device: torch.device) -> object:
        if self.forward + size > self.budget:
            raise RuntimeError(OOM)
        self.reserved.append((self.forward // self.per_row, size))
        return object()


def detected_batch_sizes(lm: ProbeHFLM) -> list[int]:
    found: list[int] = []
    detect = lm._detect_batch_size

    def spy(*args, **kwargs):
        found.append(detect(*args, **kwargs))
        return found[-1]

    lm._detect_batch_size = spy
    return found


def test_auto_picks_a_batch_size_that_leaves_room_for_the_probes(tiny_model_dir, monkeypatch):
    lm = ProbeHFLM(pretrained=tiny_model_dir("llama"), device="cpu", batch_size="auto", max_batch_size=32, probes="all")
    longest = max(len(sum(lm._encode_pair(*request), [])) - 1 for request in LL_REQUESTS)  # HFLM's detection length
    shapes = memory.model_shapes(lm.model, batch=8, tokens=longest, vocab=lm.readout.vocab_size,
                                 chunk_positions=lm.probe_config.chunk_positions)
    probes_at_8 = memory.probes_memory(lm.probe_config, shapes)
    assert probes_at_8 > 0
    per_row = probes_at_8 // 8  # the forward of about 16 rows alone fits; with the probes beside it, about 8 rows do
    device = SimulatedDevice(budget=8 * per_row + probes_at_8, per_row=per_row)
    monkeypatch.setattr(memory, "reserve", device.allocate)
    hook = lm.model.register_forward_pre_hook(device.before_forward, with_kwargs=True, prepend=True)
    try:
        with monkeypatch.context() as plain_hflm:
            plain_hflm.setattr(memory, "probes_memory", lambda config, shapes: 0)  # plain HFLM: nothing reserved
            plain = detected_batch_sizes(lm)
            lm.loglikelihood(ll_instances())
        assert len(plain) == 1 and plain[0] > 8

        def probes_at(rows: int) -> int:
            return memory.probes_memory(lm.probe_config, memory.model_shapes(
                lm.model, batch=rows, tokens=longest, vocab=lm.readout.vocab_size,
                chunk_positions=lm.probe_config.chunk_positions))

        assert plain[0] * per_row <= device.budget < plain[0] * per_row + probes_at(plain[0])  # no room for the probes

        counted = detected_batch_sizes(lm)
        device.reserved.clear()
        answers = lm.loglikelihood(ll_instances())
    finally:
        hook.remove()
    assert len(counted) == 1 and counted[0] < plain[0]
    assert counted[0] * per_row + probes_at(counted[0]) <= device.budget
    assert device.reserved and all(rows <= counted[0] for rows, _ in device.reserved)  # each forward held the figure
    assert all(math.isfinite(a.probe.get("tcb_log10_mean")) and a.probe.get("omega") is not None
               and a.probe.get("margin_mean") is not None for a in answers)


def test_a_fixed_batch_size_reserves_nothing(tiny_model_dir):
    lm = ProbeHFLM(pretrained=tiny_model_dir("llama"), device="cpu", batch_size=2, probes="all")
    with memory.reserved_during_forwards(lm.model, lm.probe_config, vocab=lm.readout.vocab_size,
                                         enabled=str(lm.batch_size).startswith("auto")) as reserved:
        lm.model(torch.tensor([[1, 2, 3]]))
    assert reserved == []
    with memory.reserved_during_forwards(lm.model, lm.probe_config, vocab=lm.readout.vocab_size) as reserved:
        lm.model(torch.tensor([[1, 2, 3], [4, 5, 6]]))
    want = memory.probes_memory(lm.probe_config, memory.model_shapes(lm.model, batch=2, tokens=3,
                                                                     vocab=lm.readout.vocab_size, chunk_positions=64))
    assert reserved == [want] and want > 0


@pytest.mark.parametrize("probe", ["tcb", "bte", "reader", "omega", "margin"])
def test_every_built_in_probe_declares_memory_that_grows_with_the_forward(probe):
    from lm_eval_probes.api import Shapes
    from lm_eval_probes.registry import probe as find

    declared = find(probe)
    small = Shapes(batch=1, tokens=64, response_tokens=8, layers=4, width=64, vocab=1000, heads=4, head_dim=16)
    large = Shapes(batch=4, tokens=256, response_tokens=64, layers=4, width=64, vocab=128000, heads=4, head_dim=16)
    options = declared.options()
    assert 0 < declared.memory_bytes(options, small) <= declared.memory_bytes(options, large)
