"""The built-in probes, each one module exporting one :class:`~lm_eval_probes.api.Probe` (``PROBE``), written with the
public API of :mod:`lm_eval_probes.api` only, as a third-party probe is (:mod:`lm_eval_probes.registry`).

Their math lives in :mod:`lm_eval_probes.probes` (pure functions on tensors), imported when a capture runs, so that
loading these modules (``--help``, option validation, the reports) imports no torch.
"""
