"""One screen of answer: what ``iclprobe align`` prints, the report's layout, the notebook."""

import copy
import dataclasses
import json
import re
import sys

import pytest
import torch

from iclprobe import algorithms, tasks
from iclprobe._text import wrap
from iclprobe.alignment import comparison as C
from iclprobe.alignment.config import AlignConfig
from iclprobe.alignment.measuring.runs import run_spec
from iclprobe.alignment.output.screen import MAX_LINES, WIDTH, layer_table, screen, short_metric
from iclprobe.alignment.output.tables import answer_table, main_pair, nice_float, text_table
from iclprobe.alignment.pipeline import align_layers
from iclprobe.alignment.protocols import ICLPROBE
from iclprobe.cli import main

CFG = AlignConfig(algorithms=("newton", "gd", "online_gd"), n_boot=20, separation=False)


def synthetic(plan: str, seed: int = 0):
    """An aligned model whose layer l is plan[l]: "0" nothing, "n" a Newton step, "g" a GD step.

    The k-th Newton (GD) layer is that learner's k-th column: the matched steps grow.
    """
    batch = tasks.RegressionTask(n_dims=4, n_points=10).sample(32, generator=seed)
    stats = algorithms.prefix_stats(batch.xs.double(), batch.ys.double())
    its = {k: run_spec(ICLPROBE.run(k), batch, len(plan) - 1, True, stats)
           for k in ("newton", "gd")}
    preds, weights, seen = [], [], {"n": 0, "g": 0}
    for kind in plan:
        if kind == "0":
            preds.append(torch.zeros_like(its["newton"].preds[0]))
            weights.append(torch.zeros_like(its["newton"].weights[0]))
            continue
        it = its["newton" if kind == "n" else "gd"]
        seen[kind] += 1
        k = min(seen[kind], it.steps.numel() - 1)
        preds.append(it.preds[k])
        weights.append(it.weights[k])
    weights = torch.stack(weights)[:, :8]  # induced weights on a few sequences, as align's
    return align_layers(torch.stack(preds), batch, CFG, layer_weights=weights)


def expand(layers: str) -> list[int]:
    """ "0–2, 5" -> [0, 1, 2, 5]."""
    out = []
    for part in layers.split(", "):
        lo, _, hi = part.partition("–")
        out += list(range(int(lo), int(hi or lo) + 1))
    return out


def parse_table(text: str):
    """The layer table's columns (group, heading, start) and rows (layers, cells or span)."""
    lines = text.splitlines()
    i = next(k for k, line in enumerate(lines) if line.startswith("layer  error"))
    starts = [m.start() for m in re.finditer(r"(?:^|(?<=  ))(?=\S)", lines[i])]
    bounds = starts[1:] + [None]
    groups = {m.start(): m.group(0) for m in re.finditer(r"\S+(?: \S+)*", lines[i - 1])}
    group, columns = "", []
    for start, end in zip(starts, bounds):
        group = groups.get(start, group)
        columns.append((group, lines[i][start:end].strip()))
    rows = []
    for line in lines[i + 1:]:
        if not line.strip() or line.startswith("… "):
            break
        cells = [line[s:e].strip() for s, e in zip(starts, bounds)]
        span = line[starts[1]:].strip() if not re.match(r"-?\d", cells[1]) else None
        rows.append((expand(cells[0]), cells, span))
    return columns, rows


def expected_labels(res, group: str, head: str):
    """The result's labels per layer for the table column under ``group`` / ``head``."""
    metric = {short_metric(m): m for m in res.comparisons}.get(head)
    if (group, head) == ("newton vs gd", "verdict"):
        return res.verdict
    if (group, head) == ("what it runs", "answer"):
        return [a.short for a in res.answer.layers]
    if group == "fitted view":
        return res.fitted[metric].verdicts
    if group == "protocol view":
        return main_pair(res, metric).verdicts
    return None


PRIORITY = ["what it runs", "verdict", "fitted view", "spectral", "protocol view"]


