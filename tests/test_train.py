import json
import math
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from helpers import one_line_error, tiny_gpt, wait_until
from safetensors.torch import load_file

from iclprobe import models, tasks, training
from iclprobe.algorithms.prefix import ols_predictions
from iclprobe.models import PQConfig, PQTransformer
from iclprobe.training import TrainConfig
from iclprobe.training.loop import (
    batch_for_step,
    check_setup,
    clip_gradients,
    loss_of,
)

ROOT = Path(__file__).resolve().parents[1]
TASK = tasks.RegressionTask(n_dims=3, n_points=8)


def paired_linear():
    return tiny_gpt("linear", "paired")


def test_schedules_closed_forms():
    step = TrainConfig(steps=100, schedule="step", step_every=10)
    assert [step.lr_factor(s) for s in (0, 9, 10, 25, 99)] == [1, 1, 0.5, 0.25, 0.5**9]
    cos = TrainConfig(steps=110, schedule="cosine", warmup_steps=10)
    assert cos.lr_factor(0) == pytest.approx(0.1) and cos.lr_factor(9) == pytest.approx(1.0)
    assert cos.lr_factor(60) == pytest.approx(0.5)
    assert cos.lr_factor(109) == pytest.approx(0.5 * (1 + math.cos(math.pi * 99 / 100)))
    assert TrainConfig().lr_factor(12345) == 1.0


def test_clipping():
    a = torch.nn.Parameter(torch.zeros(2, 3, 3))
    b = torch.nn.Parameter(torch.zeros(4))
    a.grad = torch.stack([torch.full((3, 3), 1.0), torch.full((3, 3), 0.01)])
    b.grad = torch.full((4,), 2.0)
    clip_gradients([a, b], TrainConfig(clip="per-matrix", clip_norm=1.0))
    assert a.grad[0].norm() == pytest.approx(1.0) and a.grad[1].norm() == pytest.approx(0.03)
    assert b.grad.norm() == pytest.approx(1.0)
    a.grad = torch.full((2, 3, 3), 1.0)
    b.grad = torch.full((4,), 2.0)
    clip_gradients([a, b], TrainConfig(clip="global", clip_norm=0.5))
    total = torch.cat([a.grad.flatten(), b.grad.flatten()]).norm()
    assert total == pytest.approx(0.5, rel=1e-4)


def test_data_is_a_function_of_seed_rank_step():
    cfg = TrainConfig(resample_every=5, seed=3)
    b0, b4, b5 = (batch_for_step(TASK, cfg, s, (0,)) for s in (0, 4, 5))
    assert torch.equal(b0.xs, b4.xs) and not torch.equal(b0.xs, b5.xs)
    assert not torch.equal(b0.xs, batch_for_step(TASK, cfg, 0, (1,)).xs)
    both = batch_for_step(TASK, cfg, 7, (0, 1))
    assert torch.equal(both.xs[64:], batch_for_step(TASK, cfg, 7, (1,)).xs)
    fixed = TrainConfig(resample_every=0)
    assert torch.equal(batch_for_step(TASK, fixed, 0, (0,)).xs,
                       batch_for_step(TASK, fixed, 999, (0,)).xs)
    cur = TrainConfig(curriculum_every=10, curriculum_dims=(1, 1), curriculum_points=(4, 2))
    b = batch_for_step(TASK, cur, 15, (0,))
    assert b.xs.shape[1] == 6 and torch.all(b.xs[..., 2:] == 0) and b.xs[..., 1].abs().sum() > 0
    assert cur.curriculum(1000, 3, 8) == (3, 8)
    # the task's own truncation holds with and without a curriculum
    truncated = tasks.RegressionTask(n_dims=3, n_points=8, active_dims=2)
    for c in (TrainConfig(), cur):
        b = batch_for_step(truncated, c, 5000, (0,))
        assert torch.all(b.xs[..., 2:] == 0) and b.xs[..., 1].abs().sum() > 0


