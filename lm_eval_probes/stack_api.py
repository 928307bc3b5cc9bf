"""Where the supported torch and transformers releases differ in an API the plugin calls: each difference in one
function here, with a test per branch (``tests/test_stack_api.py``). The rest of the package calls these functions
and never asks which release is installed.

It sits in the lowest layer (probes and capture import it; it imports nothing of the package): not in ``harness/``,
which imports ``capture/`` and would close a cycle between the two packages.

* :func:`hidden_states_request` / :func:`hidden_states_of` — asking a forward for *some* ``hidden_states`` only.
  A list of indices as ``output_hidden_states`` means three things across transformers releases, and a model's
  own code may read it as a plain flag:

  - ``"hidden_states"`` (transformers 5.23 and later): indices of the usual L + 1 tuple (``[0]`` the embeddings,
    ``[L]`` the final norm's output); the tuple keeps its L + 1 entries, ``None`` where not asked.
  - ``"blocks"`` (transformers 5.17–5.22, the first releases that took a list): indices of the blocks' outputs (``[0]`` the
    first block's); no embeddings entry, so the tuple has L entries; the last block's is the final norm's output.
  - ``"flag"``: the list read as ``True`` (transformers 4.57–5.16, or a model written without the output
    recorder): all L + 1 states.

  Which one a model follows is learnt once at load (:func:`learn_hidden_states_selection`, three forwards of a
  few tokens, compared with the ``True`` forward); until then, and for anything else, a request is ``True``.
  A model whose states are not in that convention (Gemma-3n's: its streams before the batch, ``[L]`` its last block's
  output) has them converted by what the lens found at load (:func:`read_states_through`).

* :func:`matmul_float32` — products with a float32 result from bfloat16 inputs: ``torch.mm`` / ``torch.bmm`` with
  ``out_dtype=torch.float32`` (CUDA's tensor cores: bfloat16 products accumulated and returned in float32; the
  keyword is absent from older torch releases and has no CPU kernel in torch 2.13). :func:`float32_products_native`
  says whether a device has them; :func:`matmul_float32` is the product every probe's large work goes through:

  - where the device has them, each operand is split into bfloat16 terms (:func:`bfloat16_terms`: x = x₁ + x₂ + x₃,
    each the bfloat16 rounding of what the previous left, 24 significant bits in all: float32's) and the products of
    the terms whose orders sum below ``terms`` are accumulated in float32 — 6 products for two float32 operands, 3
    when one is bfloat16 already (a bfloat16 model's weights), 1 when both are;
  - elsewhere, the float32 product of the same float32 values.

  Both are float32 products of float32-exact inputs, accumulated in float32: they agree to float32's rounding
  (``tests/test_torch_api.py``). :func:`float32_products_emulated` runs the first branch on any device (a
  ``TorchDispatchMode`` computing ``mm``/``bmm`` with ``out_dtype`` from the float32 values): the GPU's path, taken
  on a CPU to count or test it.
"""

from __future__ import annotations

import weakref
from collections.abc import Callable, Iterable, Sequence
from typing import Any

import torch
from torch import Tensor

SELECTIONS = ("hidden_states", "blocks", "flag")
"""How a model reads a list ``output_hidden_states`` (see the module's text)."""

_SELECTION: weakref.WeakKeyDictionary[Any, str] = weakref.WeakKeyDictionary()
_CONVERT: weakref.WeakKeyDictionary[Any, weakref.WeakMethod] = weakref.WeakKeyDictionary()


def hidden_states_request(model: Any, layers: Iterable[int] | None) -> bool | list[int]:
    """The ``output_hidden_states`` argument that asks ``model`` for the ``hidden_states`` indices ``layers`` (of the
    L + 1 convention) and as few others as its release allows; ``True`` for ``layers=None``, for a model whose
    reading of a list was not learnt, or where a list cannot name them (the embeddings under ``"blocks"``; a looped
    model's passes past ``config.num_hidden_layers``)."""
    if layers is None:
        return True
    wanted = sorted(set(layers))
    blocks = getattr(getattr(model, "config", None), "num_hidden_layers", None)
    if isinstance(blocks, int) and wanted and wanted[-1] > blocks:
        return True  # a looped model's passes: indices past the config's blocks, which a list request would drop
    selection = _SELECTION.get(model)
    if selection == "hidden_states":
        return wanted
    if selection == "blocks" and wanted and wanted[0] >= 1:
        return [layer - 1 for layer in wanted]
    return True


