"""Bad values are refused up front: configs, tasks, seeds, and the CLI's one-line errors."""

import math

import pytest
import torch
from helpers import tiny_gpt

from iclprobe import models, probes, tasks
from iclprobe.cli import main
from iclprobe.models import GPTConfig, PQConfig
from iclprobe.tasks import RegressionTask
from iclprobe.training import TrainConfig

GPT = dict(n_dims=3, n_positions=8)
NAN, INF = float("nan"), float("inf")


@pytest.mark.parametrize(
    ("field", "value", "error", "match"),
    [
        ("ln_eps", NAN, ValueError, r"GPTConfig.ln_eps must be a number > 0, got nan \(not finite"),
        ("ln_eps", -1.0, ValueError, "GPTConfig.ln_eps must be a number > 0, got -1.0"),
        ("ln_eps", 0.0, ValueError, "GPTConfig.ln_eps must be a number > 0, got 0.0"),
        ("ln_eps", INF, ValueError, "ln_eps must be a number > 0, got inf"),
        ("ln_eps", True, TypeError, "ln_eps must be a number > 0, got True"),
        ("ln_eps", "1e-5", TypeError, "ln_eps must be a number > 0, got '1e-5'"),
        ("seed", 2**70, ValueError, r"GPTConfig.seed must be an integer seed in \[0, 2\*\*63\)"),
        ("seed", -1, ValueError, r"GPTConfig.seed must be an integer seed in \[0, 2\*\*63\), got -1"),
        ("seed", True, TypeError, "GPTConfig.seed must be an integer seed"),
        ("seed", 1.5, TypeError, "GPTConfig.seed must be an integer seed"),
        ("n_layers", True, TypeError, "GPTConfig.n_layers must be a positive integer, got True"),
        ("d_mlp", 0, ValueError, "GPTConfig.d_mlp must be a positive integer, got 0"),
        ("d_model", 2.0, TypeError, "GPTConfig.d_model must be a positive integer, got 2.0"),
    ],
)
def test_gpt_config_values(field, value, error, match):
    with pytest.raises(error, match=match):
        GPTConfig(**GPT, **{field: value})


@pytest.mark.parametrize(
    ("field", "value", "error", "match"),
    [
        ("init_std", INF, ValueError, r"PQConfig.init_std must be a number >= 0, got inf \(not"),
        ("init_std", NAN, ValueError, "PQConfig.init_std must be a number >= 0, got nan"),
        ("init_std", -0.1, ValueError, "PQConfig.init_std must be a number >= 0, got -0.1"),
        ("init_std", True, TypeError, "PQConfig.init_std must be a number >= 0, got True"),
        ("seed", 2**64, ValueError, "PQConfig.seed must be an integer seed"),
        ("seed", "3", TypeError, "PQConfig.seed must be an integer seed"),
        ("n_heads", False, TypeError, "PQConfig.n_heads must be a positive integer, got False"),
        ("sparse", 1, TypeError, "PQConfig.sparse must be a bool, got 1"),
    ],
)
def test_pq_config_values(field, value, error, match):
    with pytest.raises(error, match=match):
        PQConfig(n_dims=3, **{field: value})


@pytest.mark.parametrize(
    ("field", "value", "error", "match"),
    [
        ("momentum", 5.0, ValueError, r"TrainConfig.momentum must be a number in \[0, 1\), got 5"),
        ("momentum", 1, ValueError, r"TrainConfig.momentum must be a number in \[0, 1\), got 1"),
        ("momentum", NAN, ValueError, "TrainConfig.momentum must be a number in"),
        ("momentum", -0.1, ValueError, "TrainConfig.momentum must be a number in"),
        ("lr", INF, ValueError, r"TrainConfig.lr must be a number in \(0, 1e20\], got inf"),
        ("lr", True, TypeError, r"TrainConfig.lr must be a number in \(0, 1e20\], got True"),
        ("clip_norm", NAN, ValueError, "TrainConfig.clip_norm must be a number > 0, got nan"),
        ("weight_decay", INF, ValueError, "TrainConfig.weight_decay must be a number >= 0"),
        ("betas", (NAN, 0.9), ValueError, r"TrainConfig.betas must be two numbers in \[0, 1\)"),
        ("betas", (True, 0.9), ValueError, "TrainConfig.betas must be two numbers"),
        ("curriculum_dims", (True, 1), TypeError,
         "TrainConfig.curriculum_dims must be a positive integer, got True"),
        ("curriculum_points", (5,), TypeError, r"TrainConfig.curriculum_points must be \(start"),
        ("steps", True, TypeError, "TrainConfig.steps must be a positive integer, got True"),
        ("seed", -1, ValueError, "TrainConfig.seed must be an integer >= 0, got -1"),
        ("warmup_steps", 1.0, TypeError, "TrainConfig.warmup_steps must be an integer >= 0"),
    ],
)
def test_train_config_values(field, value, error, match):
    with pytest.raises(error, match=match):
        TrainConfig(**{field: value})


