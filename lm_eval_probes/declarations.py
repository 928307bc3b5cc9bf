"""Every probe and every results row of the plugin, declared once.

A probe is one :class:`ProbeDeclaration`: its name (``probes=``), what it reads (layers and positions), its
per-position function (in :mod:`lm_eval_probes.probes`), its per-document reduction, the
:class:`~lm_eval_probes.records.ResponseProbe` fields it fills, and its rows — each a :class:`Row` with its
name, per-document value kind, aggregation, direction and a one-line description, and (``field``) the record
field its per-document value is read from. A probe with a ``ranked`` field also gets the difficulty rows
``<name>_spearman``, ``<name>_spearman_partial`` and ``<name>_spearman_partial_prompt`` of that field.

Driven by these declarations: ``probes=all`` and the probe list of ``lm-eval-probes --help``
(:data:`PROBE_NAMES`), the capture at each response's positions and its reduction to record fields (each probe's
:attr:`ProbeDeclaration.capture`, run by :func:`lm_eval_probes.capture.positions.position_probes`), the fields a
:class:`~lm_eval_probes.records.ResponseProbe` carries, the rows registered with lm_eval and added to each task
(:mod:`lm_eval_probes.rows`), each document's probe values (``tasks/probe_task.py``), and the report's column order,
descriptions and glossary. Adding a probe: its math in :mod:`lm_eval_probes.probes`, its capture (a
:class:`~lm_eval_probes.capture.positions.PositionProbe`: the layers it reads, its per-position values, their
reduction to its record fields) and its declaration here (``docs/design.md``, "Adding a probe").

The rows that are not one probe's — the response's own (confidence, lengths), the difficulty baselines,
calibration and selective prediction, the correctness reader, the corruption detector, calibration along the
denoising trajectory — are declared beside the probes, in the same form.

Per-document value kinds (what ``process_results`` returns for the row, and what ``--log_samples`` files hold):

* ``float``: a number (``None`` when undefined for the document); aggregated by ``mean``.
* ``flag``: 0/1; aggregated by a sum (``probe_count``).
* ``ranked``: ``(value, difficulty)``; ``partial``: ``(value, difficulty, length)`` (difficulty ``None`` when the
  document has no label: skipped).
* ``confidence``: ``(confidence, correct)``; ``confidence_keyed``: ``(confidence, correct, document)`` (the
  document's identity orders the records before a seeded split, so no float decides a fold).
* ``reader``: a :class:`~lm_eval_probes.records.ReaderRecord`.
* ``vector``: a list of floats (a depth profile or trajectory), so that ``--log_samples`` files carry it for the
  reports; aggregated by the mean over documents of its mean (``probe_vector_mean``).
* ``support``: the support tokens, ``{"positions": [...], "tokens": [...], "margins": [...]}`` (smallest margin
  first; from the record fields ``<field>_positions``, ``<field>_tokens``, ``<field>_values``); aggregated by the
  mean over documents of the mean support margin (``probe_support_mean``).

Torch-free and lm_eval-free, so that configuration, ``--help`` and the reports can read it.
"""

from __future__ import annotations

from dataclasses import dataclass

VALUE_KINDS = ("float", "flag", "ranked", "partial", "confidence", "confidence_keyed", "reader", "vector", "support")
FAMILIES = ("probe", "difficulty", "confidence", "reader", "detector", "trajectory")