def _answer_range(first: str, last: str) -> str:
    """A run's answer cell: one text, or the first and last, their step counts alone ranged
    where nothing else differs ("gd (1/λmax, step 2–2048)")."""
    if first == last:
        return first
    a, b = first.rsplit("step ", 1), last.rsplit("step ", 1)
    if len(a) == len(b) == 2 and a[0] == b[0]:
        na, nb = a[1].rstrip(")"), b[1].rstrip(")")
        if na.isdigit() and nb.isdigit() and a[1][len(na):] == b[1][len(nb):]:
            return f"{a[0]}step {na}–{nb}{a[1][len(na):]}"
    return f"{first}–{last}"


def check_screen(res, text: str) -> list[str]:
    """The budget holds and every cell agrees with the result it shows; the groups shown.

    The blank line that separates one model's screen from the next is not counted.
    """
    lines = text.rstrip("\n").splitlines()
    assert len(lines) <= MAX_LINES and max(map(len, lines)) <= WIDTH
    columns, rows = parse_table(text)
    shown = sorted(layer for layers, _, _ in rows for layer in layers)
    cut = [line for line in lines if re.fullmatch(r"… \d+ more rows: --verbose shows every layer",
                                                  line)]
    if cut:  # the first rows, and a line saying how many more there are
        assert len(set(shown)) == len(shown) and shown == list(range(shown[-1] + 1))
    else:
        assert shown == list(range(res.n_layers + 1))  # every layer, once
    groups = list(dict.fromkeys("verdict" if g == "newton vs gd" else g for g, _ in columns
                                if g not in ("", "matched step")))
    assert groups and groups == PRIORITY[:len(groups)]  # dropped from the least trusted
    for layers, cells, span in rows:
        if span is not None:  # dead layers: their verdict's word
            assert not any(res.live[layer] for layer in layers)
            assert {res.verdict[layer] for layer in layers} == {span.split(" (")[0]}
            continue
        assert all(res.live[layer] for layer in layers)
        for j, (group, head) in enumerate(columns):
            labels = expected_labels(res, group, head)
            if labels is not None and group == "what it runs":  # first–last of a run
                ends = [labels[layers[0]], labels[layers[-1]]]
                assert cells[j] == _answer_range(*ends)
                assert len({res.answer.layers[i].key for i in layers}) == 1
            elif labels is not None:
                assert {labels[layer] for layer in layers} == {cells[j]}
            if group == "spectral":
                orders = [spectral_text(res, i) for i in (layers[0], layers[-1])]
                assert cells[j] in (orders[0], "–".join(orders))
        if len(layers) == 1:  # the matched steps, per metric
            layer = layers[0]
            for j, (g, run) in enumerate(columns):
                if g == "matched step":
                    assert cells[j] == steps_text(res, run, layer)
    return groups


def spectral_text(res, layer: int) -> str:
    """The spectral order as shown: "—" where its interval is undefined."""
    spec = res.spectral
    usable = spec.order[layer] is not None and not spec.reading[layer].startswith("too few")
    return f"{spec.order[layer]:.2f}" if usable else "—"


def steps_text(res, run: str, layer: int) -> str:
    """The matched steps of ``run`` by each metric, † where not above the zero predictor."""
    return "/".join(str(res.matches[run][m].best_step[layer])
                    + ("" if res.matches[run][m].above_zero[layer] else "†")
                    for m in res.comparisons)


@pytest.fixture(scope="module")
def shallow():
    return synthetic("000nnnggg")  # 8 layers


def test_a_shallow_model_gets_a_row_per_live_layer_and_its_views(shallow):
    text = screen(shallow)
    assert check_screen(shallow, text)[:2] == ["what it runs", "verdict"]
    assert shallow.answer.sentence(shallow.live) in " ".join(line.strip()
                                                             for line in text.splitlines())
    _, rows = parse_table(text)
    live = [layers for layers, _, span in rows if span is None]
    assert live == [[layer] for layer in range(3, 9)]
    assert [layers for layers, _, span in rows if span is not None] == [[0, 1, 2]]
    assert shallow.verdict_sentence in " ".join(line.strip() for line in text.splitlines())
    for pair in ("newton vs gd (step sizes fitted) by ",
                 "newton vs gd (protocol iclprobe) by ",
                 "newton vs online_gd (protocol iclprobe) by "):
        assert pair in text  # one sentence per learner pair, naming its view
    assert re.search(r"^newton \(error cos\., layers [\d–, ]+\): step slope", text, re.M)
    assert text.splitlines()[-1].startswith("--verbose shows the full tables")
    # the last line with the most notes a screen counts still fits (it once ran to 101)
    many = dataclasses.replace(shallow, notes=[f"note {i}" for i in range(99)])
    assert max(map(len, screen(many).splitlines())) <= WIDTH
    head = text.splitlines()[0]
    assert head.startswith("model: protocol iclprobe, data d = 4, 10 points") and "t = 1..9" in head


