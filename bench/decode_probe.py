"""Where the probe readout's power goes: the learners decoded from the residual stream instead.

    python bench/decode_probe.py [--setting main] [--kinds "gd oracle,momentum oracle"]
                                 [--limit N] [--out FILE.json]
    python bench/decode_probe.py --models gpt-softmax,lstm

For each probe-readout cell of the known-answer benchmark (`constructions.benchmark`) whose
truth is among ``--kinds``: the layers where `align`'s answer read exactly names the truth,
how many of them the answer read through probes names too (the benchmark's probe power),
and what decoding says at the same layers (`probes.decodability`: each candidate's columns
fitted from the layer's residual stream, cross-fitted in the probes' 4 folds, on the
aligned window). Per layer the truth's family's best unexplained share is compared with the
best rival family's; printed: at how many of the exactly named layers the truth's family
is decoded best, and the rivals' share over the truth's (median, smallest).

``--models``: shipped models instead (`iclprobe models`), with no truth to compare with:
per layer, the answer through probes beside the three families decoded best and their
shares.

A measurement, not a readout `align` offers: decoding's shares have no interval here, and
what share separates two learners is not settled. About 10 s a cell on one core (cells in
the grid's order; ``--limit`` keeps the first).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import statistics
import sys
from pathlib import Path
from typing import Any

import torch
from tqdm import tqdm

from iclprobe import algorithms
from iclprobe._shipped import shipped_models
from iclprobe.alignment.measuring.candidates import Candidate, build_candidates
from iclprobe.alignment.pipeline import AlignConfig, AlignResult, align
from iclprobe.cli import OneLineParser
from iclprobe.constructions import benchmark as B
from iclprobe.constructions import power as P
from iclprobe.constructions import scoring as S
from iclprobe.hooks import collect_residuals
from iclprobe.models import load
from iclprobe.models.base import Regressor
from iclprobe.probes.decode import decodability
from iclprobe.storage import write_text_atomic
from iclprobe.tasks import RegressionBatch

DEFAULT_KINDS = "gd oracle,momentum oracle,newton oracle"


def family_shares(resid: torch.Tensor, cands: dict[str, Candidate], window: tuple[int, int],
                  folds: int) -> dict[str, list[float]]:
    """Per candidate, its best column's unexplained share at each layer (zero columns out)."""
    lo, hi = window
    out = {}
    for key, cand in cands.items():
        cols = cand.preds.preds.double()
        live = cols[:, :, lo:hi + 1].pow(2).sum((1, 2)) > 0
        if not bool(live.any()):
            continue
        shares = decodability(resid, cols[live], folds, lo, hi)
        out[key] = shares.min(1).values.tolist()
    return out


def decoded_shares(model: Regressor, res: AlignResult, batch: RegressionBatch, folds: int,
                   who: str) -> dict[str, list[float]]:
    """`family_shares` of the answer's candidates on ``model``'s residuals over ``batch``."""
    if res.answer is None:
        raise RuntimeError(f"{who}: align gave no answer over the candidates")
    resid = collect_residuals(model, batch.xs, batch.ys).double()
    stats = algorithms.prefix_stats(batch.xs.double(), batch.ys.double())
    cands, _ = build_candidates(res.answer.candidates, batch, stats, tuple(res.window),
                                res.n_layers, None, {}, None)
    return family_shares(resid, cands, tuple(res.window), folds)


def measure(cell: B.Cell, cfg: AlignConfig) -> dict[str, Any] | None:
    """One probe cell: the exactly named layers, the probes' and decoding's answers there."""
    exact_cell = dataclasses.replace(cell, readout="exact")
    named = {}
    for c in (exact_cell, cell):
        built = B.build(c, cfg)
        if built.diverges:
            return None
        res = align(built.model, built.cfg)
        batch = B.evaluation_batch(built.model.task, built.cfg)
        _, verdicts = S.score(res, c.truth, batch, built.truth_columns)
        named[c.readout] = [i for i, v in enumerate(verdicts["answer"])
                            if S.names_truth(v, c.truth)]
    shares = decoded_shares(built.model, res, batch, built.cfg.probe_folds, str(cell))
    own = shares.pop(cell.truth)
    ratios = [min(r[i] for r in shares.values()) / max(own[i], 1e-300)
              for i in named["exact"]]
    return {**dataclasses.asdict(cell), "truth": cell.truth, "key": P.ProbePower(cell, 0, 0, 0, 0).key,
            "named_exactly": named["exact"],
            "named_by_probe": [i for i in named["probe"] if i in named["exact"]],
            "decoded_first": [i for i, r in zip(named["exact"], ratios) if r > 1.0],
            "rival_over_truth": ratios}


