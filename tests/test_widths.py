"""What ``iclprobe align --verbose`` and the progress bars print keeps within 100 columns.

--verbose's full tables (a column per candidate learner and per difference) and their
titles ran to 259 columns (ka-gd-oracle, read exactly) and 272 (gpt-softmax, through
probes); a progress bar spanned the terminal, however wide.
"""

import io
import os
import re
import sys
from collections import Counter

import pytest
import torch
from helpers import tiny_gpt

from iclprobe import models
from iclprobe._text import WIDTH, aligned, grid_text, wrap
from iclprobe.alignment import AlignConfig, align
from iclprobe.alignment.output import tables as T
from iclprobe.cli import main


def test_a_table_that_fits_is_laid_out_as_before():
    header, body = ["layer", "a", "bb"], [["0", "x", "yyy"], ["10", "zz", ""]]
    assert aligned(header, body) == ["layer   a   bb", "    0   x  yyy", "   10  zz"]
    assert aligned(header, body, right=False, narrow=True) == \
        ["layer  a   bb", "0      x   yyy", "10     zz"]


def test_a_wide_table_goes_in_blocks_each_led_by_the_layer_column():
    header = ["layer", *(f"learner {k} @step" for k in range(8))]
    body = [[str(i), *(f"0.{i}{k}1±0.010 @{k}" for k in range(8))] for i in range(3)]
    lines = aligned(header, body, right=False)
    assert max(map(len, lines)) <= WIDTH
    blocks = "\n".join(lines).split("\n\n")
    assert len(blocks) > 1 and all(b.startswith("layer  learner") for b in blocks)
    for block in blocks:  # every row in every block, its cells in order
        rows = [re.split(r"\s{2,}", line) for line in block.splitlines()]
        assert [r[0] for r in rows] == ["layer", "0", "1", "2"]
    cells = [re.split(r"\s{2,}", line)[1:] for line in lines if line[:1].isdigit()]
    assert sorted(c for row in cells for c in row) == sorted(c for row in body for c in row[1:])


def test_headings_wrap_where_that_saves_a_block_and_wide_cells_wrap():
    header = ["layer", "layer ~ pgd_inv_cov", "newton ~ that pgd_inv_cov step",
              "layer ~ newton", "pgd_inv_cov ~ that newton step", "verdict"]
    body = [["0", "1.000 (0)", "0.832 (0)", "0.832 (0)", "0.902 (1)", "computes nothing"],
            ["1", "0.999 (1)", "0.902 (0)", "0.909 (0)", "0.902 (1)", "prefers pgd_inv_cov"]]
    assert max(map(len, aligned(header, body, right=False))) <= WIDTH
    lines = aligned(header, body, right=False, narrow=True)  # one block, headings wrapped
    assert max(map(len, lines)) <= WIDTH and "" not in lines
    assert Counter(" ".join(lines).split()) == Counter(" ".join(header + sum(body, [])).split())
    assert len(lines) > 3 and lines[0].startswith("layer  layer ~")  # headings over lines
    assert [re.split(r"\s{2,}", line) for line in lines[-2:]] == body
    long = "cannot tell cg from " + ", ".join(["ols", "newton", "momentum", "gd"] * 6)
    lines = aligned(["layer", "what it runs"], [["0", long], ["1", "gd"]], right=False)
    assert max(map(len, lines)) <= WIDTH and lines[-1].startswith("1      gd")
    assert [line[7:] for line in lines[1:-1]] == wrap([long], "", WIDTH - 7)