@pytest.fixture(scope="module")
def deep():
    return synthetic("000" + "n" * 11 + "g" * 11)  # 24 layers, 21 live


@pytest.mark.slow
def test_a_deep_model_collapses_runs_of_layers_with_the_same_verdicts(deep):
    text = screen(deep)
    check_screen(deep, text)
    _, rows = parse_table(text)
    live_rows = [layers for layers, _, span in rows if span is None]
    assert len(live_rows) < 21 and any(len(layers) > 1 for layers in live_rows)
    verdicts = deep.verdict
    runs = 1 + sum(verdicts[i] != verdicts[i - 1] for i in range(4, 25))
    assert len(live_rows) >= runs  # no run merges layers of different verdicts


def test_alternating_verdicts_stay_within_the_budget(deep):
    res = copy.deepcopy(deep)
    for pair in [*res.fitted.values(), *(p for c in res.comparisons.values() for p in c.pairs)]:
        pair.verdicts = [v if not res.live[i] else f"prefers {(pair.a, pair.b)[i % 2]}"
                         for i, v in enumerate(pair.verdicts)]
    res.answer.layers = [a if not res.live[i] else dataclasses.replace(
        a, kind="runs", learner=("newton", "gd")[i % 2]) for i, a in enumerate(res.answer.layers)]
    text = screen(res)
    lines = text.splitlines()
    assert len(lines) <= MAX_LINES and max(map(len, lines)) <= WIDTH
    _, rows = parse_table(text)
    assert [layers for layers, _, span in rows if span is None] == [[i] for i in range(3, 14)]
    assert "… 11 more rows: --verbose shows every layer" in lines
    check_screen(res, text)


def test_the_tables_title_names_the_columns_it_kept(deep):
    """ka-newton-oracle's collapsed answers ("newton (1/‖SSᵀ‖, step 0)–newton (…, step 12)")
    left no room for the verdict's columns, and the title still announced them."""
    assert "what it runs and newton vs gd: the verdict and its views" in \
        " ".join(screen(deep).split())
    res = copy.deepcopy(deep)
    long = "a column described at a length that leaves no room for the verdict"
    res.answer.layers = [a if not res.live[i] else dataclasses.replace(
        a, kind="runs", learner="newton", column=f"{long}, step {i}")
        for i, a in enumerate(res.answer.layers)]
    lines, columns = layer_table(res)
    assert [c.view for c in columns] == ["answer"]
    title = " ".join(" ".join(lines[:2]).split())
    assert title == ("per layer: error, matched steps by error cos./weight cos. († = not above "
                     "the zero predictor), what it runs")


def test_a_model_that_solves_nothing_gets_one_line(shallow):
    res = dataclasses.replace(shallow, meaningless="the model does not solve this task")
    lines = screen(res).splitlines()
    assert lines[-1] == "no alignment: the model does not solve this task"  # no hint of
    assert len(lines) <= 4 and "--verbose" not in screen(res)  # tables --verbose lacks too


@pytest.fixture(scope="module")
def pq_results():
    from iclprobe.cli_commands import align_checkpoints

    cfg = AlignConfig(n_sequences=32, n_boot=10)
    return align_checkpoints(["pq-isotropic-1layer"], cfg)


