"""The candidates of `align`'s answer: every learner, each over its fitted family.

A candidate is a registered learner (`iclprobe.algorithms.candidate_learners`: newton, gd,
online_gd, pgd, cg, ols, ridge, momentum, gd_plus_plus, and any registered since) or a
learner the model's family claims (a PQ model's ``pgd_own``), matched over its family of
hyperparameter variants × steps (`iclprobe.algorithms.families`). Each candidate's
columns are run on the evaluation sequences (with weights on the weight sequences), read
as the layers are read (`fitted.probe_read` when probes read the layers), and compared
with every layer by each metric: one similarity table per candidate and metric, with the
bootstrap replicates the answer's intervals come from.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING

import torch
from torch import Tensor

from iclprobe import algorithms
from iclprobe.algorithms.families import FamilyContext, NotACandidate
from iclprobe.algorithms.numerics import Diverged
from iclprobe.algorithms.prefix import PrefixStats
from iclprobe.alignment.measuring import fit_steps, imitators, kept, refine
from iclprobe.alignment.measuring.candidate import VARIANT_HYPER, Candidate, Fine
from iclprobe.alignment.measuring.reading import probe_read, reread
from iclprobe.alignment.measuring.runs import concat_iterates, run_spec
from iclprobe.alignment.measuring.similarities import Similarity, similarity, similarity_values
from iclprobe.alignment.measuring.table_spec import TableSpec
from iclprobe.alignment.metrics import METRIC_INFO, metric_info
from iclprobe.alignment.protocols import RunSpec
from iclprobe.tasks import RegressionBatch

if TYPE_CHECKING:
    from iclprobe.alignment.evaluation import Evaluation
    from iclprobe.alignment.measuring.layers import Layers


def candidate_keys(chosen: Sequence[str] | None, claims: Mapping[str, RunSpec]) -> list[str]:
    """The answer's candidates: every registered candidate learner and the family's claims.

    ``chosen`` (``AlignConfig.algorithms``) restricts them, keeping the table order; a
    registered learner named in it joins even if it is no candidate by default.
    """
    default = [i.name for i in algorithms.candidate_learners()] + \
        [k for k in claims if k not in algorithms.LEARNERS]
    if chosen is None:
        return default
    return [k for k in default if k in chosen] + \
        [k for k in chosen if k not in default and (k in algorithms.LEARNERS or k in claims)]


def _describe(variant: str, step: int | None) -> str:
    parts = ([variant] if variant else []) + ([f"step {step}"] if step is not None else [])
    return ", ".join(parts) or "closed form"


def family_iterates(key: str, batch: RegressionBatch, stats: PrefixStats, window: tuple[int, int],
                    n_layers: int, weights: bool, sequences: slice | None = None,
                    claim: RunSpec | None = None, skip: Sequence[str] = (),
                    fine: Fine | None = None, grid: bool = True
                    ) -> tuple[algorithms.Iterates, list[str], list[str]]:
    """Every (variant, step) column of candidate ``key`` on ``batch`` (float64), described.

    Returns the iterates, each column's description, and the variants left out.

    ``claim``: a family's claimed run (one variant: its own hyperparameters and steps).
    ``sequences``: run on those sequences only (``stats`` is of the whole batch). ``skip``:
    variants (by label) to leave out. ``fine``: variants between the grid's
    (`Family.fine`), by their rank in `Family.grid`, each run at the steps given (a rank
    between two integers: a step size on the family's continuum, `Family.variant_at`);
    ``grid=False``: those alone. A variant
    whose iterates diverge on these data (GD++ at its larger steps on some data) is left
    out; raises `NotACandidate` where the learner's family says it is none here, or where
    every variant diverges.
    """
    fine, ctx = fine or {}, FamilyContext(stats, batch.cov, window)
    specs = [(0, "", claim)] if claim is not None else _specs(key, ctx, fine, skip, grid)
    family = algorithms.learner_info(key).fitted_family if claim is None else None
    parts, columns, labels, variant, rank = [], [], [], [], []
    dropped = []
    for at, label, spec in specs:
        try:
            it = run_spec(spec, batch, n_layers, weights, stats, sequences=sequences)
        except Diverged:
            if claim is not None:
                raise
            dropped.append(label)
            continue
        closed = it.steps.numel() == 1 and spec.steps is None
        parts.append(it)
        labels.append(label)
        shown = label if family is None else family.shown(ctx, at, label)
        columns += [_describe(shown, None if closed else int(s)) for s in it.steps.tolist()]
        variant += [len(parts) - 1] * it.steps.numel()
        rank += [at] * it.steps.numel()
    if not parts:
        raise NotACandidate(f"{key}: every variant of its family diverges on these data")
    it = concat_iterates(parts, "variant", labels) if len(parts) > 1 else parts[0]
    if len(parts) > 1:
        for name in VARIANT_HYPER:
            it.hyper.pop(name, None)  # recorded per column in "variant"
    it.hyper["variant_index"] = variant
    it.hyper["variant_rank"] = rank
    return dataclasses.replace(it, name=key), columns, dropped


def _specs(key: str, ctx: FamilyContext, fine: Fine, skip: Sequence[str], grid: bool
           ) -> list[tuple[float, str, RunSpec]]:
    """`family_iterates`' runs, by rank: the grid (``grid``), the fine variants and those between."""
    info = algorithms.learner_info(key)
    family = info.fitted_family
    whole = grid or any(at == int(at) for at in fine)  # else the continuum's points alone
    specs: list[tuple[float, str, RunSpec]] = [
        (at, label, RunSpec(key, info.label, family.steps if on else fine[at], hyper))
        for at, ((label, hyper), on) in enumerate(family.grid(ctx) if whole else [])
        if label not in skip and ((on and grid) or (not on and at in fine))]
    for at in fine:
        if at != int(at):  # a step size on the family's continuum
            label, hyper = family.variant_at(ctx, at)
            if label not in skip:
                specs.append((at, label, RunSpec(key, info.label, None if family.steps is None
                                                 else fine[at], hyper)))
    return sorted(specs, key=lambda spec: spec[0])


def build_candidates(keys: Sequence[str], batch: RegressionBatch, stats: PrefixStats,
                     window: tuple[int, int], n_layers: int, weight_rows: slice | None,
                     claims: Mapping[str, RunSpec], probe_rows: tuple[int, int] | None,
                     fine: Mapping[str, Fine] | None = None, peek: bool = False
                     ) -> tuple[dict[str, Candidate], list[str]]:
    """Every candidate's columns (read as probes read, given ``probe_rows``), and notes.

    ``weight_rows``: the sequences the weight metrics use (None: no weights). A candidate
    whose family says it is none here (`NotACandidate`) is left out with a note.
    ``fine``: per candidate, the fine variants alone to run instead of its grid
    (`family_iterates`); candidates not in it are left out. ``peek``: the caller only reads
    the columns (`kept.family`: a kept family is not copied).
    """
    xs, ys = batch.xs.double(), batch.ys.double()
    out, notes = {}, []
    for key in keys if fine is None else [k for k in keys if k in fine]:
        claim = claims.get(key) if key not in algorithms.LEARNERS else None
        try:
            preds, columns, w, dropped = _family(key, batch, stats, window, n_layers,
                                                 weight_rows, claim,
                                                 None if fine is None else fine[key], peek)
        except NotACandidate as why:
            notes.append(str(why))
            continue
        if dropped:
            notes.append(f"{key}: variant(s) {', '.join(dropped)} diverge on these data (left "
                         "out of its family)")
        if probe_rows is not None:
            preds, w = probe_read(preds, xs, ys, probe_rows, w)
        label = claim.label if claim is not None else algorithms.learner_info(key).label
        # the family may be a kept one (`kept.family`'s peek): its hyper dicts are not changed
        preds, variant, rank = _without_places(preds)
        if w is not None:
            w = _without_places(w)[0]
        closed = len(set(variant)) == len(variant)  # one column per variant
        out[key] = Candidate(key, label, preds, w, columns, variant, closed,
                             [(r, int(k)) for r, k in zip(rank, preds.steps.tolist())])
    return out, notes


def _without_places(it: algorithms.Iterates) -> tuple[algorithms.Iterates, list[int], list[float]]:
    """``it`` with its hyper lacking the columns' variant indices and ranks, and those."""
    hyper = dict(it.hyper)
    variant, rank = hyper.pop("variant_index", []), hyper.pop("variant_rank", [])
    return dataclasses.replace(it, hyper=hyper), variant, rank


def _family(key: str, batch: RegressionBatch, stats: PrefixStats, window: tuple[int, int],
            n_layers: int, weight_rows: slice | None, claim: RunSpec | None,
            fine: Fine | None = None, peek: bool = False) -> kept.Family:
    """A candidate's columns, its weights' on ``weight_rows`` (reused where kept).

    ``fine``: its fine variants alone (`family_iterates`), kept for another readout's ask.
    """
    def run() -> kept.Family:
        return _run_family(key, batch, stats, window, n_layers, weight_rows, claim, fine)

    if claim is not None:  # a model's own claim: not kept
        return run()
    rows = None if weight_rows is None else (weight_rows.start, weight_rows.stop)
    asked = tuple(sorted((float(r), tuple(st)) for r, st in (fine or {}).items()))
    return kept.family((key, tuple(window), n_layers, rows, asked), batch, run, peek)


def _run_family(key: str, batch: RegressionBatch, stats: PrefixStats,
                window: tuple[int, int], n_layers: int, weight_rows: slice | None,
                claim: RunSpec | None, fine: Fine | None = None) -> kept.Family:
    """A candidate's columns, its weights' on ``weight_rows``, the same variants in both."""
    grid = fine is None  # the grid, or the fine variants alone
    preds, columns, dropped = family_iterates(key, batch, stats, window, n_layers, False,
                                              claim=claim, fine=fine, grid=grid)
    if weight_rows is None:
        return preds, columns, None, dropped
    w, _, more = family_iterates(key, batch, stats, window, n_layers, True, weight_rows,
                                 claim, skip=dropped, fine=fine, grid=grid)
    if more:  # diverging on the weight sequences only: left out of both
        dropped += more
        preds, columns, _ = family_iterates(key, batch, stats, window, n_layers, False,
                                            claim=claim, skip=dropped, fine=fine, grid=grid)
    return preds, columns, w, dropped


def read_as_probes(layer_preds: Tensor, layer_weights: Tensor | None, xs: Tensor, ys: Tensor,
                   probe_rows: tuple[int, int] | None) -> tuple[Tensor, Tensor | None]:
    """The layers as the candidates are read: re-read on ``[prediction, x_t, 1]`` by probes."""
    if probe_rows is None:
        return layer_preds, layer_weights
    return reread(layer_preds, layer_weights, xs, ys, probe_rows)


def candidate_tables(cands: Mapping[str, Candidate], layer_preds: Tensor,
                     layer_weights: Tensor | None, ys: Tensor, metrics: Sequence[str],
                     spec: TableSpec) -> dict[str, dict[str, Similarity]]:
    """``metric -> candidate -> table`` of every layer against every column of the family.

    A weight metric is computed where the layers' induced weights are given.
    """
    n_w = layer_weights.shape[1] if layer_weights is not None else 0
    out: dict[str, dict[str, Similarity]] = {}
    for metric in metrics:
        on_w = METRIC_INFO[metric].on == "weights"
        if on_w and (layer_weights is None or any(c.weights is None for c in cands.values())):
            continue
        values = layer_weights if on_w else layer_preds
        assert values is not None
        ys_m = ys[:n_w] if on_w else ys
        out[metric] = {key: spec.corrected(similarity(
            values, c.of(metric), ys_m, metric, n_boot=spec.n_boot, confidence=spec.confidence,
            seed=spec.seed, check=False, **spec.kw(metric))) for key, c in cands.items()}
    return out


def noise_ceilings(clean: tuple[Tensor, Tensor | None], noisy: Mapping[str, Tensor | None],
                   ys: Tensor, metrics: Sequence[str], spec: TableSpec,
                   more_preds: Sequence[Tensor] = ()) -> dict[str, Tensor]:
    """Per metric with a geometry, what each layer reaches through its readout's noise.

    A layer read by probes is the layer plus the probes' estimation noise, which lowers its
    similarity to any learner by a factor (cosines) or adds the noise's power (squared
    distances) — the same for every learner, so the layer's match is kept, but a layer
    that runs a learner falls short of it by the noise, below the learners' resemblance to
    one another, and is read as "none of them". The ceiling is the similarity of the layer
    read with a second sample of the noise (``noisy``: `probes.ReadoutNoise`'s added, in the
    predictions and, where measured, the induced weights) to the layer read without it
    (``clean``: predictions and weights), both read as the learners are (`read_as_probes`).
    ``more_preds``: the predictions read with further draws of the noise; a prediction
    metric's ceiling is the mean over every draw (one draw's error: the correction's size).
    """
    out = {}
    for metric in metrics:
        info = metric_info(metric)
        on_w = info.on == "weights"
        b = clean[1] if on_w else clean[0]
        first = noisy["weights"] if on_w else noisy["preds"]
        if info.geometry is None or first is None or b is None:
            continue
        draws = [first] if on_w else [first, *more_preds]
        layers = algorithms.Iterates(torch.arange(b.shape[0]), b if not on_w else b[..., 0],
                                     b if on_w else None, {}, "layers")
        out[metric] = torch.stack([
            similarity_values(a, layers, ys[:b.shape[1]], metric,
                              **spec.kw(metric)).diagonal() for a in draws]).mean(0)
    return out


@dataclasses.dataclass
class Candidates:
    """`align`'s candidates measured: their families, and their tables against the layers.

    ``layers``: the layers as the tables compared them (``"preds"``, ``"weights"``: read on
    ``[prediction, x_t, 1]`` where probes read them). ``spec``: the tables' window,
    bootstrap and readout-noise correction. ``notes``: candidates or variants left out.
    """

    members: dict[str, Candidate]
    tables: dict[str, dict[str, Similarity]]
    layers: dict[str, Tensor | None]
    spec: TableSpec
    notes: list[str]
    #: where probes read the layers: the layers read with a sample of the readout's own
    #: noise added and subtracted, as ``layers`` (what the answer's margins come from)
    noisy: tuple[dict[str, Tensor | None], ...] = ()
    #: whether the families' fine step sizes next to the layers' matches joined them
    fine: bool = False


def measure_candidates(ev: Evaluation, layers: Layers, stats: PrefixStats) -> Candidates:
    """`align`'s stage: every candidate over its family, and its tables against the layers.

    The candidates are the registered learners and the model's claims that
    ``ev.cfg.algorithms`` allows (`candidate_keys`); where probes read the layers, the
    learners are read the same way and the tables are corrected for the probes' own noise
    (`noise_ceilings`). Where the layers are read exactly (no probes, no readout noise),
    or through probes fitted to the column each layer holds (`held`), each family's fine
    step sizes next to the layers' matches join it (`refine`) and the matches are fitted
    (`fit_steps`); through probes fitted to y they do not: those probes' noise is larger
    than what they resolve, and a family refined around its match fits that noise (on the
    known-answer benchmark it named GD at a heavy-ball oracle's first step and at the
    GD/Newton average's last layer). Through probes each rival's step size is also fitted
    toward the leading candidate's matched columns (`imitators`).
    """
    claims = {k: ev.runs[k] for k in ev.claimed if k in ev.runs}
    keys = candidate_keys(ev.cfg.algorithms, claims)
    rows = None if layers.probe_t_min is None else \
        (max(ev.window[0], layers.probe_t_min), ev.window[1])
    spec = TableSpec(ev.window, ev.protocol.weight_t_min, ev.averaging, **ev.bootstrap)
    members, notes = build_candidates(keys, ev.batch, stats, ev.window, layers.n_layers,
                                      slice(0, ev.weight_rows) if ev.weight_metrics else None,
                                      claims, rows)
    left = [k for k in candidate_keys(None, claims) if k not in keys]  # the answer names none
    notes += [f"candidates restricted by algorithms: {', '.join(left)} left out, so a layer "
              "that runs one of them can be named as one of those kept"] if left else []
    xs = ev.batch.xs.double()
    read_p, read_w = read_as_probes(layers.preds, layers.weights, xs, ev.ys, rows)
    noisy: tuple[dict[str, Tensor | None], ...] = ()
    if layers.noise is not None:
        noisy = tuple(_read_with_noise(layers, sign, xs, ev.ys, rows) for sign in (1.0, -1.0))
        more = [] if layers.more_noise is None else \
            [read_as_probes(layers.preds + d.to(layers.preds), None, xs, ev.ys, rows)[0]
             for d in layers.more_noise]
        spec = dataclasses.replace(spec, ceilings=noise_ceilings(
            (read_p, read_w), noisy[0], ev.ys, ev.cfg.metrics, spec, more),
            noise_features=layers.noise_features)
    tables = candidate_tables(members, read_p, read_w, ev.ys, ev.cfg.metrics, spec)
    # read exactly or by probes fitted to a held column (`held`): no noise for a refit to fit
    sharp = (rows is None and layers.noise is None) or layers.holds_columns
    if sharp:
        _refine(ev, layers, stats, claims, members, tables, (read_p, read_w), spec, rows)
    if rows is not None:  # through probes: the rivals' step sizes fitted to the matches

        def run(fine: Mapping[str, Fine]) -> dict[str, Candidate]:
            return build_candidates(list(fine), ev.batch, stats, ev.window, layers.n_layers,
                                    None, claims, rows, fine)[0]

        imitators.fit_imitators(members, tables, ev.batch, stats, ev.window, spec, run)
    return Candidates(members, tables, {"preds": read_p, "weights": read_w}, spec, notes, noisy,
                      fine=sharp)


def _refine(ev: Evaluation, layers: Layers, stats: PrefixStats, claims: Mapping[str, RunSpec],
            members: dict[str, Candidate], tables: dict[str, dict[str, Similarity]],
            read: tuple[Tensor, Tensor | None], spec: TableSpec,
            rows: tuple[int, int] | None = None) -> None:
    """The families' step sizes next to the layers' matches, then fitted (in place).

    First each family's fine step sizes next to its matches (`refine`), then each match's
    step size fitted along the family's continuum (`fit_steps`, on the tables' corrected
    scale); both join the family, and their columns its tables, in one merge. ``rows``:
    the probes' rows, where the columns are read as probes read the layers.
    """
    w_rows = slice(0, ev.weight_rows) if ev.weight_metrics else None

    def run(fine: Mapping[str, Fine], weights: slice | None = w_rows) -> dict[str, Candidate]:
        return build_candidates(list(fine), ev.batch, stats, ev.window, layers.n_layers,
                                weights, claims, rows, fine)[0]

    fine = refine.refined(members, lambda key, groups: refine.matched_columns(tables, key, groups),
                          ev.batch, stats, ev.window, run)
    more, fine_tables = [fine], candidate_tables(fine, *read, ev.ys, ev.cfg.metrics, spec)
    metric = fit_steps.fit_metric(tables)
    if metric is not None:
        sign = 1.0 if metric_info(metric).higher_is_better else -1.0
        scored = {k: sign * (torch.cat([t.values, fine_tables[metric][k].values], 1)
                             if k in fine else t.values) for k, t in tables[metric].items()}
        places = {k: c.places + (fine[k].places if k in fine else []) for k, c in members.items()}
        # through probes a scale is free: the step counts near the match's searched too
        fits = fit_steps.fitted(places, metric, scored, read[0], ev.ys, spec.kw(metric),
                                ev.batch, stats, ev.window, lambda asks: run(asks, None),
                                within=None if rows is None else fit_steps.PROBE_WITHIN,
                                correct=lambda table: spec.correct(metric, table))
        more.append(run(fits) if fits else {})
    more_tables = [fine_tables] + [candidate_tables(m, *read, ev.ys, ev.cfg.metrics, spec)
                                   for m in more[1:]]
    for key, (family, extra) in refine.joined(members, *more, batch=ev.batch, stats=stats,
                                              window=ev.window).items():
        for name, by in tables.items():
            parts = [t[name][key] for t in more_tables if key in t.get(name, {})]
            part = parts[0] if len(parts) == 1 else refine.merged_table(parts[0], parts[1], extra)
            by[key] = refine.merged_table(by[key], part, family)
        members[key] = family


def _read_with_noise(layers: Layers, sign: float, xs: Tensor, ys: Tensor,
                     rows: tuple[int, int] | None) -> dict[str, Tensor | None]:
    """The layers plus ``sign`` × the readout's noise sample, read as the learners are."""
    assert layers.noise is not None
    preds = layers.preds + sign * layers.noise.to(layers.preds)
    weights = None if layers.weights is None or layers.weight_noise is None else \
        layers.weights + sign * layers.weight_noise.to(layers.weights)
    p, w = read_as_probes(preds, weights, xs, ys, rows)
    return {"preds": p, "weights": w}