@dataclass(frozen=True)
class Row:
    """One results row.

    Attributes:
        name: the metric name in lm_eval's results (``<name>,<filter>``).
        value: the per-document value kind (see the module docstring).
        aggregation: the registered aggregation name (``mean`` or ``probe_*``).
        higher_is_better: the direction lm_eval shows as an arrow.
        family: ``probe`` (a probe value), ``difficulty`` (ρ with difficulty and its baselines; tasks
            that declare a difficulty), ``confidence`` (calibration and selective prediction; tasks
            whose correctness is defined), ``reader`` (the latent correctness reader; same tasks),
            ``detector`` (paired clean/noised tasks only), ``trajectory`` (calibration along the denoising
            trajectory: masked-diffusion generations, tasks whose correctness is defined).
        description: what the row measures (one line; the report's column title and glossary).
        field: a probe's row: the :class:`~lm_eval_probes.records.ResponseProbe` field its per-document value is
            read from (``support``: the prefix of the three support fields); ``None`` for rows made otherwise.
        at_percent: a trajectory row: the point of the denoising trajectory it reads, in percent of the steps.
        diffusion_only: filled only by ``hf-probes-diffusion`` (records with reveal steps).
        scored: whether higher (or lower) is better, so that a report shows its direction and may count it as a
            win; ``False`` for baselines and bookkeeping (lengths, counts, reveal steps), whose
            ``higher_is_better`` only satisfies lm_eval's registry.
    """

    name: str
    value: str
    aggregation: str
    higher_is_better: bool
    family: str
    description: str
    field: str | None = None
    at_percent: int | None = None
    diffusion_only: bool = False
    scored: bool = True

    def __post_init__(self) -> None:
        if self.value not in VALUE_KINDS:
            raise ValueError(f"row {self.name!r}: unknown value kind {self.value!r}; valid: {VALUE_KINDS}")
        if self.family not in FAMILIES:
            raise ValueError(f"row {self.name!r}: unknown family {self.family!r}; valid: {FAMILIES}")


@dataclass(frozen=True)
class ProbeDeclaration:
    """One probe.

    Attributes:
        name: its name in ``probes=`` (``model_args``).
        summary: one line for ``--help`` and the report's glossary.
        paper: the source.
        formula: the per-position quantity and its per-document reduction, as a formula.
        reads: the layers and positions it reads.
        per_position: the function of :mod:`lm_eval_probes.probes` that computes its per-position values.
        fields: the :class:`~lm_eval_probes.records.ResponseProbe` fields it fills.
        capture: its :class:`~lm_eval_probes.capture.positions.PositionProbe` (``module:Class``, imported when a
            model enables the probe): the layers it reads at a response's positions, its per-position values and their
            reduction to :attr:`fields`; ``None`` for a probe with a capture of its own (the margins: hooks on the
            first attention layer over every position the model saw, :mod:`lm_eval_probes.capture.margins`).
        rows: its own rows (family ``probe``).
        feeds: rows of other families made from its record fields (the reader's: the correctness reader and the
            corruption detector).
        ranked: the record field ranked against the document's difficulty (the ρ rows), or ``None``.
        ranked_text: how the ρ rows' descriptions name that value.
        label: the value's name on a figure axis.
    """

    name: str
    summary: str
    paper: str
    formula: str
    reads: str
    per_position: str
    fields: tuple[str, ...]
    capture: str | None = None
    rows: tuple[Row, ...] = ()
    feeds: tuple[Row, ...] = ()
    ranked: str | None = None
    ranked_text: str = ""
    label: str = ""

    def row(self, value: str) -> Row:
        """Its first row of per-document value kind ``value`` (``float``: its headline row; ``vector``, ``support``)."""
        found = next((row for row in self.rows if row.value == value), None)
        if found is None:
            raise KeyError(f"probe {self.name!r} has no {value!r} row")
        return found

    def difficulty_rows(self) -> tuple[Row, ...]:
        """The ρ rows of :attr:`ranked`: with difficulty, and with the response's and the prompt's length
        partialled out."""
        if self.ranked is None:
            return ()
        return (
            Row(f"{self.name}_spearman", "ranked", "probe_spearman", True, "difficulty",
                f"Spearman ρ of {self.ranked_text} with the document's difficulty label", self.ranked),
            Row(f"{self.name}_spearman_partial", "partial", "probe_partial_spearman", True, "difficulty",
                f"{self.name}_spearman with response length partialled out", self.ranked),
            Row(f"{self.name}_spearman_partial_prompt", "partial", "probe_partial_spearman", True, "difficulty",
                f"{self.name}_spearman with prompt length partialled out", self.ranked),
        )