@pytest.mark.slow
def test_align_prints_one_screen_and_verbose_the_full_tables(pq_results, capsys, monkeypatch):
    results, _ = pq_results
    argv = ["align", "pq-isotropic-1layer", "--n-sequences", "32", "--n-boot", "10"]
    assert main(argv) == 0
    printed = capsys.readouterr().out
    from iclprobe import models, probes

    note = probes.analyze_preconditioners(models.load("pq-isotropic-1layer")).summary(
        "pq-isotropic-1layer")  # a PQ model's A_l: positive definite or not, one line
    assert note.endswith(": positive definite")
    # the library's numbers, on one screen, and the note
    assert printed.strip() == screen(results[0], reserve=1) + "\n" + note  # within 40 lines
    assert len(note) <= 100  # one line (a longer note is wrapped, its lines reserved)
    check_screen(results[0], printed)
    import iclprobe.cli_commands as commands

    monkeypatch.setattr(commands, "align_checkpoints", lambda *a, **k: pq_results)
    assert main([*argv, "--verbose"]) == 0
    printed = capsys.readouterr().out
    for metric in ("error_cosine", "weight_cosine"):
        assert text_table(results[0], metric) in printed
    assert "learner table" in printed and "calibration, newton vs gd" in printed
    # the verdict's paragraph wrapped within 100 columns, as the screen's sentences are
    verdict = results[0].verdict_sentence
    assert verdict and len(verdict) > 100
    assert "\n".join(wrap([verdict])) in printed and verdict not in printed


@pytest.mark.slow
def test_a_pq_models_note_is_wrapped_within_the_screens_budget(capsys):
    # ka-gd-pq's note on its A_l runs past 100 columns: wrapped, and its lines reserved
    assert main(["align", "ka-gd-pq", "--n-sequences", "32", "--n-boot", "10"]) == 0
    lines = capsys.readouterr().out.rstrip("\n").splitlines()
    assert lines[-1] == "  definite" and lines[-2].startswith("ka-gd-pq: λ_min")  # wrapped
    assert len(lines) <= MAX_LINES and max(map(len, lines)) <= WIDTH


# ---------------------------------------------------------------- the report
@pytest.mark.slow
def test_the_report_opens_with_the_findings_and_keeps_each_model_in_its_folder(
        shallow, deep, tmp_path):
    from iclprobe import atomic, storage
    from iclprobe.alignment.output.report import write_report

    deep = dataclasses.replace(deep, name="deep one")  # a name that is no folder name
    with atomic.atomic_directory(tmp_path / "r", "report") as tmp:
        write_report(tmp, [shallow, deep], title="t", side_by_side=[["model", "deep one"]])
    out = tmp_path / "r"
    assert {p.name for p in out.iterdir()} == {".iclprobe", "report.md", "summary.json",
                                               "matched_newton_steps.png",
                                               "comparison_newton.csv", "model", "deep_one"}
    assert {"result.json", "table_error_cosine.csv", "heatmaps_weight_cosine.png",
            "error.png"} <= {p.name for p in (out / "deep_one").iterdir()}
    report = (out / "report.md").read_text()
    headings = [line for line in report.splitlines() if line.startswith("## ")]
    assert headings[:4] == ["## Findings", "## model", "## deep one",
                            "## Matched Newton step against depth"]
    assert headings[-1] == "## How to read the tables"
    findings = report.split("## Findings")[1].split("\n## ")[0]
    rows = [line.split(" | ") for line in findings.splitlines() if line.startswith("| deep one")]
    protocol = C.combined([main_pair(deep, m) for m in deep.comparisons])[0]
    assert len(rows) == 1
    answer = deep.answer.labels
    assert rows[0][2].startswith("0–2 computes nothing; 3–13 newton; 14–24 gd")
    for cell, labels in zip(rows[0][2:], (answer, deep.verdict, protocol)):  # their runs
        runs = cell.rstrip(" |").split("; ")
        assert sum(len(expand(r.split(" ")[0])) for r in runs) == len(labels)
        for run in runs:
            layers, label = run.split(" ", 1)
            assert {labels[i] for i in expand(layers)} == {label}
    side = findings.split("### Side by side: model, deep one")[1]
    cells = {int(line.split(" | ")[0][2:]): line.split(" | ")[1:] for line in side.splitlines()
             if re.match(r"\| \d", line)}
    assert sorted(cells) == list(range(25))
    shallow_protocol = C.combined([main_pair(shallow, m) for m in shallow.comparisons])[0]
    assert cells[4][0] == f"{shallow.verdict[4]} / {shallow_protocol[4]}"
    assert cells[20][0] == "-"  # past the shallow model's depth
    summary = json.loads((out / "summary.json").read_text())
    assert summary["findings"]["deep one"]["folder"] == "deep_one"
    assert summary["findings"]["deep one"]["verdict"] == deep.verdict
    assert summary["findings"]["deep one"]["by_metric"]["weight_cosine"]["fitted"] == \
        deep.fitted["weight_cosine"].verdicts
    assert json.loads((out / "deep_one" / "result.json").read_text()) == \
        summary["models"]["deep one"]
    # a file the user put inside a model's folder is not the report's to replace
    (out / "model" / "my notes.txt").write_text("mine")
    with pytest.raises(storage.OutputExistsError, match=r"model/my notes\.txt"):
        storage.check_output(out, "report", overwrite=True)
    (out / "model" / "my notes.txt").unlink()
    assert storage.check_output(out, "report", overwrite=True) == out


