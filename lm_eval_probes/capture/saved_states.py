"""``probe_save_states=DIR``: the reader layers' hidden states of every answered request, for users' own probes.

Each ``loglikelihood`` / ``generate_until`` call of a wrapper writes one safetensors file per process,
``DIR/states-rank<r>-<call>.safetensors``, and appends its entries to ``DIR/index-rank<r>.jsonl``. A request's
tensors are keyed ``<task>/<doc_id>/<idx>/<n>/<kind>``: ``idx`` is lm_eval's request index within the document (a
multiple-choice option; 0 for a generation), ``n`` counts repeats of the same request (0 unless a task repeats it),
and ``kind`` is

* ``answer`` — ``[k, H]`` float32: the mean over the response positions (the option's tokens; a generation's kept
  tokens) of each reader layer;
* ``prompt`` — ``[k, H]`` float32: the mean over the prompt positions (or the last ``probe_reader_prompt_tail``);
* ``tail`` — generations only, ``[k, m, H]`` (float16, float32 where a value exceeds float16's range): the last
  m = ``probe_reader_tail`` positions one by one, from which a reader can average over the answer span the task's
  filter extracts.

Each index line (JSON) names one request: ``file``, ``key`` (the prefix above), ``task``, ``doc_id``, ``idx``,
``repeat``, ``request_type``, ``layers`` (the ``hidden_states`` indices of the k rows), ``response_tokens``,
``prompt_tokens`` and ``kinds``. The layout does not depend on the batch size; with data parallelism each rank
writes its own files (its documents). Sizes: 2·k·H float32 per request plus k·m·H float16 per generation — for
SmolLM2-135M (k = 3, H = 576) 13.8 KB per request (+ 55 KB per generation's tail at m = 16), for an 8B model
(H = 4096) 98 KB (+ 393 KB).
"""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch
from safetensors.torch import save_file

from lm_eval_probes.records import LayerStates, probe_of

KINDS: tuple[tuple[str, str], ...] = (("answer", "answer_states"), ("prompt", "prompt_states"), ("tail", "tail_states"))
"""(tensor kind, :class:`~lm_eval_probes.records.ResponseProbe` field) of what is saved."""


class StatesWriter:
    """Writes the states of each call's answered requests (see the module docstring)."""

    def __init__(self, folder: str | Path, rank: int = 0) -> None:
        self.folder = Path(folder)
        self.folder.mkdir(parents=True, exist_ok=True)
        self.rank = rank
        self._calls = len(list(self.folder.glob(f"states-rank{rank}-*.safetensors")))  # a rerun appends
        self._seen: Counter[tuple[Any, ...]] = Counter()

    def write(self, requests: Sequence[Any], responses: Sequence[Any]) -> Path | None:
        """Save the states that ``responses`` (the wrapper's answers to ``requests``, in order) carry; returns the
        file written, or ``None`` when no response carried any."""
        tensors: dict[str, torch.Tensor] = {}
        entries = []
        name = f"states-rank{self.rank}-{self._calls:05d}.safetensors"
        for request, response in zip(requests, responses, strict=True):
            probe = probe_of(response)
            if probe is None:
                continue
            identity = (request.task_name, request.doc_id, request.idx)
            repeat = self._seen[identity]
            self._seen[identity] += 1
            key = f"{request.task_name}/{request.doc_id}/{request.idx}/{repeat}"
            kinds, layers = [], None
            for kind, field in KINDS:
                states: LayerStates | None = probe.get(field)
                if states is None:
                    continue
                tensors[f"{key}/{kind}"] = torch.from_numpy(np.array(states.values, copy=True))  # options share prompt states
                kinds.append(kind)
                layers = list(states.layers)
            if kinds:
                entries.append({"file": name, "key": key, "task": request.task_name, "doc_id": request.doc_id,
                                "idx": request.idx, "repeat": repeat, "request_type": request.request_type,
                                "layers": layers, "response_tokens": probe.n_tokens,
                                "prompt_tokens": probe.prompt_tokens, "kinds": kinds})
        if not tensors:
            return None
        path = self.folder / name
        save_file(tensors, str(path), metadata={"rank": str(self.rank), "requests": str(len(entries))})
        with open(self.folder / f"index-rank{self.rank}.jsonl", "a", encoding="utf-8") as index:
            index.writelines(json.dumps(entry) + "\n" for entry in entries)
        self._calls += 1
        return path


def states_writer(folder: str | None, rank: int) -> StatesWriter | None:
    """A writer into ``folder`` (``probe_save_states``) for this process, or ``None`` without one."""
    return None if folder is None else StatesWriter(folder, rank)