@pytest.mark.parametrize(
    ("kwargs", "error", "match"),
    [
        (dict(seed="7"), TypeError, r"RegressionTask.seed must be an integer seed .* got '7'"),
        (dict(seed=True), TypeError, "RegressionTask.seed must be an integer seed"),
        (dict(seed=2**70), ValueError, r"RegressionTask.seed must be an integer seed in \[0, 2"),
        (dict(noise_std=INF), ValueError, "RegressionTask.noise_std must be a number >= 0, got inf"),
        (dict(noise_std=NAN), ValueError, "noise_std must be a number >= 0, got nan"),
        (dict(noise_std=True), TypeError, "noise_std must be a number >= 0, got True"),
        (dict(cov="ill-conditioned", condition_number=1e12), ValueError,
         r"condition_number must be a number in \[1, 1e6\], got 1000000000000.0"),
        (dict(cov="ill-conditioned", condition_number=INF), ValueError, "condition_number"),
        (dict(cov="ill-conditioned", condition_number=True), TypeError, "condition_number"),
        (dict(cov="rotated", eigenvalues=(INF, 1.0, 1.0)), ValueError,
         r"eigenvalues must be finite and positive, got \[inf, 1.0, 1.0\]"),
        (dict(cov="rotated", eigenvalues=(NAN, 1.0, 1.0)), ValueError, "finite and positive"),
        (dict(cov="rotated", eigenvalues=(1e7, 1.0, 1.0)), ValueError,
         "eigenvalues: condition number 1e.07 is above 1e.06"),
        (dict(cov="rotated", eigenvalues=("1", 1.0, 1.0)), TypeError,
         "eigenvalues must be a non-empty sequence of numbers"),
        (dict(cov=torch.diag(torch.tensor([1e8, 1.0, 1.0]))), ValueError,
         "cov: condition number 1e.08 is above"),
        (dict(cov=torch.eye(3, dtype=torch.complex64)), TypeError, "cov must be real"),
        (dict(active_dims=True), TypeError, "active_dims must be a positive integer, got True"),
    ],
)
def test_task_values(kwargs, error, match):
    with pytest.raises(error, match=match):
        RegressionTask(n_dims=3, n_points=5, **kwargs)


def test_the_largest_condition_number_still_samples_a_positive_definite_float32_cov():
    task = RegressionTask(n_dims=8, n_points=4, cov="ill-conditioned", condition_number=1e6)
    cov = task.sample(500, generator=0).cov  # float32
    assert torch.linalg.cholesky_ex(cov).info.eq(0).all()
    assert torch.linalg.eigvalsh(cov.double()).min() > 0


def test_generator_seeds_out_of_torch_range_are_refused():
    task = RegressionTask(n_dims=2, n_points=3)
    with pytest.raises(ValueError, match=r"generator must be a torch.Generator or an integer "
                                         r"seed in \[0, 2\*\*63\), got 1180591620717411303424"):
        task.sample(2, generator=2**70)
    with pytest.raises(ValueError, match="generator must be .* got -1"):
        tasks.as_generator(-1)


def test_probes_refuse_fewer_rows_than_features():
    model = tiny_gpt()  # d_model = 16, 8 points: 7 rows per sequence at t >= 1
    task = RegressionTask(n_dims=3, n_points=8)
    with pytest.raises(ValueError, match=r"too few rows for the probes: n_sequences=1 x 7 "
                                         r"positions t >= 1 give 7 rows for 16 residual .* "
                                         r"use at least 3 sequences"):
        probes.LayerProbes().fit(model, task, n_sequences=1, generator=0)
    with pytest.raises(ValueError, match="n_sequences=2 x 7 .* give 14 rows"):
        probes.LayerProbes().fit(model, task, n_sequences=2, generator=0)
    lp = probes.LayerProbes().fit(model, task, n_sequences=3, generator=0, n_heldout=8)
    assert all(math.isfinite(r) for r in lp.metrics_.r2)
    resid = torch.zeros(3, 2, 8, 16)
    with pytest.raises(ValueError, match="2 sequences x 7 positions t >= 1 give 14 rows"):
        probes.LayerProbes().fit_residuals(resid, torch.zeros(2, 8))
    # cross-fitted, a probe sees the other folds: the advice counts every sequence (it said
    # "use at least 3" of 5 sequences in 2 folds, the 3 a probe must see)
    resid = torch.randn(3, 5, 8, 16, generator=torch.Generator().manual_seed(0))
    with pytest.raises(ValueError, match=r"the other 1 of 2 folds \(2 sequences\) x 7 "
                                         r"positions .* give 14 rows .* use at least 6 sequences"):
        probes.cross_fit(model, resid, torch.zeros(5, 8), folds=2)
    assert probes.cross_fit(model, torch.randn(3, 6, 8, 16), torch.randn(6, 8),
                            folds=2).preds.shape == (3, 6, 8)  # 6: 3 x 7 = 21 rows > 17