def test_report_folder_names_are_safe_and_unique():
    from iclprobe.alignment.output.report_model import folder_names

    assert folder_names(["a b", "a_b", "..", ".hidden", "report.md", "", "a b"]) == \
        ["a_b", "a_b-2", "model-..", "model-.hidden", "model-report.md", "model", "a_b-3"]


# ---------------------------------------------------------------- the notebook
def test_a_result_renders_compactly_in_a_notebook(shallow):
    res = dataclasses.replace(shallow, name="<m&1>")
    text = repr(res)
    assert text.startswith("AlignResult('<m&1>', 8 layers, protocol 'iclprobe'") and len(text) < 300
    assert "live layers 3–8" in text

    class Printer:
        def text(self, value):
            self.value = value

    printer = Printer()
    res._repr_pretty_(printer, cycle=False)
    assert printer.value == screen(res)
    page = res._repr_html_()
    assert "&lt;m&amp;1&gt;" in page and "<m&1>" not in page  # escaped
    rows = re.findall(r"<tr>(.*?)</tr>", page.split("<tbody>")[1])
    assert len(rows) == 1 + 6  # layers 0–2 in one row, then one per live layer
    for row in rows[1:]:
        cells = re.findall(r"<td>(.*?)</td>", row)
        layer = int(cells[0])
        assert cells[2:] == [steps_text(res, "newton", layer), steps_text(res, "gd", layer),
                             res.answer.layers[layer].short, res.verdict[layer],
                             res.fitted["error_cosine"].verdicts[layer],
                             res.fitted["weight_cosine"].verdicts[layer],
                             spectral_text(res, layer),
                             main_pair(res, "error_cosine").verdicts[layer],
                             main_pair(res, "weight_cosine").verdicts[layer]]


def test_verbose_opens_with_what_each_layer_runs(shallow):
    """--verbose had no answer at all, only the protocol learners' tables."""
    lines = answer_table(shallow).splitlines()
    said = shallow.answer
    assert lines[0].startswith(f"{shallow.name} — what each layer runs, among "
                               f"{', '.join(said.candidates)}")
    head = next(i for i, line in enumerate(lines) if line.startswith("layer "))  # title wrapped
    assert lines[head].split()[:2] == ["layer", "what"] and max(map(len, lines)) <= WIDTH
    rows = [re.split(r"\s{2,}", line) for line in lines[head + 1:]]  # in blocks of columns
    for layer, a in enumerate(said.layers):
        line = "  ".join("  ".join(row) for row in rows if row[0] == str(layer))
        assert line.startswith(f"{layer}  ") and f"  {a.text}  " in f"{line}  "
        for metric in said.metrics:
            assert said.by_metric[metric][layer].short in line
        for number in (a.value, a.resemblance):  # the runner-up's is absent where none is
            assert number is None or nice_float(number) in line


