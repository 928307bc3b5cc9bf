"""lm_eval's registries: the models' lazy placeholders and the probe rows as metrics and aggregations.

* :func:`register_model_placeholder` — lazy ``hf-probes`` / ``hf-probes-diffusion`` entries (0.4.13 has no plugin
  discovery: the finder the ``.pth`` puts on ``sys.meta_path``, ``_lm_eval_probes_autoload``, calls it when
  ``lm_eval.api.registry`` is first imported; ``setup.cfg`` also declares the ``lm_eval.models`` entry points for
  an lm_eval that discovers them, and then the finder stands aside);
* :func:`register_rows` — every row of :mod:`lm_eval_probes.rows` as a metric, and the plugin's aggregations
  (lm_eval auto-imports its built-ins only into an empty registry, so those come first).

Importing this module is cheap (no torch, no lm_eval); nothing imports it at interpreter start.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

MODEL_NAME = "hf-probes"
MODEL_TARGET = "lm_eval_probes.models.autoregressive:ProbeHFLM"
DIFFUSION_MODEL_NAME = "hf-probes-diffusion"
DIFFUSION_MODEL_TARGET = "lm_eval_probes.models.diffusion:DiffusionProbeHFLM"


def register_model_placeholder() -> None:
    """Register the lazy ``hf-probes`` and ``hf-probes-diffusion`` placeholders in lm_eval's model registry
    (idempotent; no torch). Refuses an unsupported lm-eval, transformers or torch first, in one line."""
    from lm_eval_probes.harness.supported_versions import check_supported_versions

    check_supported_versions()
    import lm_eval.models  # noqa: F401  (built-in placeholders first, else they get hidden)
    from lm_eval.api.registry import model_registry

    for name, target in ((MODEL_NAME, MODEL_TARGET), (DIFFUSION_MODEL_NAME, DIFFUSION_MODEL_TARGET)):
        if name not in model_registry:
            model_registry.register(name, target=target)


_REGISTERED: list[Any] = [None]  # the rows table last registered


def register_rows() -> None:
    """Register every row of :func:`lm_eval_probes.rows.all_rows` and the plugin's aggregations (once per set of
    registered probes).

    Raises:
        ProbeRegistrationError: a probe's row whose name lm_eval already uses for a metric of its own (``acc``,
            ``exact_match``, …), naming the probe and the row.
    """
    from lm_eval_probes.rows import AGGREGATIONS, all_rows

    table = all_rows()
    if _REGISTERED[0] is table:
        return
    import lm_eval.api.metrics  # noqa: F401  (built-in aggregations such as "mean" first)
    from lm_eval.api.registry import aggregation_registry, metric_registry, register_aggregation, register_metric

    from lm_eval_probes.api import ProbeRegistrationError
    from lm_eval_probes.registry import probes

    owner = {row.name: probe.name for probe in probes() for row in (*probe.rows, *probe.difficulty_rows(), *probe.feeds)}
    for name, fn in AGGREGATIONS.items():
        if name not in aggregation_registry:
            register_aggregation(name)(fn)
    for row in table:
        if row.name in metric_registry:
            if metric_registry.get(row.name) is not _value_made_in_process_results and row.name in owner:
                raise ProbeRegistrationError(f"probe {owner[row.name]!r}, row {row.name!r}: lm_eval already has a "
                                             f"metric of that name; rename the row")
            continue
        register_metric(metric=row.name, higher_is_better=row.higher_is_better, aggregation=row.aggregation)(
            _value_made_in_process_results
        )
    _REGISTERED[0] = table


def _value_made_in_process_results(items: Any) -> Any:
    """lm_eval's metric registry wants a callable; the probe rows' values are made in ``process_results``."""
    return items


def task_aggregation(row: Any, options: Any) -> Callable[..., Any]:
    """The aggregation callable of one row for one task (``mean`` is lm_eval's, for its stderr)."""
    from lm_eval.api.registry import get_aggregation

    from lm_eval_probes.rows import bound_aggregation

    return bound_aggregation(row, options) or get_aggregation(row.aggregation)