@pytest.fixture(scope="module")
def ckpt(tmp_path_factory):
    path = tmp_path_factory.mktemp("ckpt") / "soft"
    tiny_gpt().save(path, task=RegressionTask(n_dims=3, n_points=8))
    return path


FAST = ["--n-sequences", "16", "--n-probe-sequences", "16", "--metric", "error_cosine"]


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["train", "--cov", "ill-conditioned", "--condition-number", "1e12"],
         r"iclprobe train: error: --condition-number: RegressionTask.condition_number must be "
         r"a number in \[1, 1e6\]"),
        (["train", "--n-dims", "2", "--cov", "rotated", "--eigenvalues", "inf", "1"],
         r"eigenvalues must be finite and positive, got \[inf, 1.0\]"),
        (["train", "--n-dims", "2", "--cov", "rotated", "--eigenvalues", "1e12", "1"],
         "eigenvalues: condition number 1e.12 is above"),
        (["train", "--model-seed", str(2**70)], "GPTConfig.seed must be an integer seed"),
        (["train", "--task-seed", str(2**70)],
         "--task-seed: RegressionTask.seed must be an integer seed"),
        (["train", "--ln-eps", "nan"], "GPTConfig.ln_eps must be a number > 0, got nan"),
        (["train", "--ln-eps", "-1"], "--ln-eps: GPTConfig.ln_eps must be a number > 0, got -1.0"),
        (["train", "--momentum", "5"], r"TrainConfig.momentum must be a number in \[0, 1\)"),
        (["train", "--family", "pq", "--init-std", "inf"], "PQConfig.init_std must be a number"),
        (["align", "{ckpt}", "--seed", str(2**70)],
         r"AlignConfig.seed must be an integer seed in \[0, 2\*\*63\), got 1180591620717411303424"),
        (["probe", "{ckpt}", "--seed", "-3"], r"--seed: expected an integer in \[0, 2\*\*63\)"),
        (["align", "{ckpt}", "--data", "ill-conditioned", "--condition-number", "1e12"],
         "condition_number must be a number in"),
        (["align", "{ckpt}", "--n-probe-sequences", "1"], "n_probe_sequences must be an integer >= 2"),
        # the config's validator refuses, with its message; the flag only converts text
        (["align", "{ckpt}", "--n-boot", "1"],
         "--n-boot: AlignConfig.n_boot must be an integer >= 2, got 1"),
        (["align", "{ckpt}", "--confidence", "1.5"],
         r"AlignConfig.confidence must be a number in \(0, 1\), got 1.5"),
        (["align", "{ckpt}", "--device", "tpu"], r"AlignConfig.device must be one of \('cpu'"),
        (["align", "{ckpt}", "--t-min", "-1"], "AlignConfig.t_min must be an integer >= 0, got -1"),
        (["align", "{ckpt}", "--protocol", "fu"],
         r"--protocol: AlignConfig.protocol must be one of \['fu2024', 'iclprobe'\], got 'fu'"),
        (["align", "{ckpt}", "--seed", "x"], "argument --seed: invalid int value: 'x'"),
        (["train", "--optimizer", "rmsprop"], r"TrainConfig.optimizer must be one of \('adam'"),
        (["train", "--family", "lstm", "--layout", "rows"], "LSTMConfig.layout must be one of"),
    ],
)
def test_bad_values_are_one_line_errors_exit_2(ckpt, tmp_path, capsys, argv, message):
    argv = [a.format(ckpt=ckpt) for a in argv]
    if argv[0] == "train":
        argv += ["--out", str(tmp_path / "run"), "--steps", "2", "--n-layers", "1"]
    elif argv[0] == "align":
        argv[2:2] = FAST
    try:
        rc = main(argv)
    except SystemExit as exc:
        rc = exc.code
    err = capsys.readouterr().err.strip()
    assert rc == 2, err
    assert len(err.splitlines()) == 1 and "Traceback" not in err, err
    assert __import__("re").search(message, err), err
    assert not (tmp_path / "run").exists()


def test_models_are_built_from_valid_configs_only():
    assert models.GPTRegressor(GPTConfig(**GPT, ln_eps=1e-6, seed=2**63 - 1)).cfg.ln_eps == 1e-6
    assert models.PQTransformer(PQConfig(n_dims=2, init_std=0)).cfg.init_std == 0
    assert TrainConfig(momentum=0.0).momentum == 0.0