def test_a_result_converts_to_a_data_frame(shallow):
    import pandas as pd  # in the test extra: CI always runs this

    frame = shallow.to_frame()
    assert isinstance(frame, pd.DataFrame) and frame.index.name == "layer"
    assert list(frame.index) == list(range(9))
    assert frame["normalized_error"].tolist() == shallow.layer_error
    assert frame["live"].tolist() == shallow.live
    said = shallow.answer.layers  # the answer and the verdict, the screen's first columns
    assert frame["answer"].tolist() == shallow.answer.texts
    assert frame["answer_kind"].tolist() == [a.kind for a in said]
    for col, key in (("answer_learner", "learner"), ("answer_column", "column")):
        # pandas shows a missing entry (a layer that computes nothing names none) as NaN
        assert [None if pd.isna(v) else v for v in frame[col]] == \
            [getattr(a, key) for a in said]
    assert frame["verdict"].tolist() == shallow.verdict and len(shallow.verdict) == 9
    for metric in ("error_cosine", "weight_cosine"):
        for run in shallow.step_runs:
            m = shallow.matches[run][metric]
            assert frame[f"{run}_step_{metric}"].tolist() == m.best_step
            assert frame[f"{run}_sim_{metric}"].tolist() == m.best_value
        assert frame[f"verdict_fitted_{metric}"].tolist() == shallow.fitted[metric].verdicts
        for pair in shallow.comparisons[metric].pairs:
            assert frame[f"verdict_{pair.a}_vs_{pair.b}_{metric}"].tolist() == pair.verdicts
    assert frame.attrs["name"] == "model" and frame.attrs["protocol"] == "iclprobe"


def test_without_pandas_to_frame_says_how_to_install_it(shallow, monkeypatch):
    monkeypatch.setitem(sys.modules, "pandas", None)  # import pandas now fails
    with pytest.raises(ModuleNotFoundError, match=r"needs pandas.*pip install pandas"):
        shallow.to_frame()


@pytest.mark.slow
def test_a_protocol_sentence_that_contradicts_the_verdict_names_its_view():
    # the GD oracle at 1/λ_max per prefix, read under fu2024 (GD at a fixed 0.01 on the
    # summed loss): the protocol's fixed steps call it Newton, the verdict (step sizes
    # fitted) GD. (The Newton oracle at 1/||SS^T||_F was the example while fu2024's alpha
    # was 2/||SS^T||_F.)
    from iclprobe import models
    from iclprobe.alignment.pipeline import align

    res = align(models.load("ka-gd-oracle"),
                AlignConfig(protocol="fu2024", n_sequences=128, n_boot=20, separation=False,
                            algorithms=("newton", "gd")))
    assert set(res.verdict[1:]) == {"prefers gd"}
    text = " ".join(line.strip() for line in screen(res).splitlines())
    protocol = re.search(r"newton vs gd \(protocol fu2024\) by [^.]*\.",
                         text).group(0)
    assert "prefers newton" in protocol
    assert "(the protocol's fixed-step view; it names another learner than the verdict at " \
        "1–8)" in protocol
    fitted = re.search(r"newton vs gd \(step sizes fitted\) by [^.]*\.", text).group(0)
    assert "fixed-step view" not in fitted


def test_the_learner_figure_of_a_table_without_pairs_draws_without_warnings(tmp_path):
    # gd, cg and ols are compared with no learner: the paired-difference panel is empty
    # and matplotlib warned "No artists with labels found to put in legend" on stderr
    import warnings

    from iclprobe.alignment.output.plots import learner_comparison

    b = tasks.RegressionTask(n_dims=4, n_points=9).sample(
        64, generator=torch.Generator().manual_seed(0))
    it = algorithms.gd(b.xs.double(), b.ys.double(), steps=range(3), lr="max")
    res = align_layers(it.preds, b, AlignConfig(n_boot=20, separation=False, fitted=False,
                                                metrics=("error_cosine",),
                                                algorithms=("gd", "cg", "ols")))
    assert res.comparisons["error_cosine"].pairs == []
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        path = learner_comparison(res, "error_cosine", tmp_path / "learners.png")
    assert path.stat().st_size > 0