def test_loss_positions():
    preds, ys = torch.zeros(2, 4), torch.tensor([[1.0, 1, 1, 2], [1, 1, 1, 4]])
    assert loss_of(preds, ys, TrainConfig(loss="last")).item() == pytest.approx(10.0)
    assert loss_of(preds, ys, TrainConfig(loss="all")).item() == pytest.approx(26 / 8)


@pytest.mark.parametrize("optimizer", ["adam", "adamw", "sgd"])
@pytest.mark.slow
def test_first_order_optimizers_reduce_the_loss(optimizer, tmp_path):
    model = paired_linear()
    lr = 0.05 if optimizer == "sgd" else 3e-3
    cfg = TrainConfig(steps=150, optimizer=optimizer, lr=lr, log_every=50, batch_size=128,
                      clip="global", schedule="cosine", warmup_steps=10)
    result = training.train(model, TASK, cfg, out=tmp_path / "run", progress=False)
    losses = [row["loss"] for row in result.history]
    first = loss_of(paired_linear()(*_eval_batch()), _eval_batch()[1], cfg).item()
    last = loss_of(model(*_eval_batch()), _eval_batch()[1], cfg).item()
    assert last < 0.85 * first, (first, last, losses)
    rows = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [50, 100, 150]
    # The logged OLS loss is OLS's error on that step's own batch.
    batch = batch_for_step(TASK, cfg, 149, (0,))
    ols = loss_of(ols_predictions(batch.xs, batch.ys), batch.ys, cfg).item()
    assert rows[-1]["ols_loss"] == pytest.approx(ols, rel=1e-5)
    assert rows[-1]["normalized_loss"] == pytest.approx(rows[-1]["loss"] / 3)


def _eval_batch():
    b = TASK.sample(256, generator=99)
    return b.xs, b.ys


def test_lbfgs_on_a_fixed_dataset_and_pq_constraints():
    task = tasks.RegressionTask(n_dims=3, n_points=11)
    model = PQTransformer(PQConfig(n_dims=3, n_layers=1, init_std=0.1))
    cfg = TrainConfig(steps=5, optimizer="lbfgs", lr=1.0, resample_every=0, loss="last",
                      batch_size=500, zero_b=True, log_every=1)
    result = training.train(model, task, cfg, progress=False)
    assert result.history[-1]["loss"] < 0.7 * result.history[0]["loss"]
    assert torch.all(model.blocks[0].attn.B == 0)
    dense = PQTransformer(PQConfig(n_dims=3, n_layers=2, sparse=False, init_std=0.1))
    training.train(dense, task, TrainConfig(steps=20, project_sparse=True, loss="last",
                                          lr=1e-2), progress=False)
    p, q = dense.matrices()
    assert torch.all(p[..., :3, 3] == 0) and torch.all(p[..., 3, :3] == 0)
    assert torch.all(p[..., 3, 3] == 1) and torch.all(q[..., 3, :] == 0)
    assert torch.all(q[..., :, 3] == 0) and q[..., :3, :3].abs().sum() > 0


@pytest.mark.parametrize(
    ("model", "cfg", "match"),
    [
        (lambda: tiny_gpt(n_positions=5), TrainConfig(), "task.n_points=8 is more than the "
                                                         "model's n_positions=5"),
        (lambda: PQTransformer(PQConfig(n_dims=3)), TrainConfig(curriculum_every=10),
         "curriculum_every does not apply to PQTransformer"),
        (paired_linear, TrainConfig(zero_b=True), "zero_b does not apply to GPTRegressor"),
        (lambda: PQTransformer(PQConfig(n_dims=3)), TrainConfig(project_sparse=True),
         "project_sparse needs a dense PQ model"),
        (paired_linear, TrainConfig(optimizer="lbfgs"), "set resample_every=0, got 1"),
        (lambda: tiny_gpt(n_dims=4), TrainConfig(), "task.n_dims=3 but the model has n_dims=4"),
    ],
)
def test_bad_setups_fail_before_training(model, cfg, match):
    with pytest.raises(ValueError, match=match):
        check_setup(model(), TASK, cfg)


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        (dict(optimizer="rmsprop"), r"optimizer must be one of \('adam', 'adamw', 'sgd', 'lbfgs'\)"),
        (dict(lr=0.0), r"lr must be a number in \(0, 1e20\], got 0.0"),
        (dict(steps=0), "steps must be a positive integer, got 0"),
        (dict(betas=(0.9, 1.5)), "betas must be two numbers in"),
        (dict(schedule="linear"), "schedule must be one of"),
        (dict(warmup_steps=5), "warmup_steps applies to schedule='cosine' only"),
        (dict(clip="value"), "clip must be one of"),
    ],
)
def test_bad_train_configs(kwargs, match):
    with pytest.raises(ValueError, match=match):
        TrainConfig(**kwargs)


