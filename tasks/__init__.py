"""The plugin's lm_eval tasks, installed as ``lm_eval_probes.tasks`` (this folder is the package's ``tasks``
subpackage: ``setup.cfg``'s ``package_dir``).

* the task YAMLs (``probes_*.yaml``): ``lm_eval --include_path`` of :data:`lm_eval_probes.TASKS_DIR`;
* :mod:`.probe_task` — the probe rows any lm_eval task gets (``ProbeResults``, ``ProbeTask``);
* :mod:`.loaders`, :mod:`.noise`, :mod:`.synth_arith`, :mod:`.synth_logic`, :mod:`.seeded_generation` — the
  documents of the tasks (benchmark loaders, noised twins, the offline synthetic graded tasks).
"""