def test_models_side_by_side_fit_the_screen_in_blocks(shallow, deep):
    # four shipped GPTs' names made the steps table 118 columns wide in one block
    from iclprobe.alignment.output.side_by_side import comparison_lines, comparison_rows

    names = ["gpt-softmax-paired", "gpt-linear-paired", "gpt-softmax-ill", "gpt-softmax",
             "runs/a-run-folder-with-a-long-name"]
    results = [dataclasses.replace(deep if i % 2 else shallow, name=n)
               for i, n in enumerate(names)]
    lines = comparison_lines(results)
    assert all(len(line) <= 100 and line == line.rstrip() for line in lines)
    headers = [line for line in lines if line.startswith("layer ")]
    assert len(headers) == 2  # two blocks, each led by the layer column
    assert [c for h in headers for c in re.split(r"\s{2,}", h)[1:]] == \
        [f"{n} step (sim)" for n in names]  # every model once, in order
    header, body = comparison_rows(results)
    first = [re.split(r"\s{2,}", line) for line in lines[1:1 + len(body) - 1]]
    assert first == [[row[0], *row[1:4]] for row in body[:-1]]  # the same cells, 25 layers
    for name, fit in zip(names, body[-1][1:]):
        assert f"{name}: {fit}" in " ".join(map(str.strip, lines))


def _aligned_at_90():
    from iclprobe import models
    from iclprobe.alignment import align

    return align(models.load("ka-gd-oracle"), AlignConfig(n_sequences=32, n_boot=40,
                                                          confidence=0.9, separation=False,
                                                          fitted=False))


def test_the_printed_intervals_name_the_confidence_asked():
    # every interval the screen and the tables name was "95%" whatever --confidence said
    res = _aligned_at_90()
    printed = screen(res) + text_table(res)
    assert "90% interval" in printed and "95%" not in printed
    assert "beyond the 90% interval" in screen(res)


@pytest.mark.slow
def test_the_reports_captions_name_the_confidence_asked(tmp_path):
    from iclprobe.alignment import write_report

    report_md = write_report(tmp_path / "r", [_aligned_at_90()]).read_text()
    assert "with its 90% interval" in report_md and "95% interval" not in report_md


def test_a_weight_table_heading_names_the_positions_it_reads():
    """fu2024 reads the error cosine from t = 0 and the induced weights from t = 1 (at t = 0
    every weight is 0): the weight cosine's heading said "t = 0..7" all the same."""
    from iclprobe.alignment.output.tables import header_line
    from iclprobe.alignment.pipeline import align_layers

    b = tasks.RegressionTask(n_dims=3, n_points=8).sample(16, generator=0)
    it = algorithms.gd(b.xs.double(), b.ys.double(), steps=[1, 4], lr="max", weights=True)
    res = align_layers(it.preds, b, AlignConfig(protocol="fu2024", n_boot=10, separation=False,
                                                algorithms=("newton", "gd")),
                       layer_weights=it.weights, name="gd")
    assert header_line(res, "error_cosine").endswith("protocol fu2024, t = 0..7")
    assert header_line(res, "weight_cosine").endswith("protocol fu2024, t = 1..7")
    assert res.similarities["gd"]["weight_cosine"].values.shape[0] == 2


def test_a_spectral_order_without_an_interval_says_none():
    """Too few usable directions gave p 1.02 beside "[—, —]" under a "95% interval" heading."""
    from types import SimpleNamespace

    from iclprobe.alignment.output.tables import spectral_lines
    from iclprobe.alignment.views.spectral import SpectralOrder

    spec = SpectralOrder(order=[None, 1.02, 1.9], lower=[None, None, 1.8],
                         upper=[None, None, 2.1], directions=[0, 3, 40],
                         reference={"gd": [None, 1.0, 1.0]},
                         reading=["computes nothing", "too few usable directions",
                                  "newton-like"], t_min=5)
    lines = spectral_lines(SimpleNamespace(spectral=spec, similarities={}))
    rows = {line.split()[0]: line.split() for line in lines if line[:1].isdigit()}
    assert rows["1"][1:3] == ["1.02", "none"] and rows["2"][1:4] == ["1.90", "[1.80,", "2.10]"]


def test_a_zero_in_a_table_reads_as_its_neighbours():
    """The weight tables' zero predictor read "0.0" in a column of "0.997"s."""
    assert [nice_float(x) for x in (0.0, -0.0, 0.9974, 0.004)] == ["0.000", "0.000", "0.997",
                                                                    "4.0e-03"]
