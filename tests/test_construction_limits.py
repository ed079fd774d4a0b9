"""Known-answer constructions and oracles refuse what they cannot build, naming why.

Sizes are measured on the meta device (like every family's) before anything is allocated;
inputs that would give an empty or non-finite model are refused at once.
"""

import json
import math

import pytest
import torch

from iclprobe import constructions, models
from iclprobe.cli import main
from iclprobe.models.config import OracleConfig


@pytest.mark.parametrize(("a", "n_points", "says"), [
    (-1.0, 5, r"newton_transformer_alpha.a must be a number > 0, got -1.0"),
    (math.nan, 5, r"newton_transformer_alpha.a must be a number > 0, got nan \(not finite\)"),
    (0.0, 5, r"newton_transformer_alpha.a must be a number > 0, got 0.0"),
    (1e-3, 0, r"newton_transformer_alpha.n_points must be a positive integer, got 0"),
])
def test_newton_alpha_refuses_what_gives_no_finite_alpha(a, n_points, says):
    with pytest.raises(ValueError, match=says):
        constructions.newton_transformer_alpha(a, n_points)


@pytest.mark.parametrize(("build", "says"), [
    (lambda: constructions.gd_transformer(10**6, 1),
     r"gd_transformer\(1000000, 1\): a model with 2,000,000,000,000 parameters .* needs at "
     r"least .* GiB of memory"),
    (lambda: constructions.newton_transformer(10**5, 3),
     r"newton_transformer\(100000, 3\): a model with .* needs at least"),
    (lambda: constructions.newton_transformer(5, 100000),
     r"newton_transformer: n_layers=100000 needs the coefficient 2\^\(n_layers - 3\)·a, "
     r"beyond float32's range for a=0.001: at most 140 layers"),
    (lambda: constructions.gd_transformer(3, 2, lr=math.inf),
     r"gd_transformer.lr must be a number > 0, got inf"),
    (lambda: constructions.pgd_transformer([]),
     r"preconds must hold at least one \[d, d\] matrix \(one per layer\), got none"),
    (lambda: constructions.pgd_transformer([torch.eye(2), torch.eye(3)]),
     r"preconds must be matrices of one shape \[d, d\], got shapes \[\(2, 2\), \(3, 3\)\]"),
    (lambda: constructions.pgd_transformer([torch.eye(2), [[1.0, 0.0], [0.0, 1.0]]]),
     r"preconds\[1\] must be a torch tensor \[d, d\], got list"),
])
def test_constructors_refuse_what_they_cannot_build(build, says):
    with pytest.raises(ValueError, match=says):
        build()


def test_the_largest_newton_construction_is_finite():
    model = constructions.newton_transformer(2, 140)
    assert all(bool(torch.isfinite(p).all()) for p in model.parameters())


@pytest.mark.parametrize(("field", "value", "says"), [
    ("n_dims", 10**9, r"loading .*: a model with 1,000,000,0\d\d,\d{3},\d{3},\d{3} parameters "
                      r"\(n_dims=1000000000, .*needs at least .* GiB of memory"),
    ("n_noise", 10**9, r"loading .*: a model with .* \(.*n_noise=1000000000\) needs at least"),
    ("n_layers", 10**7, r"OracleConfig.n_layers must be an integer in \[1, 4097\), got "
                        r"10000000"),
])
def test_a_copied_oracle_with_huge_sizes_is_one_line(tmp_path, capsys, field, value, says):
    path = models.load("ka-newton-oracle").save(tmp_path / "oracle")
    config = json.loads((path / "config.json").read_text())
    config["config"][field] = value
    if field == "n_layers":
        config["config"]["steps"] = None
    (path / "config.json").write_text(json.dumps(config))
    with pytest.raises(ValueError, match=says):
        models.load(path)
    assert main(["align", str(path), "--n-sequences", "16"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "internal error" not in err, err


def test_an_oracle_built_in_python_is_measured_first():
    with pytest.raises(ValueError, match=r"building a LearnerOracle of gd: a model with .* "
                                         r"\(n_dims=5, n_layers=3, n_noise=1000000000\) needs"):
        constructions.LearnerOracle(OracleConfig(n_dims=5, n_layers=3, learner="gd",
                                                 n_noise=10**9))


def test_the_oracle_builder_bounds_its_depth_before_listing_its_steps():
    with pytest.raises(ValueError, match=r"oracle.n_layers must be an integer in \[1, 4097\), "
                                         r"got 10000000"):
        constructions.oracle("gd", 5, 10**7, lambda layer: 3 * layer)
