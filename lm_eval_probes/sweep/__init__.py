"""``lm-eval-probes sweep CONFIG.yaml``: models × tasks through lm_eval with one uniform setup.

Every (model, task) pair runs through ``lm_eval.simple_evaluate`` with the same probes, seeds, limit,
few-shot count, batch-size policy and task metadata, and writes lm_eval's own files (``results_<date>.json``,
``samples_<task>_<date>.jsonl``, via lm_eval's ``EvaluationTracker`` as its CLI does) into
``<output_dir>/runs/<model>/<task>/``. Then ``lm-eval-probes report <output_dir>/runs --out ...`` builds
the leaderboard.

* **Atomic, resumable.** A pair is written into ``<output_dir>/.partial/`` and moved into place with one
  ``os.replace``; a pair whose folder exists is finished and skipped on a rerun. A crash leaves at most a partial
  folder, which is ignored and redone; a finished sweep leaves none.
* **Ctrl-C is an answer.** The status being written is finished, ``sweep_status.json`` is written
  (``"interrupted": true``), the pair in progress stays pending (its attempt folder removed), and the command
  prints ``interrupted: N done, M pending — rerun the same command to resume`` and exits 130; a second Ctrl-C
  stops it at once.
* **Failures recorded, sweep goes on.** A model that fails to load (a missing folder — said as such, by
  :func:`lm_eval_probes.harness.pretrained.check_pretrained` before anything loads —, unsupported architecture,
  out of memory) or a pair that fails to evaluate is recorded with its error in
  ``<output_dir>/status/<model>__<task>.json`` (collected into ``<output_dir>/sweep_status.json``); the
  other pairs still run; failed pairs are retried by the next run.
* **Sharding without a coordinator.** ``--shard K/N`` (0 ≤ K < N) runs pair i of the sorted pair list
  when i mod N = K: N processes, Slurm array tasks or machines split the sweep, into one shared
  ``output_dir`` or each into its own (``--output_dir``) whose ``runs/`` folders are then copied into one;
  either way the report equals the unsharded sweep's (docs/scale-out.md).
* **Any machine.** Without ``device`` each model goes where lm_eval's CLI puts it without ``--device``:
  the first GPU when there is one, else the CPU (:func:`model_device`).
* **One model load per model** (per process): its pairs reuse the loaded model.
* **Generate elsewhere, probe here.** A model entry with ``generate_with: vllm`` (or ``sglang``, ``hf``) has lm_eval's
  own model of that type (loaded once, released before the probing model loads) generate each pair with
  ``--log_samples`` (kept in ``<output_dir>/generations/``), then ``probe-run`` (:mod:`lm_eval_probes.probe_run`)
  adds the probes with one forward per document; ``samples: DIR``
  probes existing runs instead. Without vLLM installed such a pair fails saying so, or runs as an ``hf-probes`` pair
  with ``fallback: hf-probes``.

The config is parsed into frozen dataclasses and validated (unknown keys name the valid ones, the
plugin's ``probe_*`` options are checked) before anything heavy is imported; task names are checked
against lm_eval's task index before the first model loads. lm_eval is imported only inside
:func:`run_sweep`.
"""

