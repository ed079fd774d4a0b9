"""Fu et al. 2024 at CPU scale: do a softmax GPT's layers run iterative Newton or GD?

    python scripts/reproduce_fu2024.py [--out fu2024-report] [--checkpoint gpt-softmax]
    python scripts/reproduce_fu2024.py --garg-size --device cuda   # their 12x256, d=20, n=41

On the shipped ``gpt-softmax`` (8 layers x 64 wide, d = 8, 24 points) it aligns every layer
with Newton–Schulz, GD and online GD on isotropic and on ill-conditioned data (κ = 100), by
error cosine and induced-weight cosine, under Fu et al.'s own evaluation protocol
(``fu2024``) and under iclprobe's, and prints each of the paper's qualitative claims next
to what we measure, with intervals and calibrated verdicts. ``--garg-size`` first trains
their configuration (a GPU job: days on 2 CPU cores) with Garg's curriculum, then runs the
same analysis.
"""

from __future__ import annotations

import argparse
from pathlib import Path

import torch

from iclprobe import models, tasks, training
from iclprobe.alignment.design import align_designed
from iclprobe.alignment.output.report import write_report
from iclprobe.alignment.output.tables import text_table
from iclprobe.alignment.pipeline import AlignConfig, align
from iclprobe.cli import OneLineParser, out_dir, positive_int
from iclprobe.errors import InputError
from iclprobe.storage import check_output


def garg_size_model(out: Path, device: str, steps: int) -> str:
    """Train (or resume) Garg et al.'s 12-layer, 256-wide model at d = 20, 41 points."""
    task = tasks.RegressionTask(n_dims=20, n_points=41)
    if (out / "checkpoint").exists():
        model = models.load(out)
        training.train(model, model.task, training.read_train_config(out), out=out, resume=True)
        return str(out)
    model = models.GPTRegressor(models.GPTConfig(n_dims=20, n_positions=41, n_layers=12,
                                                 d_model=256, n_heads=8))
    cfg = training.TrainConfig(steps=steps, lr=1e-4, batch_size=64, curriculum_every=2000,
                             curriculum_dims=(5, 1), curriculum_points=(11, 2), device=device,
                             checkpoint_every=1000, log_every=500)
    training.train(model, task, cfg, out=out)
    return str(out)


def _fit(res, learner: str) -> str:
    fits = res.matches[learner]["error_cosine"].fits
    return "; ".join(f.describe() for f in (fits["linear"], fits["log2"]))


def _last(res, learner: str, metric: str = "error_cosine") -> str:
    score = res.comparisons[metric].scores[learner].score
    last = res.n_layers
    return f"{score.value[last]:.3f} [{score.lower[last]:.3f}, {score.upper[last]:.3f}]"


def _pair(res, a: str, b: str, metric: str = "error_cosine"):
    return next(p for p in res.comparisons[metric].pairs if (p.a, p.b) == (a, b))


def _verdict(res) -> str:
    """The verdict per layer, runs of layers grouped: "prefers gd at 4–8; ..."."""
    from iclprobe.alignment.comparison import layer_ranges

    labels = res.verdict
    if not labels:
        return "not run (needs Newton and GD with the fitted view)"
    kinds = dict.fromkeys(labels)
    return "; ".join(f"{k} at {layer_ranges([i for i, v in enumerate(labels) if v == k])}"
                     for k in kinds)


def _answer(res) -> str:
    """What each layer runs, runs of layers grouped, with the nearest where none fits."""
    if res.answer is None:
        return "not run (needs the fitted families)"
    return res.answer.sentence(res.live).split(": ", 1)[1].rstrip(".")


def _orders(res) -> str:
    """Each live layer's filter order with its interval, and what it reads as."""
    spec = res.spectral
    if spec is None:
        return "not run (needs the weight metric)"
    parts = [f"L{i} {p:.2f} [{lo:.2f}, {hi:.2f}] {r}"
             for i, (p, lo, hi, r) in enumerate(zip(spec.order, spec.lower, spec.upper,
                                                    spec.reading))
             if p is not None and lo is not None and hi is not None and r != "computes nothing"]
    return "; ".join(parts) or "no live layer with usable directions"


def _designed(done) -> str:
    """The answer on the designed data, or why it is not used."""
    where = done.design.chosen.text
    if done.out_of_distribution:
        return f"{where}: out of the model's distribution ({done.why}), not used"
    if done.designed is None and done.not_read:
        return f"{where}: cannot be read with these settings ({done.not_read}); not used"
    if done.designed is None:
        return f"{where}: separates the candidates no better than the own task; not aligned"
    both = done.both_sentence().split(": ", 1)[1].rstrip(".")
    return f"{where}: {_answer(done.designed)}; over both evaluations: {both}"


