"""The two lm_eval model wrappers and what they share.

* :mod:`.autoregressive` — ``hf-probes`` (:class:`~lm_eval_probes.models.autoregressive.ProbeHFLM`): HFLM that probes
  the hidden states of every response it scores or generates;
* :mod:`.diffusion` — ``hf-probes-diffusion`` (:class:`~lm_eval_probes.models.diffusion.DiffusionProbeHFLM`): HFLM for
  masked-diffusion LMs (LLaDA, Dream); its decoding and likelihood estimators are :mod:`.diffusion_decoding`, its
  options :mod:`.diffusion_config`;
* :mod:`.barrier_training` — the log-barrier training penalty of the support-token paper and a small GPT that has one
  (not a wrapper: training, beside the models the margins are read from).

Importing this package imports nothing heavy; each wrapper module imports torch and lm_eval.
"""