READER_ROWS: tuple[Row, ...] = (
    Row("lcr_auroc", "reader", "probe_lcr_auroc", True, "reader",
        "latent correctness reader: out-of-fold AUROC of P(correct) from answer hidden states"),
    Row("lcr_ece", "reader", "probe_lcr_ece", False, "reader", "latent correctness reader: ECE of its out-of-fold P(correct)"),
)
"""The latent correctness reader, fitted on the reader probe's answer states (tasks whose correctness is defined)."""

DETECTOR_ROWS: tuple[Row, ...] = (
    Row("corruption_auroc", "reader", "probe_corruption_auroc", True, "detector",
        "corruption detector: cross-fitted AUROC of clean vs noised prompts from prompt hidden states"),
    Row("corruption_confidence_auroc", "confidence", "probe_corruption_confidence_auroc", True, "detector",
        "AUROC of (1 − confidence) as a detector of noised prompts"),
)
"""The corruption detector (paired clean/noised tasks): the reader probe's prompt states, and confidence."""

PROBES: tuple[ProbeDeclaration, ...] = (
    ProbeDeclaration(
        name="tcb",
        summary="δ_TCB: how far the final hidden state can move before the next-token distribution changes "
                "(+ entropy, logit margin and V_eff baselines)",
        paper="Token Constraint Bound: \"Beyond Confidence: The Rhythms of Reasoning\" (ICLR 2026, arXiv 2602.10816)",
        formula="δ_TCB = ε / ‖J‖_F, J = ∂softmax(W h + b)/∂h, ‖J‖_F² = Σ_i o_i² ‖w_i − Wᵀo‖², ε = 1, per response "
                "position; per document the mean and the minimum of log10 δ_TCB",
        reads="the final layer's state at every response position (its logits: the harness's own readout)",
        per_position="lm_eval_probes.probes.tcb.tcb_with_baselines",
        fields=("tcb_log10_mean", "tcb_log10_min", "tcb_argmin", "entropy", "logit_margin", "v_eff_ipr", "v_eff_exp",
                "tcb_cluster_log10_mean", "tcb_disperse_log10_mean", "tcb_ablation_ordered"),
        capture="lm_eval_probes.capture.tcb:TcbPositions",
        rows=(
            Row("tcb_log10", "float", "mean", True, "probe",
                "mean over documents of the mean log10 δ_TCB over response positions", "tcb_log10_mean"),
            Row("tcb_log10_min", "float", "mean", True, "probe",
                "mean over documents of the smallest log10 δ_TCB of the response", "tcb_log10_min"),
            Row("tcb_ablation_ordered", "float", "mean", True, "probe",
                "probe_tcb_ablation=α: mean over documents of the fraction of response positions where δ_TCB with "
                "the competing tokens' unembedding rows clustered (×α) > δ_TCB > dispersed (×1/α), o held fixed",
                "tcb_ablation_ordered", scored=False),
            Row("tcb_cluster_log10", "float", "mean", True, "probe",
                "probe_tcb_ablation=α: mean over documents of the mean log10 δ_TCB with the competitors' rows "
                "clustered toward their probability-weighted centre by α", "tcb_cluster_log10_mean", scored=False),
            Row("tcb_disperse_log10", "float", "mean", True, "probe",
                "probe_tcb_ablation=α: mean over documents of the mean log10 δ_TCB with the competitors' rows "
                "dispersed from their probability-weighted centre by 1/α", "tcb_disperse_log10_mean", scored=False),
        ),
        ranked="tcb_log10_mean",
        ranked_text="the document's mean log10 δ_TCB",
        label="log10 δ_TCB",
    ),
    ProbeDeclaration(
        name="bte",
        summary="BTE: Jensen–Shannon energy between consecutive logit-lens beliefs, over the central window of "
                "depth (probe_bte_profile=full: every transition)",
        paper="Belief-Trajectory Energy: \"Measuring the Path to a Prediction\" (2026 preprint)",
        formula="BTE_t,l = JSD(p_t^(l), p_t^(l+1)) of consecutive logit-lens beliefs (nats); e(l) = mean over response "
                "positions; ē_M = mean of e(l) over the central window [⌊3L/8⌋, ⌊5L/8⌋)",
        reads="the states of the layers of the central window (or all L+1) at every response position",
        per_position="lm_eval_probes.probes.bte.consecutive_js_divergences_of_logits",
        fields=("bte_energy", "bte_profile", "bte_features"),
        capture="lm_eval_probes.capture.bte:BtePositions",
        rows=(
            Row("bte_energy", "float", "mean", False, "probe",
                "mean over documents of the BTE central-window energy ē_M (nats)", "bte_energy"),
            Row("bte_profile", "vector", "probe_vector_mean", False, "probe",
                "probe_bte_profile=full: mean over documents of the mean JSD e(l) over all L layer transitions "
                "(nats); per document the depth profile e(0..L-1) is in --log_samples", "bte_profile"),
        ),
        ranked="bte_energy",
        ranked_text="ē_M",
        label="BTE energy ē_M (nats)",
    ),
    ProbeDeclaration(
        name="reader",
        summary="the mean hidden states (answer and prompt positions, a few layers) that the latent correctness "
                "reader and the corruption detector are fitted on",
        paper="Latent Correctness Reader and corruption detector: \"Unsure but Certain\" (arXiv 2608.08791)",
        formula="mean hidden state over the answer (prompt) positions at the reader layers (L/2, 2L/3, 5L/6) → "
                "standardised L2 logistic regression, out-of-fold P(correct) (P(noised))",
        reads="the reader layers' states at the response (answer) and prompt positions",
        per_position="lm_eval_probes.probes.reader.reader_scores",
        fields=("answer_states", "prompt_states", "tail_states"),
        capture="lm_eval_probes.capture.reader:ReaderPositions",
        feeds=READER_ROWS + tuple(row for row in DETECTOR_ROWS if row.value == "reader"),
    ),
    ProbeDeclaration(
        name="omega",
        summary="Ω: HyperLens refinement area of the focal-depth confidence trajectory (runs the model's last m "
                "blocks again on every source layer's states)",
        paper="HyperLens refinement area: \"HyperLens: Quantifying Cognitive Effort …\" (arXiv 2605.05741)",
        formula="C_i = mean over response positions of the top-K mass of D_m(H_i) = softmax(W_U norm(f_N ∘ … ∘ "
                "f_N−m+1(H_i))); Ω = Σ_i (1 − C_i)",
        reads="every source layer's states at the response positions, and the last m blocks' inputs",
        per_position="lm_eval_probes.probes.omega.confidence_trajectory",
        fields=("omega", "omega_trajectory"),
        capture="lm_eval_probes.capture.omega:OmegaPositions",
        rows=(
            Row("omega", "float", "mean", False, "probe",
                "mean over documents of the HyperLens refinement area Ω = Σ_i (1 − C_i) of the focal-depth "
                "confidence trajectory (probes=omega)", "omega"),
            Row("omega_trajectory", "vector", "probe_vector_mean", True, "probe",
                "probes=omega: mean over documents and source layers of the focal-depth confidence C_i "
                "(= 1 − Ω / number of source layers); per document the trajectory C_i is in --log_samples",
                "omega_trajectory"),
        ),
        ranked="omega",
        ranked_text="Ω",
        label="HyperLens Ω",
    ),
    ProbeDeclaration(
        name="margin",
        summary="stability margins log|det(I − Σ_t A)| of the first attention layer and the support tokens",
        paper="Stability margins: \"Support Tokens, Stability Margins, and a New Foundation for Robust LLMs\" "
              "(arXiv 2602.22271)",
        formula="m_t = log|det(I − Σ_t A)|, A = W_Kᵀ W_Q / √p, Σ_t the attention-weighted covariance of the inputs, "
                "per head of the first attention layer (mean over heads); per document the mean and the minimum; "
                "support tokens: the k smallest",
        reads="the first attention layer's inputs at every position the model saw",
        per_position="lm_eval_probes.probes.margin.head_margins",
        fields=("margin_mean", "margin_min", "margin_support_positions", "margin_support_tokens",
                "margin_support_values"),
        rows=(
            Row("margin", "float", "mean", True, "probe",
                "mean over documents of the mean stability margin log|det(I − Σ_t A)| of the first attention layer "
                "over the positions the model saw (probes=margin)", "margin_mean"),
            Row("margin_min", "float", "mean", True, "probe",
                "mean over documents of the smallest margin (the first support token's)", "margin_min"),
            Row("margin_support", "support", "probe_support_mean", True, "probe",
                "probes=margin: mean over documents of the mean margin of the k support tokens; per document their "
                "positions, tokens and margins are in --log_samples", "margin_support"),
        ),
        ranked="margin_mean",
        ranked_text="the document's mean margin",
        label="mean stability margin",
    ),
)
"""Every probe, in ``probes=all`` order of their rows."""