def claims(iso, ill, designed=None) -> list[tuple[str, str]]:
    """The paper's qualitative claims next to our measurements (one protocol).

    ``designed``: the model aligned on its designed data too (`align_designed`).
    """
    newton_gd = _pair(iso, "newton", "gd")
    newton_ogd = _pair(iso, "newton", "online_gd")
    last = iso.n_layers
    rows = [
        ("Newton step grows linearly with layer (Fig. 3a)", _fit(iso, "newton")),
        ("GD needs exponentially many steps (linear in log2 step)", _fit(iso, "gd")),
        ("Newton closer than GD (their table: 0.991 vs 0.957)",
         f"last layer: Newton {_last(iso, 'newton')}, GD {_last(iso, 'gd')}, Newton − GD "
         f"{newton_gd.difference.value[last]:+.3f} [{newton_gd.difference.lower[last]:+.3f}, "
         f"{newton_gd.difference.upper[last]:+.3f}]; {newton_gd.sentence}"),
        ("Newton closer than online GD (their table: 0.806)",
         f"last layer: online GD {_last(iso, 'online_gd')}; {newton_ogd.sentence}"),
        ("Induced weights agree with Newton's (Def. 3.2)",
         f"last layer weight cosine: Newton {_last(iso, 'newton', 'weight_cosine')}, "
         f"GD {_last(iso, 'gd', 'weight_cosine')}; "
         f"{_pair(iso, 'newton', 'gd', 'weight_cosine').sentence}"),
        ("Ill-conditioned data: Newton still matches, GD needs more steps",
         f"κ=100: Newton {_fit(ill, 'newton')}; last layer Newton {_last(ill, 'newton')}, "
         f"GD {_last(ill, 'gd')} at step {ill.matches['gd']['error_cosine'].best_step[-1]}; "
         f"{_pair(ill, 'newton', 'gd').sentence}"),
        ("Headline: the layers run Newton — what each layer runs, among every candidate "
         "learner over its fitted family (no false attribution on the known-answer benchmark)",
         _answer(iso) + f"; κ=100: {_answer(ill)}"),
        ("... and not GD: the Newton-vs-GD verdict (step sizes fitted, metrics combined)",
         _verdict(iso) + f"; κ=100: {_verdict(ill)}"),
        ("Filter order (spectral view: GD 1, Newton 2 in the small-step limit)",
         _orders(iso)),
        ("The model approaches OLS with more examples (Fig. 2)",
         f"last-layer normalized error at t = n-1: {iso.layer_error_by_t[-1][-1]:.4f} "
         f"(OLS {iso.learner_error_by_t['ols'][-1]:.1e})"),
    ]
    if designed is not None:
        rows.insert(7, ("... on data designed to tell the candidates apart (align --design)",
                        _designed(designed)))
    return rows


def main() -> None:
    parser = OneLineParser(prog="reproduce_fu2024.py", description=__doc__.splitlines()[0])
    parser.add_argument("--checkpoint", default="gpt-softmax",
                        help="the model aligned: a checkpoint or run directory, or a shipped "
                        "model's name; not used with --garg-size (default: %(default)s)")
    parser.add_argument("--out", type=out_dir, default=Path("fu2024-report"),
                        help="the report folder (report.md with its figures and tables); "
                        "--garg-size also trains into OUT/garg-run (default: %(default)s, in "
                        "the current directory)")
    parser.add_argument("--overwrite", action="store_true",
                        help="replace this script's own earlier report at OUT")
    parser.add_argument("--n-sequences", type=positive_int, default=512,
                        help="evaluation sequences of each alignment (default: %(default)s)")
    parser.add_argument("--garg-size", action="store_true",
                        help="first train (or resume) Garg et al.'s 12 layers x 256 wide at "
                        "d = 20, 41 points into OUT/garg-run, and align it instead of "
                        "--checkpoint (a GPU job: days on 2 CPU cores)")
    parser.add_argument("--garg-steps", type=positive_int, default=500_000,
                        help="training steps of the --garg-size model (default: %(default)s)")
    parser.add_argument("--device", default="cpu",
                        help="where the model runs (and trains, with --garg-size): cpu, cuda, "
                        "cuda:1, ... (default: %(default)s)")
    args = parser.parse_args()
    try:
        device = torch.device(args.device)
    except RuntimeError:
        parser.error(f"argument --device: expected a torch device (cpu, cuda, cuda:1, ...), "
                     f"got {args.device!r}")
    if device.type == "cuda" and not torch.cuda.is_available():
        parser.error(f"argument --device: {args.device} asked for, but torch sees no CUDA GPU")
    try:
        if not args.garg_size:  # (a Garg-size run trains into OUT/garg-run first)
            check_output(args.out, "report", args.overwrite)  # before the work, not after
        run(args)
    except (InputError, OSError) as err:
        parser.exit(2, f"{parser.prog}: error: {err}\n")


def run(args: argparse.Namespace) -> None:
    """Align, write the report and print the paper's claims against the measured."""
    torch.set_num_threads(2)
    checkpoint = (garg_size_model(args.out / "garg-run", args.device, args.garg_steps)
                  if args.garg_size else args.checkpoint)
    model = models.load(checkpoint, device=args.device)
    results, designed = {}, {}
    for protocol in ("fu2024", "iclprobe"):
        for data in ("task", "ill-conditioned"):
            cfg = AlignConfig(protocol=protocol, algorithms=("newton", "gd", "online_gd", "ols"),
                              data=data, n_sequences=args.n_sequences, device=args.device)
            res = align(model, cfg, name=f"{Path(checkpoint).name}-{protocol}-{data}")
            print(text_table(res), end="\n\n")
            results[protocol, data] = res
            if data == "task":
                designed[protocol] = align_designed(model, cfg, res.name, own=res)
    write_report(args.out, list(results.values()), title="Fu et al. 2024 at CPU scale",
                 command="python scripts/reproduce_fu2024.py", overwrite=args.overwrite,
                 designed={results[p, "task"].name: d for p, d in designed.items()})
    for protocol in ("fu2024", "iclprobe"):
        print(f"protocol {protocol}:")
        print(f"  {'paper':56s}  measured")
        for claim, measured in claims(results[protocol, "task"],
                                      results[protocol, "ill-conditioned"],
                                      designed[protocol]):
            print(f"  {claim:56s}  {measured}")
    print(f"report: {args.out / 'report.md'}")


if __name__ == "__main__":
    main()
