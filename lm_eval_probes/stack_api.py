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
"""

from __future__ import annotations

import weakref
from collections.abc import Callable, Iterable, Sequence
from typing import Any

import torch

SELECTIONS = ("hidden_states", "blocks", "flag")
"""How a model reads a list ``output_hidden_states`` (see the module's text)."""

_SELECTION: weakref.WeakKeyDictionary[Any, str] = weakref.WeakKeyDictionary()


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


def hidden_states_of(model: Any, request: bool | list[int], states: Sequence[torch.Tensor | None]
                     ) -> tuple[torch.Tensor | None, ...]:
    """A forward's ``hidden_states`` for ``request`` (from :func:`hidden_states_request`) in the L + 1 convention."""
    if isinstance(request, list) and _SELECTION.get(model) == "blocks":
        return (None, *states)
    return tuple(states)


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