PROBE_NAMES: tuple[str, ...] = tuple(probe.name for probe in PROBES)
"""Probes the wrapper can compute (``probes=all``), in the order of ``--help``."""

PROBES_BY_NAME: dict[str, ProbeDeclaration] = {probe.name: probe for probe in PROBES}

CONFIDENCE = Row(
    "confidence", "float", "mean", True, "probe",
    "chosen option's probability (MC) / geometric-mean token probability of the answer (generation; an empty "
    "generation: the probability of the token that ended it)")
REVEAL_STEP = Row(
    "reveal_step", "float", "mean", False, "probe",
    "masked diffusion (hf-probes-diffusion) only: mean over documents of the mean denoising step (0 = first) at "
    "which the tokens the confidence reads were revealed; with `confidence` per document in --log_samples, "
    "confidence against reveal order", diffusion_only=True, scored=False)
RESPONSE_TOKENS = Row(
    "response_tokens", "float", "mean", False, "probe",
    "number of response positions probed (an empty generation: 1, the position that chose to stop)", scored=False)
EMPTY_RESPONSES = Row(
    "empty_responses", "flag", "probe_count", False, "probe",
    "generations whose kept text is empty (probed at the position that chose to stop)", scored=False)
ANSWER_UNLOCATED = Row(
    "answer_unlocated", "flag", "probe_count", False, "probe",
    "non-empty generations whose filtered answer was not found in the text (whole generation used)", scored=False)