def test_existing_run_is_not_overwritten(tmp_path):
    cfg = TrainConfig(steps=2, log_every=1)
    training.train(paired_linear(), TASK, cfg, out=tmp_path / "r", progress=False)
    with pytest.raises(FileExistsError, match="already holds a run"):
        training.train(paired_linear(), TASK, cfg, out=tmp_path / "r", progress=False)
    with pytest.raises(ValueError, match=r"TrainConfig fields differ from the run's \(lr: run "
                                         r"0.001, given 0.1\)"):
        training.train(paired_linear(), TASK, TrainConfig(steps=4, lr=0.1), out=tmp_path / "r",
                     resume=True, progress=False)


TRAIN_ARGS = ["--n-dims", "3", "--n-points", "8", "--n-layers", "2", "--d-model", "16",
              "--n-heads", "2", "--layout", "paired", "--attention", "linear",
              "--batch-size", "32", "--log-every", "10", "--lr", "0.003"]


def _cli(out, *extra, env=None):
    return [sys.executable, "-m", "iclprobe", "train", "--out", str(out), *TRAIN_ARGS, *extra]


@pytest.mark.slow  # three training subprocesses
def test_sigkill_and_resume_is_bitwise_identical(tmp_path):
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    steps = ["--steps", "400", "--checkpoint-every", "25"]
    subprocess.run(_cli(tmp_path / "full", *steps), check=True, env=env, capture_output=True)
    proc = subprocess.Popen(_cli(tmp_path / "killed", *steps), env=env,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    trainer = tmp_path / "killed" / "checkpoint" / "train.json"
    wait_until(trainer.exists, proc)
    time.sleep(0.3)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    state = torch.load(tmp_path / "killed" / "checkpoint" / "trainer.pt", weights_only=True)
    assert 0 < state["step"] < 400, "the run was not interrupted mid-way"
    resumed = subprocess.run([sys.executable, "-m", "iclprobe", "train", "--out",
                              str(tmp_path / "killed"), "--resume"], env=env,
                             capture_output=True, text=True)
    assert resumed.returncode == 0, resumed.stderr
    full = load_file(str(tmp_path / "full" / "checkpoint" / "model.safetensors"))
    again = load_file(str(tmp_path / "killed" / "checkpoint" / "model.safetensors"))
    assert full.keys() == again.keys()
    for name in full:
        assert torch.equal(full[name], again[name]), name
    steps_logged = [json.loads(line)["step"] for line in
                    (tmp_path / "killed" / "metrics.jsonl").read_text().splitlines()]
    assert steps_logged == list(range(10, 401, 10))


def test_cli_train_errors_exit_2(tmp_path):
    from iclprobe.cli import main

    assert main(["train", "--out", str(tmp_path / "x"), "--optimizer", "rmsprop"]) == 2
    assert main(["train", "--out", str(tmp_path / "x"), "--family", "pq", "--layout",
                 "paired"]) == 2
    assert main(["train", "--out", str(tmp_path / "none"), "--resume"]) == 2
    assert not (tmp_path / "x").exists()


def test_ctrl_c_in_train_names_the_checkpoint_it_resumes_from(tmp_path, capsys, monkeypatch):
    """The hint named only the step reached, not the older checkpoint a resume starts at."""
    from iclprobe.cli import main
    from iclprobe.training import loop

    real, calls = loop._optimizer_step, []

    def step(*args, **kwargs):
        calls.append(1)
        if len(calls) == 7:  # during step 7: 6 done, the last checkpoint at step 4
            raise KeyboardInterrupt
        return real(*args, **kwargs)

    monkeypatch.setattr(loop, "_optimizer_step", step)
    out = tmp_path / "run"
    assert main(["train", *TRAIN_ARGS, "--steps", "20", "--checkpoint-every", "4",
                 "--out", str(out)]) == 130
    err = capsys.readouterr().err.strip()  # its last line, wrapped within 100 columns
    err = " ".join(err[err.index("iclprobe train: interrupted"):].split())
    assert err == (f"iclprobe train: interrupted after step 6; continue with: iclprobe train "
                   f"--out {out} --resume (from its checkpoint at step 4)"), err


@pytest.mark.slow
def test_torchrun_ddp_matches_single_process(tmp_path):
    dump = tmp_path / "dump"
    dump.mkdir()
    args = [*TRAIN_ARGS, "--steps", "30", "--checkpoint-every", "10"]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "MASTER_ADDR": "127.0.0.1"}
    run = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--nproc_per_node=2",
                          "--standalone",
                          str(ROOT / "tests" / "ddp_worker.py"), str(tmp_path / "run"),
                          str(dump), *args], env=env, capture_output=True, text=True)
    assert run.returncode == 0, run.stderr[-3000:]
    r0, r1 = (load_file(str(dump / f"rank{r}.safetensors")) for r in (0, 1))
    for name in r0:
        assert torch.equal(r0[name], r1[name]), name
    # Only rank 0 wrote; its checkpoint is the final model.
    saved = load_file(str(tmp_path / "run" / "checkpoint" / "model.safetensors"))
    assert all(torch.equal(saved[k], r0[k]) for k in r0)
    single = paired_linear_from_cli_defaults()
    cfg = TrainConfig(steps=30, batch_size=32, log_every=10, lr=0.003)
    training.train(single, tasks.RegressionTask(n_dims=3, n_points=8), cfg, data_ranks=(0, 1),
                 progress=False)
    for name, value in single.state_dict().items():
        torch.testing.assert_close(value, r0[name], atol=1e-5, rtol=0)