def hidden_states_of(model: Any, request: bool | list[int], states: Sequence[torch.Tensor | None],
                     layers: Iterable[int] | None = None) -> tuple[torch.Tensor | None, ...]:
    """A forward's ``hidden_states`` for ``request`` (from :func:`hidden_states_request`) in the L + 1 convention;
    with ``layers`` (what the request asked for), ``None`` where another was returned too (a flag reading gives every
    layer): every release hands the probes the same states."""
    if isinstance(request, list) and _SELECTION.get(model) == "blocks":
        states = (None, *states)
    if layers is not None:
        kept = set(layers)
        states = [state if index in kept else None for index, state in enumerate(states)]
    if model not in _CONVERT:
        return tuple(states)
    convert = _CONVERT[model]()
    if convert is None:
        raise RuntimeError(f"the lens that reads the hidden states of {type(model).__name__} is gone")
    return tuple(convert(states))


def read_states_through(model: Any, convert: Callable[[Sequence[torch.Tensor | None]], Sequence[torch.Tensor | None]]
                        | None) -> None:
    """Make :func:`hidden_states_of` hand ``model``'s states through ``convert`` (a bound method, held weakly: the lens
    readout's ``own_states``, which puts a model's L + 1 states in the convention every probe reads); ``None``: as
    the forward gives them."""
    if convert is None:
        _CONVERT.pop(model, None)
    else:
        _CONVERT[model] = weakref.WeakMethod(convert)


def hidden_states_selection(model: Any) -> str | None:
    """What :func:`learn_hidden_states_selection` found for ``model`` (``None``: not learnt; every request ``True``)."""
    return _SELECTION.get(model)


def learn_hidden_states_selection(model: Any, forward: Callable[[bool | list[int]], Sequence[torch.Tensor | None]],
                                  every: Sequence[torch.Tensor]) -> str | None:
    """Learn how ``model`` reads a list ``output_hidden_states``: ``forward(request)`` runs the model on fixed ids
    and returns its ``hidden_states``; ``every`` is that forward's with ``True`` (L + 1 tensors). A reading that
    matches none of :data:`SELECTIONS` is forgotten (requests stay ``True``). Returns what was learnt."""
    _SELECTION.pop(model, None)
    layers = len(every) - 1
    if layers < 1:
        return None
    asked = sorted({1, layers})

    def same(got: Sequence[torch.Tensor | None], offset: int, filled: Iterable[int]) -> bool:
        if len(got) != layers + 1 - offset:
            return False
        filled = set(filled)
        return all((got[i - offset] is not None) == (i in filled)
                   and (got[i - offset] is None or _equal(got[i - offset], every[i]))
                   for i in range(offset, layers + 1))

    found = None
    got = forward(asked)
    if same(got, 0, asked):
        found = "hidden_states"
    elif same(got, 0, range(layers + 1)):
        found = "flag"
    elif same(forward([i - 1 for i in asked]), 1, asked):
        found = "blocks"
    if found is not None:
        _SELECTION[model] = found
    return found


def _equal(got: torch.Tensor, want: torch.Tensor) -> bool:
    """The same forward's state (to float rounding: a kernel may pick another order for another request)."""
    return got.shape == want.shape and bool(torch.allclose(got.float(), want.float(), rtol=1e-3, atol=1e-5))


_NATIVE: dict[str, bool] = {}
_EMULATED: list[bool] = []


def float32_products_native(device: torch.device | str) -> bool:
    """Whether ``torch.mm(a, b, out_dtype=torch.float32)`` runs for bfloat16 ``a``, ``b`` on ``device`` (tried once
    per device type; ``True`` inside :func:`float32_products_emulated`)."""
    if _EMULATED:
        return True
    kind = torch.device(device).type
    if kind not in _NATIVE:
        try:
            one = torch.ones(1, 1, dtype=torch.bfloat16, device=device)
            _NATIVE[kind] = torch.mm(one, one, out_dtype=torch.float32).dtype == torch.float32
        except (TypeError, RuntimeError, NotImplementedError):  # older torch: no keyword; no kernel for the device
            _NATIVE[kind] = False
    return _NATIVE[kind]