RESPONSE_ROWS: tuple[Row, ...] = (CONFIDENCE, REVEAL_STEP, RESPONSE_TOKENS, EMPTY_RESPONSES, ANSWER_UNLOCATED)
"""The response's own rows (every model, whichever probes)."""

LENGTH_SPEARMAN = Row("length_spearman", "ranked", "probe_spearman", True, "difficulty",
                      "baseline: Spearman ρ of the response length (tokens) with difficulty", scored=False)
PROMPT_LENGTH_SPEARMAN = Row("prompt_length_spearman", "ranked", "probe_spearman", True, "difficulty",
                             "baseline: Spearman ρ of the prompt length (tokens) with difficulty", scored=False)
DIFFICULTY_MISSING = Row("difficulty_missing", "flag", "probe_count", False, "difficulty",
                         "documents without a difficulty label (skipped for every ρ)", scored=False)
BASELINE_ROWS: tuple[Row, ...] = (LENGTH_SPEARMAN, PROMPT_LENGTH_SPEARMAN, DIFFICULTY_MISSING)
"""The difficulty rows that are no probe's: the length baselines every ρ is read against, and the unlabelled count."""

ECE = Row("ece", "confidence", "probe_ece", False, "confidence",
          "expected calibration error of confidence vs correctness (15 equal-width bins)")
SELECTIVE_AUROC = Row("selective_auroc", "confidence", "probe_selective_auroc", True, "confidence",
                      "AUROC of confidence ranking correct above wrong answers")
