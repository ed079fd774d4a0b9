"""What a model holds, measured on the meta device: parameters, activations, the cheap bound."""

import pytest
import torch
from helpers import gpt_parameters
from torch import nn

import iclprobe._checks
from iclprobe.models import size
from iclprobe.models.config import GPTConfig, LSTMConfig, PQConfig
from iclprobe.models.gpt import GPTRegressor
from iclprobe.models.lstm import LSTMRegressor
from iclprobe.models.pq import PQTransformer
from iclprobe.tasks import RegressionTask
from iclprobe.training import TrainConfig
from iclprobe.training.memory import check_training_fits

FAMILIES = [
    (GPTRegressor, GPTConfig(n_dims=3, n_positions=8, n_layers=3, d_model=16, n_heads=2)),
    (GPTRegressor, GPTConfig(n_dims=5, n_positions=11, n_layers=4, d_model=24, n_heads=3,
                             d_mlp=7, attention="linear", layout="paired")),
    (PQTransformer, PQConfig(n_dims=4, n_layers=3, n_heads=2)),
    (PQTransformer, PQConfig(n_dims=4, n_layers=3, sparse=False, n_state=2, kernel="softmax")),
    (LSTMRegressor, LSTMConfig(n_dims=3, n_positions=8, n_layers=3, d_model=8)),
]
IDS = ["gpt-softmax", "gpt-linear-paired", "pq-sparse", "pq-dense-state", "lstm"]


@pytest.mark.parametrize(("cls", "cfg"), FAMILIES, ids=IDS)
def test_parameter_counts_are_those_of_the_built_model(cls, cfg):
    built = cls(cfg)
    real = sum(p.numel() for p in built.parameters())
    assert real == sum(t.numel() for t in built.state_dict().values())  # no buffers saved
    assert size.parameter_count(cls, cfg) == real
    assert size.parameter_bound(cls, cfg) == real  # the layers are alike: extrapolation exact


def test_the_gpt_count_is_its_closed_form():
    for cfg in (FAMILIES[0][1], FAMILIES[1][1], GPTConfig(n_dims=8, n_positions=40, n_layers=7)):
        assert size.parameter_count(GPTRegressor, cfg) == gpt_parameters(cfg)


class TwoLayer(nn.Module):
    """x -> relu(x A) B: a backward pass needs x and relu's output (each of the 2 linears'
    inputs), nothing else."""

    def __init__(self, cfg):
        super().__init__()
        self.cfg = cfg
        self.a, self.b = nn.Linear(cfg.n_dims, 7), nn.Linear(7, 1)

    def forward(self, xs, ys, last_only=False):
        return self.b(torch.relu(self.a(xs)))[..., 0]


def test_saved_activations_are_counted_once_each_without_the_weights():
    cfg = RegressionTask(n_dims=3, n_points=4)  # anything with n_dims
    assert size.count_activations(TwoLayer(cfg), 5, 4) == 5 * 4 * 3 + 5 * 4 * 7
    assert size.count_activations(size.build_meta(TwoLayer, cfg), 5, 4) == 5 * 4 * (3 + 7)


@pytest.mark.parametrize(("cls", "cfg"), FAMILIES, ids=IDS)
def test_activations_on_the_meta_device_match_a_real_forward(cls, cfg):
    meta = size.count_activations(size.build_meta(cls, cfg), 4, 8)
    real = size.count_activations(cls(cfg), 4, 8)
    if cls is LSTMRegressor:  # the CPU's fused LSTM kernel saves its gates' workspace too
        assert 0 < meta < real
    elif cfg in (FAMILIES[0][1],):  # the CPU's fused softmax attention keeps no weights
        assert real <= meta <= 1.25 * real
    else:
        assert meta == real


def test_an_absurd_depth_is_refused_on_the_bound_without_building_it(monkeypatch):
    built = []
    original = size.build_meta

    def recording(cls, cfg):
        built.append(cfg.n_layers)
        return original(cls, cfg)

    monkeypatch.setattr(size, "build_meta", recording)
    huge = GPTConfig(n_dims=8, n_positions=24, n_layers=10**6, d_model=64, n_heads=4)
    need = 2 * 4 * gpt_parameters(huge) / 2**30
    with pytest.raises(ValueError, match=rf"loading x: a model with {gpt_parameters(huge):,} "
                                         r"parameters \(n_dims=8, n_positions=24, n_layers=1000000"
                                         r", d_model=64, n_heads=4, d_mlp=None\) needs at least "
                                         rf"{need:.3g} GiB of memory, but 16 GiB are available"):
        size.check_model_fits(GPTRegressor, huge, "loading x", available=16 * 2**30)
    assert max(built) == 2
    built.clear()
    small = GPTConfig(n_dims=8, n_positions=24, n_layers=5)
    size.check_model_fits(GPTRegressor, small, "loading y", available=16 * 2**30)
    assert built == [1, 2, 5]  # the bound, then the model itself


def test_training_memory_counts_adam_activations_and_data(monkeypatch):
    cfg, task = FAMILIES[2][1], RegressionTask(n_dims=4, n_points=9)
    recipe = TrainConfig(batch_size=6, loss="all")
    params = size.parameter_count(PQTransformer, cfg)
    assert params == 2 * 3 * 2 * 4 * 4  # P and Q blocks: 2 per head and layer, [d, d] each
    kept = size.count_activations(size.build_meta(PQTransformer, cfg), 6, 9)
    need = (4 * params + kept + 2 * 6 * 9 * 5 * 2) * 4  # weights, grads, 2 moments; data
    check_training_fits(PQTransformer, cfg, task, recipe, available=need)
    with pytest.raises(ValueError, match=r"^training: a model with 192 parameters \(n_dims=4, "
                                         r"n_layers=3, n_heads=2, n_state=0, d_k=None\) needs at least"):
        check_training_fits(PQTransformer, cfg, task, recipe, available=need - 1)
    monkeypatch.setattr(iclprobe._checks, "available_memory", lambda: None)  # unknown: passes
    check_training_fits(PQTransformer, cfg, task, TrainConfig(batch_size=10**9))


def test_activations_too_large_to_describe_are_a_refusal_not_a_crash():
    cfg = GPTConfig(n_dims=8, n_positions=10**6, n_layers=2)
    model = size.build_meta(GPTRegressor, cfg)
    assert size.count_activations(model, 10**6, 10**6) == size.OVERFLOW
    with pytest.raises(ValueError, match="needs at least"):
        check_training_fits(GPTRegressor, cfg, RegressionTask(n_dims=8, n_points=10**6),
                            TrainConfig(batch_size=10**6), available=16 * 2**30)


def test_an_oracle_sized_on_meta_holds_what_a_built_one_holds():
    # On the meta device an oracle draws nothing (its rotation and distractors come from a
    # seeded generator, which torch serves slowly there) but keeps their shapes.
    from iclprobe.constructions.oracle import LearnerOracle, oracle
    built = oracle("gd", 4, 3, n_noise=5, lr=0.1)
    held = size.count_held(built)
    assert held == 10 * 10 + 5 * 4 + 5  # rotation [d + 1 + n_noise]^2, W [n_noise, d], c
    assert size.measure(LearnerOracle, built.cfg, held=True)[0] == held
    assert size.parameter_bound(PQTransformer, PQConfig(n_dims=4, n_layers=3)) == \
        sum(p.numel() for p in PQTransformer(PQConfig(n_dims=4, n_layers=3)).parameters())
