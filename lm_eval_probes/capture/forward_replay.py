"""The model's own remaining computation from a depth of its block calls, on states put there (HyperLens Ω where the
blocks alone are not that computation).

A model's depth axis is the sequence of its block calls in the order its forward makes them — block k once per pass
in a looped model (Dory, HRM), so that state i (``hidden_states[i]``) is the output of call i and state 0 the first
call's input. Where the forward computes between those calls by code of its own — Dory's norm and input injection
before each loop, HRM's stack norms and the sum of its two streams, Inkling-2's block attention residuals (a running
list of block-boundary states that later blocks read, and the residual over it before the final norm) — re-running the
last m blocks is not the model's computation. :class:`ForwardReplay` then re-runs the model's own body
(``model.base_model``) on the captured inputs of the rows, with state N − m replaced by the states given (the output
of call N − m; the first call's input for m = N), and takes the lens input (the final norm's input, its last call):
every block call and every computation between them after that depth is the model's own, with the states of the
earlier depths the model's own too: the calls before the depth are given their captured outputs (the code between them
runs again, on those), or, where that does not reproduce the model's own output, run again.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Sequence
from typing import Any

import torch
from torch import nn

__all__ = ["ForwardReplay", "block_calls", "output_state"]

_NONE = object()


def _hidden(args: tuple[Any, ...], kwargs: dict[str, Any], name: str) -> torch.Tensor:
    """A block call's hidden-state argument: its first positional one, else the keyword ``name``."""
    return args[0] if args else kwargs[name]


def output_state(output: Any) -> torch.Tensor:
    """A block's output state: the output itself, or its first entry (a block that returns a tuple)."""
    return output[0] if isinstance(output, (tuple, list)) else output


def _with_state(output: Any, state: torch.Tensor) -> Any:
    return (state, *output[1:]) if isinstance(output, (tuple, list)) else state