CONFIDENCE_ROWS: tuple[Row, ...] = (
    ECE,
    Row("ece_scaled", "confidence_keyed", "probe_ece_scaled", False, "confidence",
        "ECE after temperature scaling fitted out-of-fold"),
    SELECTIVE_AUROC,
    Row("aurc", "confidence", "probe_aurc", False, "confidence", "area under the risk–coverage curve of confidence"),
    Row("selective_acc_50", "confidence", "probe_selective_acc_50", True, "confidence",
        "accuracy on the 50% most confident documents"),
    Row("selective_acc_80", "confidence", "probe_selective_acc_80", True, "confidence",
        "accuracy on the 80% most confident documents"),
    Row("prr", "confidence", "probe_prr", True, "confidence",
        "prediction rejection ratio (lm-polygraph): (A − accuracy) / (A_oracle − accuracy), A = mean over k of the "
        "accuracy of the k most confident documents; 1 = the oracle's order, 0 = random"),
    Row("ece_10_bin", "confidence", "probe_ece_10_bin", False, "confidence",
        "HELM's ece_10_bin: ECE over 10 equal-mass bins drawn as HELM draws them (boundaries at the midpoints "
        "between chunks of the sorted confidences)"),
    Row("selective_cov_acc_area", "confidence", "probe_selective_cov_acc_area", True, "confidence",
        "HELM's selective_cov_acc_area: area under the coverage–accuracy curve (= 1 − aurc; ties as their "
        "expectation)"),
)
"""Calibration and selective prediction of the response's confidence (tasks whose correctness is defined)."""

TRAJECTORY_PERCENTS: tuple[int, ...] = (25, 50, 75, 100)
"""Points of the denoising trajectory that get calibration rows, in percent of the steps: step
``ceil(p · steps / 100) − 1`` (0-based), so 100 is the last step
(:func:`lm_eval_probes.models.diffusion_decoding.trajectory_steps`)."""

TRAJECTORY_ROWS: tuple[Row, ...] = tuple(row for percent in TRAJECTORY_PERCENTS for row in (
    Row(f"ece_at_step_{percent}", "confidence", "probe_ece", False, "trajectory",
        f"masked diffusion (hf-probes-diffusion) generations only: ECE of the confidence at {percent}% of the denoising "
        "steps (geometric mean over the answer span of each token's probability of its final token at that step, "
        "masked or not) vs correctness", at_percent=percent, diffusion_only=True),
    Row(f"selective_auroc_at_step_{percent}", "confidence", "probe_selective_auroc", True, "trajectory",
        f"masked diffusion (hf-probes-diffusion) generations only: AUROC of the confidence at {percent}% of the "
        "denoising steps ranking correct above wrong answers", at_percent=percent, diffusion_only=True),
))
"""Calibration along the denoising trajectory (masked-diffusion generations)."""


def probe_rows() -> tuple[Row, ...]:
    """Every probe's own rows, in declaration order."""
    return tuple(row for probe in PROBES for row in probe.rows)


def difficulty_rows() -> tuple[Row, ...]:
    """Every probe's ρ rows, then the baselines."""
    return tuple(row for probe in PROBES for row in probe.difficulty_rows()) + BASELINE_ROWS


def _check() -> None:
    if len(PROBES) != len(PROBES_BY_NAME):
        raise RuntimeError(f"a probe name is declared twice: {PROBE_NAMES}")
    fields = [name for probe in PROBES for name in probe.fields]
    if len(fields) != len(set(fields)):
        twice = sorted(name for name in set(fields) if fields.count(name) > 1)
        raise RuntimeError(f"a record field is declared by two probes: {twice}")
    for probe in PROBES:
        if probe.capture is not None and probe.capture.count(":") != 1:
            raise RuntimeError(f"probe {probe.name!r}: capture {probe.capture!r} must be 'module:Class'")
        unknown = [row.name for row in probe.rows if row.field is not None and row.value != "support"
                   and row.field not in probe.fields]
        if unknown or (probe.ranked is not None and probe.ranked not in probe.fields):
            raise RuntimeError(f"probe {probe.name!r}: rows {unknown} (or its ranked field) read fields it does not declare")


_check()