def bfloat16_terms(x: Tensor, terms: int = 3) -> list[Tensor]:
    """x as a sum of up to ``terms`` bfloat16 tensors, largest first (each the bfloat16 rounding of what the previous
    left): 3 terms hold float32's 24 significant bits; a bfloat16 tensor is one term."""
    if terms < 1:
        raise ValueError(f"terms must be >= 1, got {terms}")
    if x.dtype == torch.bfloat16:
        return [x]
    rest = x if x.dtype == torch.float32 else x.float()
    out = []
    for index in range(terms):
        piece = rest.to(torch.bfloat16)
        out.append(piece)
        if index < terms - 1:
            rest = rest - piece  # float32 − bfloat16: exact, in float32
    return out


def _product(a: Tensor, b: Tensor) -> Tensor:
    if a.ndim == 2:
        return torch.mm(a, b, out_dtype=torch.float32)
    return torch.bmm(a, b, out_dtype=torch.float32)


def matmul_float32(a: Tensor, b: Tensor, *, terms: int = 3, native: bool | None = None) -> Tensor:
    """``a @ b`` in float32 (see the module docstring): ``a`` ``[..., m, k]``, ``b`` ``[k, n]`` or ``[..., k, n]``
    (leading dimensions broadcast; a 2-D ``b``, a weight matrix, is never copied per leading index). ``terms``:
    bfloat16 terms per float32 operand on the native path (3: float32's precision; 2: 16 significant bits, 3
    products instead of 6). ``native``: force a branch (``None``: the device's)."""
    if native is None:
        native = float32_products_native(a.device)
    if not native:
        return torch.matmul(a.float() if a.dtype != torch.float32 else a, b.float() if b.dtype != torch.float32 else b)
    if b.ndim == 2:  # rows of a against one matrix: one 2-D product chain
        out = _pairs(a.reshape(-1, a.shape[-1]), b, terms)
        return out.reshape(*a.shape[:-1], b.shape[-1])
    lead = torch.broadcast_shapes(a.shape[:-2], b.shape[:-2])
    flat_a = a.expand(*lead, *a.shape[-2:]).reshape(-1, *a.shape[-2:])
    flat_b = b.expand(*lead, *b.shape[-2:]).reshape(-1, *b.shape[-2:])
    return _pairs(flat_a, flat_b, terms).reshape(*lead, a.shape[-2], b.shape[-1])


def _pairs(a: Tensor, b: Tensor, terms: int) -> Tensor:
    """Σ a_i b_j over the bfloat16 terms with i + j < ``terms``, accumulated in float32."""
    left, right = bfloat16_terms(a, terms), bfloat16_terms(b, terms)
    pairs = [(i, j) for i in range(len(left)) for j in range(len(right)) if i + j < terms]
    if len(left) == 1 or len(right) == 1:  # one side is bfloat16 already (a model's weight): no copy of it
        out = None
        for i, j in reversed(pairs):  # smallest terms first
            part = _product(left[i], right[j])
            out = part if out is None else out.add_(part)
        return out
    # Σ a_i b_j as one product over the pairs laid side by side: one launch, one float32 accumulation
    return _product(torch.cat([left[i] for i, _ in pairs], -1), torch.cat([right[j] for _, j in pairs], -2))


class float32_products_emulated:  # noqa: N801  (used as a function: ``with float32_products_emulated():``)
    """While the block runs, :func:`matmul_float32` takes the native branch on any device, and ``mm`` / ``bmm`` with
    ``out_dtype`` are computed from their inputs' float32 values where the device has no kernel for them (a
    ``TorchDispatchMode``: enter it outside any counting mode, so that a counter sees the bfloat16 products)."""

    def __enter__(self) -> None:
        from torch.utils._python_dispatch import TorchDispatchMode

        aten = torch.ops.aten

        class Emulated(TorchDispatchMode):
            def __torch_dispatch__(self, func: Any, types: Any, args: tuple = (), kwargs: dict | None = None) -> Any:
                kwargs = dict(kwargs or {})
                if func in (aten.mm.dtype, aten.bmm.dtype):
                    dtype = kwargs.pop("out_dtype", args[2] if len(args) > 2 else torch.float32)
                    product = torch.mm if func is aten.mm.dtype else torch.bmm
                    return product(args[0].float(), args[1].float()).to(dtype)
                return func(*args, **kwargs)

        self._mode = Emulated()
        _EMULATED.append(True)
        self._mode.__enter__()

    def __exit__(self, *exc: Any) -> None:
        try:
            self._mode.__exit__(*exc)
        finally:
            _EMULATED.pop()
