"""Everything that touches lm_eval's internals (0.4.13), and the list of them: the one place to revisit on an upgrade.

Modules: :mod:`.registry` (models and rows in lm_eval's registries; cheap, imported when lm_eval's registry is first
imported, by the finder the ``.pth`` installs), :mod:`.hflm` (the HFLM machinery both wrappers hook into: the cache-hook tap, the response-cache table,
ranks, the unprobed-task warning), :mod:`.wrapper` (the public methods both wrappers share, and their generation
bookkeeping). The task side of that list lives with the tasks (:mod:`lm_eval_probes.tasks.manager`:
probe rows for any task, the class swap and the task manager), which import this package, never the reverse.

What the plugin relies on beyond lm_eval's documented API, and why:

Registries
    ``model_registry.register(name, target=...)`` lazy placeholders (0.4.13 has no plugin discovery; the
    ``lm_eval.models`` entry points in ``setup.cfg`` serve the harness's discovery after 0.4.13);
    ``register_metric`` / ``register_aggregation`` for every row, after lm_eval's built-ins are imported (lm_eval
    fills its registry only when it is empty).
Tasks (:mod:`lm_eval_probes.tasks.manager`, :mod:`lm_eval_probes.tasks.probe_task`)
    A built ``ConfigurableTask``'s ``__class__`` swapped for a subclass with ``ProbeResults`` mixed in (it adds no
    instance layout); its ``_aggregation_list`` and ``_higher_is_better`` filled with the rows; ``construct_requests``,
    ``apply_filters`` and ``process_results`` extended (``_instances`` read after filtering, to re-attach each
    response's probe that lm_eval's filters drop); ``TaskManager.load``; ``lm_eval.tasks.TaskManager`` replaced while
    ``lm_eval.__main__.cli_evaluate`` runs under ``lm-eval-probes`` (the CLI builds its manager from that name).
Requests
    Each ``Instance`` of a task with probe rows carries a :class:`~lm_eval_probes.records.ProbeRequest` as an extra
    attribute (``probe_request``); the wrappers read ``task_name``, ``doc_id``, ``idx`` and ``args``.
HFLM (each wrapper: 5 overridden methods besides ``__init__``, 3 of them shared in :class:`.wrapper.ProbeWrapper`;
``tests/test_wrapper_overrides.py`` counts them)
    * ``cache_hook`` (an attribute of lm_eval's ``LM``, a property here) — ``--use_cache`` reads responses before the
      model is called, so a run's table (one per probe configuration) must be chosen when ``set_cache_hook`` sets
      the hook: ``CachingLM``'s ``dbdict`` (a ``SqliteDict``) has its ``tablename`` switched
      (:func:`.hflm.namespace_response_cache`);
    * ``get_model_info`` — the probes skipped on this model (``probes_skipped``) join the results' config;
    * ``loglikelihood`` / ``generate_until`` — public; around HFLM's own, they replace ``cache_hook`` with a tap
      (:func:`.hflm.answers_tapped`): HFLM calls ``cache_hook.add_partial(attr, key, answer)`` once per answered
      request, right after the forward that answered it, which is how each answer finds its states;
    * ``_loglikelihood_tokens`` (private) — the one place where the requests' token ids exist: each request's row
      is found in every batch by its ids, assuming HFLM's row ``(context + continuation)[-(max_length + 1):][:-1]``
      right-padded with id 0; a pre-hook on the model passes ``logits_to_keep``, relying on HFLM's
      ``ctx_len = inplen + (logits.shape[0] − padding_len_inp)`` to find each continuation in the shorter logits;
    * ``_model_generate`` (private) — the one place where a generation's ids (and the states of ``generate``'s own
      calls) exist; the text it becomes is predicted with ``lm_eval.models.utils.postprocess_generated_text``, as
      HFLM's ``generate_until`` makes it;
    * diffusion only: ``_model_generate`` replaced by masked-diffusion decoding, ``_loglikelihood_tokens``
      by the Monte-Carlo estimate (HFLM's rolling windows, keyed ``None``, are refused there).
    * Arguments: lm_eval's parser splits a ``model_args`` string at every comma, so ``probes=tcb,bte`` reaches
      ``__init__`` as ``probes="tcb"`` and a bare ``bte=""``, in order; ``__init__`` joins them
      (:func:`~lm_eval_probes.config.joined_list_args`; no ``create_from_arg_string`` of its own).
    * Data parallel: ``_rank`` / ``_world_size`` set from HFLM's own ``accelerator`` (:func:`.hflm.take_ranks_from_accelerate`;
      HFLM 0.4.13 splits documents only when it sees more than one GPU).
"""