@pytest.mark.slow  # an align through the CLI each (6 s, 8 s)
@pytest.mark.parametrize("model", ["ka-gd-oracle", "gpt-softmax"])
def test_align_verbose_keeps_every_line_within_the_screen(model, capsys, monkeypatch):
    import iclprobe.cli_commands as commands

    kept, align_checkpoints = [], commands.align_checkpoints

    def keeping(*args, **kwargs):
        kept.append(align_checkpoints(*args, **kwargs))
        return kept[-1]

    monkeypatch.setattr(commands, "align_checkpoints", keeping)
    assert main(["align", model, "--verbose", "--n-sequences", "32", "--n-boot", "10"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert max(map(len, lines)) <= WIDTH, max(lines, key=len)
    (res,), _ = kept[0]
    assert ("probes" in res.readout) == (model == "gpt-softmax")  # read both ways
    # nothing lost: every cell of every table on a line, every sentence in the text
    flat = " ".join(line.strip() for line in lines)
    tables = [T.matched_rows(res, m) for m in res.comparisons]
    tables += [T.learner_rows(res, m, compact=True) for m in res.comparisons]
    tables += [T.calibration_rows(res, p) for c in res.comparisons.values() for p in c.pairs]
    tables += [T.fitted_rows(res, m) for m in res.fitted]
    for _, body in tables:
        for row in body:
            assert all(any(cell in line for line in lines) for cell in row), row
    sentences = [p.sentence for c in res.comparisons.values() for p in c.pairs]
    sentences += [p.sentence for p in res.fitted.values()] + [f"note: {n}" for n in res.notes]
    assert all(s in flat for s in sentences)
    assert sum(line.startswith("learner table:") for line in lines) == len(res.comparisons)


class Terminal(io.StringIO):
    """A stderr that says it is a terminal (its size: whatever os.get_terminal_size says)."""

    def fileno(self) -> int:
        return 2

    def isatty(self) -> bool:
        return True


def test_the_residuals_progress_bar_keeps_within_the_screen_on_a_wide_terminal(monkeypatch):
    from iclprobe.hooks.residuals import collect_residuals

    monkeypatch.setattr(os, "get_terminal_size", lambda fd=None: os.terminal_size((250, 50)))
    monkeypatch.setattr(sys, "stderr", Terminal())
    model = tiny_gpt()
    g = torch.Generator().manual_seed(0)
    xs, ys = torch.randn(8, 8, 3, generator=g), torch.randn(8, 8, generator=g)
    collect_residuals(model, xs, ys, batch_size=2, progress=True)
    bars = [b for b in re.split(r"[\r\n]", sys.stderr.getvalue()) if b.strip()]
    assert any("residuals" in b and "4/4" in b for b in bars)
    assert max(map(len, bars)) <= WIDTH  # it spanned the terminal: 249 columns


def test_a_step_grid_reads_in_few_words():
    assert grid_text(list(range(25))) == "0–24"
    assert grid_text([2 ** k for k in range(13)]) == "1, 2, 4, …, 4096"
    assert grid_text([1, 3, 5]) == "1, 3, 5"
    assert grid_text([0, 1, 2, 3, 4, 6, 8, 11, 16]) == "0, 1, 2, …, 16 (9 steps)"  # not a run
    assert grid_text([0, 1, 2, 3, 5]) == "0, 1, 2, 3, 5"
    assert grid_text([7]) == "7" and grid_text([0, 1]) == "0, 1"


def test_the_legend_says_the_matched_steps_are_on_the_protocols_grid():
    # ka-gd-oracle's layers 6-8 run GD for 18, 21, 24 steps: the matched-step column reads
    # 16 and 32 (the protocol's grid) beside the answer's fitted "step 20", "step 25"
    res = align(models.load("ka-gd-oracle"), AlignConfig(n_sequences=32, n_boot=10,
                                                         separation=False, fitted=False))
    assert T.step_legend(res) == [
        "matched step = each learner at the protocol's step size, on its step grid (newton "
        "0–24; gd 1, 2, 4, …, 4096), not the answer's fitted column"]


def test_a_narrowed_table_gives_its_spare_room_back_to_its_headings():
    # narrowed to its longest words, three 39-character headings stood 20 lines tall with
    # most of the width unused
    header = ["layer", *(f"{c} " * 19 + c for c in "hgk")]
    lines = aligned(header, [["0", "0.1", "0.2", "0.3"]], narrow=True)
    assert max(map(len, lines)) <= WIDTH
    assert len(lines) <= 3  # the headings in two lines, one row


def test_the_status_lines_on_stderr_keep_within_the_screen(tmp_path, capsys, monkeypatch):
    """The probes' note ("cross-fitting probes on the 512 evaluation sequences ...") ran to
    130 columns, the saved probes' to 166 and an interrupted training's to 143 (below)."""
    import logging

    from iclprobe.cli_commands import status_lines

    said = "gpt-softmax: cross-fitting probes on the 512 evaluation sequences (4 folds, " \
           "fitted to each layer's best-held candidate prediction)"
    with status_lines():
        logging.getLogger("iclprobe.alignment.measuring.probe_source").info(said)
    err = capsys.readouterr().err
    assert max(map(len, err.splitlines())) <= WIDTH and " ".join(err.split()) == said


@pytest.mark.slow  # the training's imports: some seconds in a process that has not paid them
def test_an_interrupted_trainings_line_keeps_within_the_screen(tmp_path, capsys, monkeypatch):
    from iclprobe import training

    def interrupted(*args, **kwargs):
        raise training.TrainingInterrupted(553, None)

    monkeypatch.setattr(training, "train", interrupted)
    out = tmp_path / ("a-run-folder-whose-name-is-long" * 2)
    assert main(["train", "--out", str(out), "--steps", "1"]) == 130
    lines = capsys.readouterr().err.splitlines()
    assert max(map(len, lines)) <= WIDTH and lines[0].startswith(
        "iclprobe train: interrupted after step 553; no checkpoint was written yet")


def test_align_shows_its_stages_in_a_terminal_and_nothing_elsewhere(monkeypatch):
    """A model read exactly printed nothing for the whole of its align; in a terminal each
    stage is now a progress line within the screen (off a terminal, nothing: tqdm's
    ``disable=None``)."""
    from iclprobe.alignment.measuring.timing import FIRST_STAGE, N_STAGES, Timings
    from iclprobe.cli_commands import status_lines

    class Terminal(io.StringIO):
        def isatty(self) -> bool:
            return True

    for stream, shown in ((Terminal(), True), (io.StringIO(), False)):
        monkeypatch.setattr(sys, "stderr", stream)
        with status_lines():
            timings = Timings()
            for stage in (FIRST_STAGE, "learners", "separation views"):
                with timings.stage(stage):
                    pass
        said = [part for part in stream.getvalue().split("\r") if part.strip()]
        assert bool(said) is shown
        assert not shown or f"align, stage 3 of {N_STAGES}: separation views" in said[-1]
        assert all(len(part) <= WIDTH for part in said)