def paired_linear_from_cli_defaults():
    return models.GPTRegressor(models.GPTConfig(n_dims=3, n_positions=8, n_layers=2, d_model=16,
                                                n_heads=2, layout="paired", attention="linear"))


# ---------------------------------------------------------------- nothing lost, one line
def test_a_diverging_run_stops_and_keeps_its_last_finite_checkpoint(tmp_path, capsys):
    from iclprobe.cli import main

    cfg = TrainConfig(steps=50, optimizer="sgd", lr=1.0, log_every=1, checkpoint_every=2)
    with pytest.raises(training.TrainingDiverged, match=r"diverged at step 5: the loss is nan "
                       r".*the last checkpoint \(step 4\) in .*checkpoint is kept"):
        training.train(paired_linear(), TASK, cfg, out=tmp_path / "r", progress=False)
    weights = load_file(str(tmp_path / "r" / "checkpoint" / "model.safetensors"))
    assert all(torch.isfinite(w).all() for w in weights.values())
    state = torch.load(tmp_path / "r" / "checkpoint" / "trainer.pt", weights_only=True)
    assert state["step"] == 4
    rows = [json.loads(x) for x in (tmp_path / "r" / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [1, 2, 3, 4]
    assert all(math.isfinite(r["loss"]) for r in rows)
    # the command line: one line naming the step, exit status 1
    args = ["train", "--out", str(tmp_path / "cli"), *TRAIN_ARGS, "--optimizer", "sgd",
            "--lr", "10", "--steps", "50", "--checkpoint-every", "2"]
    assert main(args) == 1
    one_line_error(capsys, "iclprobe train: error: training diverged at step", "is kept")


def test_one_trainer_per_run_directory_and_a_killed_holder_frees_it(tmp_path):
    run = tmp_path / "run"
    run.mkdir()
    holder = subprocess.Popen(
        [sys.executable, "-c", "import fcntl, sys, time; fh = open(sys.argv[1], 'a'); "
         "fcntl.flock(fh, fcntl.LOCK_EX); print('held', flush=True); time.sleep(600)",
         str(run / ".iclprobe.lock")], stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "held"
        with pytest.raises(training.RunBusyError, match="in use by another trainer"):
            training.train(paired_linear(), TASK, TrainConfig(steps=2), out=run, progress=False)
        assert sorted(p.name for p in run.iterdir()) == [".iclprobe.lock"]  # nothing written
    finally:
        holder.kill()
        holder.wait()
    result = training.train(paired_linear(), TASK, TrainConfig(steps=2, log_every=1), out=run,
                          progress=False)
    assert [r["step"] for r in result.history] == [1, 2]


@pytest.mark.slow
def test_a_fresh_run_after_a_kill_before_the_first_checkpoint_starts_a_clean_log(tmp_path):
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    out = tmp_path / "run"
    proc = subprocess.Popen(_cli(out, "--steps", "100000", "--checkpoint-every", "0",
                                 "--log-every", "1"), env=env, stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL)
    metrics = out / "metrics.jsonl"
    wait_until(lambda: metrics.exists() and metrics.stat().st_size >= 200, proc)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    assert not (out / "checkpoint").exists() and metrics.stat().st_size >= 200
    with pytest.raises(FileExistsError, match="non-empty directory that iclprobe did not"):
        training.train(paired_linear(), TASK, TrainConfig(steps=3), out=tmp_path,
                     progress=False)  # tmp_path is not a run directory
    result = training.train(paired_linear(), TASK, TrainConfig(steps=3, log_every=1), out=out,
                          progress=False)
    rows = [json.loads(x) for x in metrics.read_text().splitlines()]
    assert [r["step"] for r in rows] == [1, 2, 3]
    assert [r["loss"] for r in rows] == [r["loss"] for r in result.history]


def test_a_run_with_a_checkpoint_is_replaced_only_with_overwrite(tmp_path, capsys):
    from iclprobe.cli import main

    out = tmp_path / "r"
    training.train(paired_linear(), TASK, TrainConfig(steps=4, log_every=1), out=out,
                 progress=False)
    (out / "probes").mkdir()  # iclprobe's probes of this run may stay inside
    probes_marker = '{"kind": "probes", "files": []}'
    (out / "probes" / ".iclprobe").write_text(probes_marker)
    assert main(["train", "--out", str(out), *TRAIN_ARGS, "--steps", "2"]) == 2
    one_line_error(capsys, "already holds a run", "--overwrite")
    assert main(["train", "--out", str(out), "--resume", "--overwrite"]) == 2
    one_line_error(capsys, "--overwrite starts a fresh run")
    (out / "notes.txt").write_text("mine")
    assert main(["train", "--out", str(out), *TRAIN_ARGS, "--steps", "2", "--overwrite"]) == 2
    one_line_error(capsys, "files that iclprobe did not write (notes.txt)")
    (out / "notes.txt").unlink()
    assert main(["train", "--out", str(out), *TRAIN_ARGS, "--steps", "2", "--overwrite"]) == 0
    steps = [json.loads(x)["step"] for x in (out / "metrics.jsonl").read_text().splitlines()]
    assert steps == [2] and torch.load(out / "checkpoint" / "trainer.pt",
                                       weights_only=True)["step"] == 2


def test_resume_of_a_finished_run_or_below_its_steps_says_so(tmp_path, capsys):
    from iclprobe.cli import main

    out = tmp_path / "r"
    assert main(["train", "--out", str(out), *TRAIN_ARGS, "--steps", "4", "--log-every",
                 "2"]) == 0
    capsys.readouterr()
    weights = (out / "checkpoint" / "model.safetensors").read_bytes()
    assert main(["train", "--out", str(out), "--resume"]) == 0
    assert "nothing to do: the run in" in capsys.readouterr().out
    assert main(["train", "--out", str(out), "--resume", "--steps", "3"]) == 2
    one_line_error(capsys, "has done 4 steps, more than steps=3")
    assert (out / "checkpoint" / "model.safetensors").read_bytes() == weights
    steps = [json.loads(x)["step"] for x in (out / "metrics.jsonl").read_text().splitlines()]
    assert steps == [2, 4]


@pytest.mark.parametrize("damage", ["truncated", "pickle", "not-a-state"])
def test_a_bad_trainer_state_is_one_line_naming_the_file(tmp_path, capsys, damage):
    import pickle

    from iclprobe.cli import main

    out = tmp_path / "r"
    assert main(["train", "--out", str(out), *TRAIN_ARGS, "--steps", "2"]) == 0
    trainer = out / "checkpoint" / "trainer.pt"
    if damage == "truncated":
        trainer.write_bytes(trainer.read_bytes()[:200])
    elif damage == "pickle":
        trainer.write_bytes(pickle.dumps({"step": 2, "optimizer": os.system}))
    else:
        torch.save({"step": "ten"}, trainer)
    capsys.readouterr()
    assert main(["train", "--out", str(out), "--resume", "--steps", "4"]) == 2
    err = one_line_error(capsys, "iclprobe train: error:", str(trainer))
    assert "weights_only" not in err


def test_no_message_advises_turning_the_pickle_check_off(tmp_path):
    import pickle

    evil = tmp_path / "evil.pt"
    evil.write_bytes(pickle.dumps({"allparam": os.system}))
    with pytest.raises(models.CheckpointError, match="evil.pt: truncated, corrupt or unsafe") as e:
        models.load_ahn(evil)
    assert "weights_only" not in str(e.value)
    for path in ROOT.rglob("*.py"):
        if "tests" not in path.parts:
            assert "weights_only=False" not in path.read_text(), path


def test_a_torn_last_metrics_line_is_dropped_on_resume(tmp_path, caplog):
    out = tmp_path / "r"
    cfg = TrainConfig(steps=10, log_every=5)
    training.train(paired_linear(), TASK, cfg, out=out, progress=False)
    metrics = out / "metrics.jsonl"
    with open(metrics, "a") as fh:
        fh.write('{"step": 15, "lo')  # killed mid-write
    with caplog.at_level("WARNING"):
        training.train(paired_linear(), TASK, TrainConfig(steps=20, log_every=5), out=out,
                     resume=True, progress=False)
    assert f"{metrics}: dropping 1 torn line(s) (line 3 of 3)" in caplog.text
    assert [json.loads(x)["step"] for x in metrics.read_text().splitlines()] == [5, 10, 15, 20]


def test_device_cuda_without_cuda_is_one_line(tmp_path, capsys, monkeypatch):
    from iclprobe.cli import main

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)  # also on a GPU machine
    model = paired_linear()
    model.save(tmp_path / "ck", task=TASK)
    for argv in (["train", "--out", str(tmp_path / "t"), "--device", "cuda"],
                 ["probe", str(tmp_path / "ck"), "--device", "cuda"],
                 ["align", str(tmp_path / "ck"), "--device", "cuda"]):
        assert main(argv) == 2
        one_line_error(capsys, "cuda")
    assert not (tmp_path / "t").exists()


@pytest.mark.slow
def test_ctrl_c_exits_130_saying_how_to_resume(tmp_path):
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    out = tmp_path / "run"
    # A shell's background job (`.ci/run &`) ignores SIGINT, and Python keeps an ignored
    # SIGINT ignored: give the trainer the default disposition, as a terminal would.
    proc = subprocess.Popen(_cli(out, "--steps", "100000", "--checkpoint-every", "20"), env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    trainer = out / "checkpoint" / "train.json"
    wait_until(trainer.exists, proc)
    proc.send_signal(signal.SIGINT)
    stdout, stderr = proc.communicate()
    assert proc.returncode == 130, stderr
    said = stderr[stderr.rindex("iclprobe train: interrupted"):]  # wrapped in 100 columns
    assert "Traceback" not in stderr, stderr
    assert f"iclprobe train --out {out} --resume" in " ".join(said.split())
    resumed = subprocess.run([sys.executable, "-m", "iclprobe", "train", "--out", str(out),
                              "--resume", "--steps", "60"], env=env, capture_output=True,
                             text=True)
    assert resumed.returncode == 0, resumed.stderr