class block_calls:  # noqa: N801 - a context manager, named for what it yields
    """Hooks that number the calls of the blocks ``calls`` (each call's module, in the forward's order) as they are
    made, from 0 (again at each call of ``reset_on``, the model): ``on_input(index, state)`` sees call ``index``'s
    hidden input and may return it replaced, ``on_output(index, output)`` its output, likewise (``None``: kept).
    :attr:`made` counts the calls."""

    def __init__(self, calls: Sequence[nn.Module], *, on_input: Callable[[int, torch.Tensor], Any] | None = None,
                 on_output: Callable[[int, Any], Any] | None = None, reset_on: nn.Module | None = None) -> None:
        self.calls, self.on_input, self.on_output, self.reset_on = list(calls), on_input, on_output, reset_on
        self.made = 0
        self._handles: list[Any] = []
        self._names = {id(block): next(iter(inspect.signature(block.forward).parameters)) for block in self.calls}

    def __enter__(self) -> block_calls:
        started: list[int] = []  # the index of the call that has begun and not returned

        def before(block: nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
            index = self.made
            self.made += 1
            started.append(index)
            if self.on_input is not None:
                replaced = self.on_input(index, _hidden(args, kwargs, self._names[id(block)]))
                if replaced is not None:
                    if args:
                        return (replaced, *args[1:]), kwargs
                    return args, {**kwargs, self._names[id(block)]: replaced}
            return None

        def after(_block: nn.Module, _args: tuple[Any, ...], output: Any) -> Any:
            index = started.pop()
            return None if self.on_output is None else self.on_output(index, output)

        def reset(*_: Any) -> None:
            self.made = 0
            started.clear()

        for block in dict.fromkeys(self.calls):  # each module once, however often it is called
            self._handles.append(block.register_forward_pre_hook(before, with_kwargs=True))
            self._handles.append(block.register_forward_hook(after))
        if self.reset_on is not None:
            self._handles.append(self.reset_on.register_forward_pre_hook(reset))
        return self

    def __exit__(self, *_: Any) -> None:
        for handle in self._handles:
            handle.remove()
        self._handles = []


class ForwardReplay:
    """The model's body re-run with state ``entry`` (a ``hidden_states`` index: the output of call ``entry``, the
    first call's input for 0) replaced, to the lens input.

    Args:
        body: the module whose forward makes every block call and calls the lens input (``model.base_model``).
        calls: the block module of each call, in the forward's order (a looped model's: a block once per pass).
        lens_input: the module whose last call's input the lens reads (the final norm, or the streams' merge);
            ``None``: the last call's output.
        batch_first: the lens's view of a block's states (:meth:`~lm_eval_probes.capture.readouts.LensReadout.batch_first`).
        block_layout: its inverse.
    """

    def __init__(self, body: nn.Module, calls: Sequence[nn.Module], lens_input: nn.Module | None,
                 batch_first: Callable[[torch.Tensor], torch.Tensor],
                 block_layout: Callable[[torch.Tensor], torch.Tensor]) -> None:
        self.body, self.calls, self.lens_input = body, list(calls), lens_input
        self.batch_first, self.block_layout = batch_first, block_layout

    @classmethod
    def of(cls, model: nn.Module, calls: Sequence[nn.Module], lens_input: nn.Module | None,
           batch_first: Callable[[torch.Tensor], torch.Tensor],
           block_layout: Callable[[torch.Tensor], torch.Tensor]) -> ForwardReplay | None:
        """The replay of ``model`` where its body (``model.base_model``) is a module of its own holding every block
        (the wrapper's hooks, on the model itself, see none of its calls); ``None`` otherwise."""
        body = getattr(model, "base_model", model)
        if body is model or not isinstance(body, nn.Module):
            return None
        inside = {id(module) for module in body.modules()}
        if not all(id(block) in inside for block in calls):
            return None
        return cls(body, calls, lens_input, batch_first, block_layout)

    def run(self, states: torch.Tensor, entry: int, args: tuple[Any, ...], kwargs: dict[str, Any],
            earlier: Sequence[Any] | None = None) -> torch.Tensor:
        """The lens input, batch first, of the body called with ``args`` and ``kwargs`` (already cut to the rows of
        ``states``) with state ``entry`` replaced by ``states [n, T, ...]`` (batch first). ``earlier``: the outputs of
        calls 0 … entry − 1 (cut to the same rows), which the replay then gives instead of running those calls (the
        code between them still runs, on these); ``None``: they run again. Raises ``RuntimeError`` where the forward did
        not make call ``entry`` or did not reach the lens input."""
        replacement = self.block_layout(states)
        replaced = [0]
        taken: list[torch.Tensor] = []
        current = [-1]

        def on_input(index: int, _state: torch.Tensor) -> torch.Tensor | None:
            current[0] = index
            if entry == 0 and index == 0:
                replaced[0] += 1
                return replacement.to(_state.dtype)
            return None

        def on_output(index: int, output: Any) -> Any:
            if self.lens_input is None and index == len(self.calls) - 1:
                taken.append(self.batch_first(output_state(output)))
            if entry and index == entry - 1:
                replaced[0] += 1
                return _with_state(output, replacement.to(output_state(output).dtype))
            return None

        def given(forward: Callable[..., Any]) -> Callable[..., Any]:
            def call(*call_args: Any, **call_kwargs: Any) -> Any:
                return earlier[current[0]] if current[0] < entry else forward(*call_args, **call_kwargs)
            return call

        made = block_calls(self.calls, on_input=on_input, on_output=on_output)  # names read before any patching
        handles = []
        patched: list[tuple[nn.Module, Any]] = []  # each block with the forward its instance had of its own
        if self.lens_input is not None:
            handles.append(self.lens_input.register_forward_pre_hook(lambda _module, a: taken.append(a[0])))
        try:
            if earlier is not None:
                if len(earlier) != entry:
                    raise ValueError(f"the outputs of {entry} calls are needed, got {len(earlier)}")
                for block in dict.fromkeys(self.calls[:entry]):
                    patched.append((block, block.__dict__.get("forward", _NONE)))  # accelerate's hooks set one
                    block.forward = given(block.forward)
            with made:
                self.body(*args, **kwargs)
        finally:
            for block, own in patched:
                if own is _NONE:
                    del block.forward
                else:
                    block.forward = own
            for handle in handles:
                handle.remove()
        if replaced[0] != 1 or made.made != len(self.calls) or not taken:
            raise RuntimeError(f"the replayed forward made {made.made} block calls (expected {len(self.calls)}), "
                               f"replaced state {entry} {replaced[0]} times and reached its lens input {len(taken)} times")
        return taken[-1]