def shipped_model(name: str, cfg: AlignConfig) -> list[str]:
    """A shipped model read through probes: per layer, the answer and the decoded families.

    The families ranked by their best column's unexplained share (the three nearest, with
    their shares); no truth to compare with.
    """
    model = load(name)
    res = align(model, cfg)
    batch = B.evaluation_batch(model.task, cfg)
    shares = decoded_shares(model, res, batch, cfg.probe_folds, name)
    assert res.answer is not None  # decoded_shares refuses a result without one
    lines = [f"{name} (window t = {res.window[0]}..{res.window[1]}; the answer through probes "
             f"| decoded: the nearest families, unexplained share of their best column)"]
    for layer, said in enumerate(res.answer.texts):
        near = sorted(shares, key=lambda k: shares[k][layer])[:3]
        lines.append(f"  layer {layer:2d}: {said[:48]:48s} | " +
                     ", ".join(f"{k} {shares[k][layer]:.3g}" for k in near))
    return lines


def main(argv: list[str] | None = None) -> int:
    parser = OneLineParser(prog="decode_probe.py", description=__doc__.splitlines()[0])
    parser.add_argument("--setting", choices=list(B.SETTINGS), default="main")
    parser.add_argument("--kinds", default=DEFAULT_KINDS,
                        help=f"comma-separated cell kinds (default: {DEFAULT_KINDS})")
    parser.add_argument("--limit", type=int, default=None, help="the first N cells only")
    parser.add_argument("--out", type=_file, default=None,
                        help="write every cell as JSON to this file (a new one, or with "
                             "--overwrite one there already)")
    parser.add_argument("--overwrite", action="store_true", help="replace --out's file")
    parser.add_argument("--models", default=None,
                        help="comma-separated shipped models to read instead of the cells "
                             "(`iclprobe models`): per layer, the answer through probes and "
                             "the families decoded best")
    args = parser.parse_args(argv)
    if args.models is not None:
        given = [flag for flag, value in (("--setting", args.setting != "main"),
                                          ("--kinds", args.kinds != DEFAULT_KINDS),
                                          ("--limit", args.limit is not None),
                                          ("--out", args.out is not None)) if value]
        if given:
            parser.error(f"--models reads the shipped models: {', '.join(given)} apply to "
                         "the benchmark's cells only")
        return _models(parser, [m.strip() for m in args.models.split(",") if m.strip()])
    kinds = [k.strip() for k in args.kinds.split(",") if k.strip()]
    unknown = [k for k in kinds if k not in B.TRUTH or B.TRUTH[k] is None]
    if unknown:
        parser.error(f"--kinds: {unknown} are not kinds with a truth; choose from "
                     f"{[k for k, t in B.TRUTH.items() if t is not None]}")
    if args.limit is not None and args.limit < 1:
        parser.error(f"--limit must be >= 1, got {args.limit}")
    if args.out is not None:
        _check_out(parser, args.out, args.overwrite)
    cells = [c for c in B.grid(setting=args.setting)
             if c.readout == "probe" and c.kind in kinds][:args.limit]
    if not cells:
        parser.error(f"--kinds: no probe cell of {kinds} in the {args.setting} setting")
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        cfg = B.bench_config()
        rows = [r for c in tqdm(cells, desc="cells") if (r := measure(c, cfg)) is not None]
    finally:
        torch.set_num_threads(threads)
    for r in rows:
        n = len(r["named_exactly"])
        ratios = r["rival_over_truth"]
        spread = f"; rivals/truth median {statistics.median(ratios):.3g}, least " \
                 f"{min(ratios):.3g}" if ratios else ""
        print(f"{r['key']}: exact names {n}, probes {len(r['named_by_probe'])}, decoding "
              f"first {len(r['decoded_first'])}{spread}")
    total = sum(len(r["named_exactly"]) for r in rows)
    print(f"\n{len(rows)} cells: of {total} layers named read exactly, the answer through "
          f"probes names {sum(len(r['named_by_probe']) for r in rows)}; decoding puts the "
          f"truth's family first at {sum(len(r['decoded_first']) for r in rows)}")
    if args.out is not None:
        write_text_atomic(args.out, json.dumps(rows, indent=1))
    return 0


def _file(text: str) -> Path:
    """An argparse type: a file path, not empty (``Path("")`` is the current folder)."""
    if not text.strip():
        raise argparse.ArgumentTypeError(f"expected a file path, got {text!r}")
    return Path(text)


def _check_out(parser: OneLineParser, out: Path, overwrite: bool) -> None:
    """Refuse, before any work, an --out the JSON cannot be written to or may not replace."""
    if not out.parent.is_dir():
        parser.error(f"--out: the folder {str(out.parent)!r} does not exist")
    if out.is_dir():
        parser.error(f"--out: {out} is a directory, not a file")
    if out.exists() and not overwrite:
        parser.error(f"--out: {out} exists: pass --overwrite to replace it")


def _models(parser: OneLineParser, names: list[str]) -> int:
    """``--models``: each shipped model's layers, the answer beside what decoding finds."""
    known = {name for name, _ in shipped_models()}
    unknown = [n for n in names if n not in known]
    if unknown or not names:
        parser.error(f"--models: {unknown or names} are not shipped models; choose from "
                     f"{sorted(known)}")
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        for name in tqdm(names, desc="models"):
            tqdm.write("\n".join(shipped_model(name, B.bench_config())))
    finally:
        torch.set_num_threads(threads)
    return 0


if __name__ == "__main__":
    sys.exit(main())
