"""``lm-eval-probes probe-run RUN``: the probes added to a finished lm_eval run of any backend (``hf``, ``vllm``,
``sglang``, ``hf-probes``), one teacher-forced forward per document, the run's accuracy and responses kept.

* :mod:`.logged` — reading and checking the run's results and ``--log_samples`` files;
* :mod:`.progress` — the per-document progress that makes a killed run resumable;
* :mod:`.runner` — :func:`~lm_eval_probes.probe_run.runner.probe_run`: the replay through lm_eval's own
  ``simple_evaluate`` (the model: :class:`lm_eval_probes.models.replay.ReplayHFLM`);
* :mod:`.cli` — the command line.

Importing this package imports nothing heavy.
"""
