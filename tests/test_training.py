"""The log-barrier penalty: values, gradients near the boundary, and the two tested ways to train with it."""

from __future__ import annotations

import math

import pytest
import torch

from lm_eval_probes.probes.margin.math import head_margins, prefix_attention_weights, prior_margins
from lm_eval_probes.models.barrier_training import GPTConfig, SupportTokenGPT, barrier_loss, log_barrier_penalty


def test_penalty_is_the_clamped_negative_mean_over_defined_margins():
    margins = torch.tensor([[math.nan, 0.5, -2.0, -100.0], [math.nan, 1.0, math.nan, -1.0]], dtype=torch.float64)
    expected = -(0.5 - 2.0 - 30.0 + 1.0 - 1.0) / 5
    assert math.isclose(float(log_barrier_penalty(margins)), expected)
    mask = torch.tensor([[True, True, True, False], [True, True, True, True]])
    assert math.isclose(float(log_barrier_penalty(margins, mask=mask)), -(0.5 - 2.0 + 1.0 - 1.0) / 4)
    assert float(log_barrier_penalty(torch.full((3,), math.nan))) == 0.0
    ce = torch.tensor(2.0)
    assert float(barrier_loss(ce, margins, weight=0.0)) == 2.0
    assert math.isclose(float(barrier_loss(ce, margins, weight=0.1)), 2.0 + 0.1 * expected)
    with pytest.raises(ValueError, match="weight"):
        barrier_loss(ce, margins, weight=-1.0)
    with pytest.raises(ValueError, match="floor"):
        log_barrier_penalty(margins, floor=math.inf)


def near_degenerate_prior():
    """A 1-D prior (d = p = 1) with a > 0 whose last position sits just inside the boundary 1 − a·Var_t = 0."""
    x = torch.tensor([[-1.0], [1.0], [0.0]], dtype=torch.float64)  # position 2: α uniform over ±1 (q·k = 0), Var = 1
    w_q = torch.tensor([[1.0]], dtype=torch.float64, requires_grad=True)
    w_k = torch.tensor([[0.999]], dtype=torch.float64, requires_grad=True)  # a = 0.999: 1 − a·Var = 0.001
    return x, w_q, w_k


def test_penalty_gradient_is_finite_and_pushes_away_from_the_boundary():
    x, w_q, w_k = near_degenerate_prior()
    margins = prior_margins(x, w_q, w_k)
    assert math.isclose(float(margins[2].detach()), math.log(1e-3), rel_tol=1e-9)
    penalty = log_barrier_penalty(margins)
    penalty.backward()
    assert torch.isfinite(w_q.grad).all() and torch.isfinite(w_k.grad).all()
    assert float(w_k.grad.abs()) > 1.0  # the barrier is steep near the boundary
    with torch.no_grad():
        w_q -= 1e-4 * w_q.grad
        w_k -= 1e-4 * w_k.grad
    after = prior_margins(x, w_q, w_k)
    assert float(after[2].detach()) > float(margins[2].detach()) + 0.05  # one small step moved the support token away


def test_clamped_positions_contribute_no_gradient():
    x, w_q, w_k = near_degenerate_prior()
    with torch.no_grad():
        w_k.fill_(1.0 - 1e-15)  # margin ≈ log(1e-15) < −30
    margins = prior_margins(x, w_q, w_k)
    assert float(margins[2].detach()) < -30
    log_barrier_penalty(margins).backward()
    assert float(w_q.grad.abs().sum() + w_k.grad.abs().sum()) == 0.0


def tiny_gpt(seed: int = 0) -> SupportTokenGPT:
    torch.manual_seed(seed)
    return SupportTokenGPT(GPTConfig(vocab_size=11, context=16, d_model=16, layers=2, heads=2))


def test_gpt_margins_are_the_first_layers_head_margins():
    model = tiny_gpt().double()
    ids = torch.randint(0, 11, (2, 9), generator=torch.Generator().manual_seed(1))
    out = model(ids)
    attn = model.blocks[0].attn
    x = model.blocks[0].ln_1(model.tok_emb(ids) + model.pos_emb(torch.arange(9)))
    expected = []
    for h in range(2):
        rows = slice(8 * h, 8 * (h + 1))
        per_row = []
        for b in range(2):
            q = x[b] @ attn.q_proj.weight[rows].T + attn.q_proj.bias[rows]
            k = x[b] @ attn.k_proj.weight[rows].T + attn.k_proj.bias[rows]
            weights = prefix_attention_weights(q, k, scale=8**-0.5)
            per_row.append(head_margins(q, k, weights, scale=8**-0.5))
        expected.append(torch.stack(per_row))
    torch.testing.assert_close(out["margins"], torch.stack(expected).mean(0), equal_nan=True)
    assert torch.isnan(out["margins"][:, 0]).all() and torch.isfinite(out["margins"][:, 1:]).all()


def batches(steps: int, seed: int = 0):
    gen = torch.Generator().manual_seed(seed)
    for _ in range(steps):
        ids = torch.randint(0, 11, (4, 13), generator=gen)
        yield ids[:, :-1], ids[:, 1:]


def test_plain_pytorch_loop_example():
    model = tiny_gpt()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
    penalties = []
    for input_ids, labels in batches(15):
        out = model(input_ids, labels=labels)
        loss = barrier_loss(out["loss"], out["margins"], weight=0.5)
        optimizer.zero_grad()
        loss.backward()
        assert all(torch.isfinite(p.grad).all() for p in model.parameters() if p.grad is not None)
        optimizer.step()
        penalties.append(float(log_barrier_penalty(out["margins"].detach())))
    assert math.isfinite(penalties[-1])


def test_hugging_face_trainer_example(tmp_path):
    from transformers import TrainingArguments

    from lm_eval_probes.models.barrier_training import LogBarrierTrainer

    rows = [{"input_ids": i[b], "labels": t[b]} for i, t in batches(4) for b in range(4)]
    args = TrainingArguments(output_dir=str(tmp_path), max_steps=4, per_device_train_batch_size=4, learning_rate=1e-2,
                             report_to=[], save_strategy="no", logging_strategy="no", use_cpu=True,
                             remove_unused_columns=False, disable_tqdm=True, seed=0)
    model = tiny_gpt()
    before = {name: p.detach().clone() for name, p in model.named_parameters()}
    trainer = LogBarrierTrainer(model=model, args=args, train_dataset=rows, barrier_weight=0.05)
    loss = torch.tensor(0.0)
    seen = []
    original = trainer.compute_loss

    def spy(model, inputs, return_outputs=False, **kwargs):
        loss, outputs = original(model, inputs, return_outputs=True, **kwargs)
        seen.append((float(loss), float(outputs["loss"]), float(log_barrier_penalty(outputs["margins"]))))
        return (loss, outputs) if return_outputs else loss

    trainer.compute_loss = spy
    trainer.train()
    assert len(seen) == 4 and all(math.isclose(t, ce + 0.05 * pen, rel_tol=1e-5) for t, ce, pen in seen)
    assert any(not torch.equal(before[name], p) for name, p in model.named_parameters())
    del loss
    with pytest.raises(ValueError, match="barrier_weight"):
        LogBarrierTrainer(model=model, args=args, train_dataset=rows, barrier_weight=-0.1)
