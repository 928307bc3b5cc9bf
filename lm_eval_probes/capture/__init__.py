"""Hidden states taken out of the model's own forwards and reduced at once.

* :mod:`.readouts` — the one place that knows each architecture's final norm, unembedding and logit transform
  (:class:`~lm_eval_probes.capture.readouts.LensReadout`) and re-runs its last blocks for Ω
  (:class:`~lm_eval_probes.capture.readouts.FocalDepthDecoder`);
* :mod:`.positions` — the hidden-state hooks, the :class:`~lm_eval_probes.capture.positions.PositionProbe` interface a
  probe's declaration names, and the per-position probe values of a response span and their reduction to a record;
* :mod:`.tcb`, :mod:`.bte`, :mod:`.reader`, :mod:`.omega` — each probe's ``PositionProbe``: the layers it reads, its
  per-position values, its record fields (the reader module also holds the prompt means the wrappers take);
* :mod:`.loglikelihood` — the bookkeeping of one ``loglikelihood`` call (which answers need the lens, each answered
  request's states out of the batch);
* :mod:`.margins` — the first attention layer's inputs and the stability margins of ``probes=margin``.

The math itself lives in :mod:`lm_eval_probes.probes`; nothing here imports lm_eval.
"""
