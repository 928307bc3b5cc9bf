"""Leaderboard reports from lm_eval output files (``results_*.json``, ``samples_*.jsonl``).

Torch-free and lm_eval-free: :mod:`.reading` finds and parses the files and merges runs of one model,
:mod:`.corpus_rows` recomputes corpus-level rows from per-document records, :mod:`.bootstrap` draws
their confidence intervals, :mod:`.pairwise` compares models document by document (paired CIs, McNemar,
Holm), :mod:`.columns` says what each column means (descriptions, directions, headline columns, the
glossary: all from the declarations), :mod:`.tables` builds and renders the tables (Markdown, CSV), :mod:`.plots`
the figures (matplotlib) and :mod:`.html` the self-contained page (jinja2); :mod:`.ranks` gives each model its rank interval and tie group,
:mod:`.sweep_status` reads what a sweep attempted without a result, :mod:`.details` and :mod:`.every_eval_ever`
write the per-document Parquet files and the Every Eval Ever export; :mod:`.report` ties them together
(``lm-eval-probes report``).
"""

from __future__ import annotations

from lm_eval_probes.reports.report import Report, build_report, main

__all__ = ["Report", "build_report", "main"]
