"""Hidden states taken out of the model's own forwards and reduced at once.

* :mod:`.readouts` — the one place that knows each architecture's final norm, unembedding and logit transform
  (:class:`~lm_eval_probes.capture.readouts.LensReadout`) and re-runs its last blocks for Ω
  (:class:`~lm_eval_probes.capture.readouts.FocalDepthDecoder`);
* :mod:`.masked_readout` — a masked-diffusion LM's lens (its own head, found by what its forward does and checked at
  load) and the lens grid of a few positions (``probe_traces=true`` of ``hf-probes-diffusion``);
* :mod:`.plan` — the :class:`~lm_eval_probes.capture.plan.ProbePlan` of a loaded model, built once at load: the enabled
  probes' position probes, the skipped ones with their reasons, the whole-forward captures they ask for and the layers
  a probed forward keeps;
* :mod:`.captures` — the whole-forward captures a probe may ask for, registered by name, and their set-up on the
  loaded model; :mod:`.calls` — their hooks in the wrappers' calls (:class:`~lm_eval_probes.capture.calls.CallCaptures`,
  the wrappers' one handle on them), the built-ins' in :mod:`.builtin_hooks`;
* :mod:`.positions` — the hidden-state hooks, every enabled probe's :class:`~lm_eval_probes.api.PositionProbe` at
  a response span's positions (the probes themselves: each built-in's ``probe`` module under :mod:`lm_eval_probes.probes` and the entry points), and their
  reduction to a record;
* :mod:`.reader` — the prompt means the wrappers take;
* :mod:`.loglikelihood` — the bookkeeping of one ``loglikelihood`` call (which answers need the lens, each answered
  request's states out of the batch);
* :mod:`.attention_calls` — transformers' attention interface recorded, and the first softmax-attention layer found
  through it; :mod:`.attention` — that layer's queries, keys and query-map Jacobian over the positions a forward saw,
  re-run from its kept arguments (:mod:`.own_attention`: layers that compute their attention themselves);
  :mod:`.attention_fields` — a request's per-position values as each response's record fields.

The math itself lives in :mod:`lm_eval_probes.probes`; nothing here imports lm_eval.
"""
