"""Multi-process JAX runs (2 processes x 4 CPU devices, gloo collectives) against one process of
8 devices: a kill -9 of one process mid-iteration, survived by a restart of both with --resume,
ends with the same rows and params as the uninterrupted single process; per-process save_hf
shards. Async RL over HTTP on 2 processes, behind a router, with a worker and an engine killed:
tests/system/test_cluster.py."""

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import jax
import numpy as np
import pytest
from helpers import ROOT, TESTS, free_port

from jaxswe.config import load_config
from jaxswe.policy import load_policy
from jaxswe.run.metrics import read_rows
from jaxswe.stages.toy import toy_policy

TOY_RL = ROOT / "configs" / "toy-rl.yaml"
pytestmark = pytest.mark.slow


def _env(cache: Path, devices: int) -> dict[str, str]:
    """A child's environment: `devices` CPU devices, XLA's code generated at LLVM level 0 (several
    CPU processes get no compile cache, so each compiles every program cold; tests/conftest.py)."""
    return {
        **os.environ,
        "JAXSWE_TEST_CACHE": str(cache),
        "JAXSWE_COMPILE_CACHE": str(cache),
        "JAX_PLATFORMS": "cpu",
        "XLA_FLAGS": f"--xla_force_host_platform_device_count={devices} --xla_backend_optimization_level=0",
        "PYTHONPATH": str(ROOT),
    }


def _spawn(cmd: list[str], devices: int, cache: Path, log: Path) -> subprocess.Popen:
    """One child process on `devices` CPU devices, its output in the file `log` (so no pipe fills
    while the test waits on another process); the runs of a test go side by side."""
    log.parent.mkdir(parents=True, exist_ok=True)
    with log.open("w") as out:
        proc = subprocess.Popen(
            cmd, env=_env(cache, devices), stdout=out, stderr=subprocess.STDOUT, text=True
        )
    proc.log = log
    return proc


def _wait(procs: list[subprocess.Popen], timeout: float = 1500) -> list[str]:
    """Wait until every process exited 0 (once one fails or time runs out the others are killed:
    they would block in their next collective); their outputs. A failure names first the process
    that failed on its own, not the ones the test killed after it."""
    deadline = time.time() + timeout
    killed = set()
    try:
        while any(p.poll() is None for p in procs):
            if time.time() > deadline or any(p.returncode not in (None, 0) for p in procs):
                break
            time.sleep(0.5)
        if time.time() > deadline:  # where each one waits: `jaxswe` prints its threads' stacks
            for p in procs:
                if p.poll() is None:
                    p.send_signal(signal.SIGUSR1)
            time.sleep(3)
    finally:  # also when the test itself is interrupted: no process outlives it
        for i, p in enumerate(procs):
            if p.poll() is None:
                killed.add(i)
                p.kill()
                p.wait()
    outs = [p.log.read_text() for p in procs]
    failed = sorted((i for i, p in enumerate(procs) if p.returncode), key=lambda i: i in killed)
    for i in failed:
        p, why = procs[i], "killed by the test" if i in killed else f"exited {procs[i].returncode}"
        others = ", ".join(f"{procs[j].args[1:3]} {procs[j].returncode}" for j in failed if j != i)
        raise AssertionError(f"{p.args[1:3]} {why} (also: {others or 'none'}):\n{outs[i][-12000:]}")
    return outs


TOY_PIPELINE = [  # RL from the random init on the toy game: DAPO steps are taken from iteration 1
    "stages=[rl]",
    "rl.iterations=2",
    "rl.max_resample_rounds=1",  # one resampling round: iteration 1 then has an informative group
    "eval.after_stage=false",
    "logging.backends=[]",  # no TensorBoard (its torch import) in each of the 5 processes
]


def _audited(args: list[str], run_dir: Path, n: int, cache: Path, tag: str = "") -> list[subprocess.Popen]:
    """`jaxswe ARGS` over 8 CPU devices as n processes, each logging the files it writes
    (mp_audit_child.py) to run_dir/../logs_N/written_I.txt and its output to log_I{tag}.txt."""
    if n > 1:
        args = [*args, "--coordinator", f"localhost:{free_port()}", "--num-processes", str(n)]
    logs = run_dir.parent / f"logs_{n}"
    cmd = [sys.executable, str(TESTS / "mp_audit_child.py")]
    return [
        _spawn([*cmd, str(logs / f"written_{i}.txt"), *args, *(["--process-id", str(i)] if n > 1 else [])],
               8 // n, cache, logs / f"log_{i}{tag}.txt")
        for i in range(n)
    ]  # fmt: skip


def _toy_pipeline(run_dir: Path, n: int, cache: Path, *extra: str) -> list[subprocess.Popen]:
    """`jaxswe pipeline --config configs/toy-rl.yaml` (TOY_PIPELINE, then `extra`) as n processes."""
    args = ["pipeline", "--config", str(TOY_RL), "--run-dir", str(run_dir)]
    args += [a for s in TOY_PIPELINE for a in ("--set", s)] + list(extra)
    return _audited(args, run_dir, n, cache, "_resume" if extra else "")


@pytest.mark.timeout(1800)
def test_two_processes_killed_and_resumed_train_like_one_uninterrupted(tmp_path):
    """`jaxswe pipeline` (2 RL iterations with DAPO steps in each) on the toy game: as 2 processes
    x 4 CPU devices (gloo) with kill -9 of process 1 inside RL iteration 2 and both restarted with
    --resume, against 1 process x 8 devices run through. The same rows (loss, tokens trained, kept
    groups, pass rate) and final params (to 0.1% of RL's move); every iteration's row, trajectories
    and checkpoint exactly once; process 1 writes nothing but its checkpoint shards (Python's
    writes; which process writes which weight file:
    test_save_hf_from_two_processes_loads_in_transformers). No RFT stage: its SFT step is the
    DAPO step's code with another loss (the 8-device equalities are tests/train/test_train_step.py's),
    and each stage costs every process a cold compile (no cache with several CPU processes)."""
    one, two, cache = tmp_path / "one" / "run", tmp_path / "two" / "run", tmp_path / "xla"
    whole = _toy_pipeline(one, 1, cache)
    procs = _toy_pipeline(two, 2, cache)
    metrics = two / "rl" / "metrics.jsonl"
    deadline = time.time() + 900
    committed = two / "rl" / "checkpoints" / "1"  # a row can come before its checkpoint commits
    while time.time() < deadline and (len(read_rows(metrics)) < 1 or not committed.is_dir()):
        assert all(p.poll() is None for p in procs), procs[0].log.read_text()[-3000:]
        time.sleep(0.1)
    time.sleep(0.5)  # inside iteration 2
    procs[1].send_signal(signal.SIGKILL)
    procs[1].wait()
    procs[0].send_signal(signal.SIGKILL)  # what a launcher does once one process of a job died
    procs[0].wait()
    assert len(read_rows(metrics)) < 2
    outs = _wait([*whole, *_toy_pipeline(two, 2, cache, "--resume")])
    assert all("resuming RL from iteration" in out for out in outs[1:])
    rows, want = read_rows(metrics), read_rows(one / "rl" / "metrics.jsonl")
    assert [r["step"] for r in rows] == [1, 2] and all(r["optimizer_steps"] > 0 for r in rows)
    for key in ("loss", "tokens_trained", "groups_kept", "pass_rate"):
        assert [r.get(key) for r in rows] == pytest.approx([r.get(key) for r in want], rel=1e-5), key
    traj = sorted(p.name for p in (two / "rl" / "trajectories").iterdir())
    assert traj == [f"iter_{i:04d}.jsonl" for i in (1, 2)]
    steps = sorted(int(p.name) for p in (two / "rl" / "checkpoints").iterdir() if p.name.isdigit())
    assert steps[-1] == 2
    assert (two / "rl" / "summary.json").is_file()
    assert not list(two.rglob("*.tmp"))
    wrote = _written(tmp_path / "two" / "logs_2" / "written_1.txt", two)
    assert wrote and all(p.parts[1] == "checkpoints" for p in wrote), wrote
    # the params: AdamW's normalized steps turn float-order differences in near-zero gradients
    # into larger ones (seen: 1e-4 on one weight), far below what RL moved them (3e-5 of it)
    start = _flat(toy_policy(load_config(TOY_RL, TOY_PIPELINE), tmp_path / "init").params)  # the init
    a, b = (_flat(load_policy(run / "rl").params) for run in (one, two))
    assert np.linalg.norm(b - a) < 1e-3 * np.linalg.norm(a - start), np.linalg.norm(b - a)


def _flat(params) -> np.ndarray:
    return np.concatenate([np.asarray(x, np.float64).ravel() for x in jax.tree.leaves(params)])


@pytest.mark.timeout(1200)
def test_save_hf_from_two_processes_loads_in_transformers(tmp_path):
    """Each process writes only the files of its own layers (process 0 also the index and
    config.json); transformers loads the one directory with the trainer's log-probs; loaded back
    into the trainer's fsdp placement, each process reads about half the tensor bytes and gets
    the saved values. Also (same
    processes): process 0's exception in `on_main` is raised on both processes, which then go
    on in step, and host data that differ between processes are caught on both."""
    import jax.numpy as jnp
    import torch
    import transformers

    from jaxswe.model import token_logprobs
    from jaxswe.model.config import get_preset
    from jaxswe.model.params import init_params

    port = str(free_port())
    cmd = [sys.executable, str(TESTS / "mp_save_hf_child.py"), str(tmp_path)]
    _wait([_spawn([*cmd, str(i), port], 4, tmp_path / "xla", tmp_path / f"log_{i}.txt") for i in range(2)])
    written = [set(json.loads((tmp_path / f"written_{i}.json").read_text())) for i in range(2)]
    index_file = json.loads((tmp_path / "hf" / "model.safetensors.index.json").read_text())
    index = index_file["weight_map"]
    assert written[0] and written[1] and not written[0] & written[1]
    assert written[0] | written[1] == set(index.values())
    assert all(
        index[f"model.layers.1.{n}"] in written[1] for n in ("mlp.up_proj.weight", "self_attn.q_proj.bias")
    )
    assert index["model.embed_tokens.weight"] in written[0] and index["lm_head.weight"] in written[1]
    total = index_file["metadata"]["total_size"]
    reads = [json.loads((tmp_path / f"read_{i}.json").read_text()) for i in range(2)]
    assert all(r["same"] for r in reads), reads
    assert all(0.4 * total <= r["bytes_read"] <= 0.6 * total for r in reads), (total, reads)
    for i in (0, 1):
        seen = json.loads((tmp_path / f"helpers_{i}.json").read_text())
        assert seen["on_main"] == "ValueError: process 0 failed", seen
        assert seen["on_main_after"] == "still in step" and seen["same"] == "ok", seen
        assert seen["differ"].startswith("RuntimeError: x differs between process 0 and processes [1]"), seen

    config = get_preset("tiny", vocab_size=96, tie_word_embeddings=False, attention="dense")
    params = jax.tree.map(
        lambda x: x.astype(jnp.bfloat16).astype(jnp.float32), init_params(config, jax.random.key(0))
    )
    model = transformers.Qwen2ForCausalLM.from_pretrained(tmp_path / "hf", torch_dtype=torch.float32).eval()
    ids = np.random.default_rng(0).integers(0, 96, size=(2, 24))
    with torch.no_grad():
        logp = torch.log_softmax(model(torch.tensor(ids)).logits, -1).numpy()
    ref = np.zeros(ids.shape)
    ref[:, 1:] = np.take_along_axis(logp[:, :-1], ids[:, 1:, None], -1)[..., 0]
    ours = np.asarray(token_logprobs(params, config, jnp.asarray(ids)))
    np.testing.assert_allclose(ours, ref, atol=1e-4)


def _written(log: Path, run_dir: Path) -> list[Path]:
    """The files under run_dir that one process opened for writing (mp_audit_child.py's log)."""
    paths = [Path(line) for line in log.read_text().split()]
    return [p.relative_to(run_dir) for p in paths if p.is_relative_to(run_dir)]


def test_two_processes_drive_a_share_of_each_round_each_and_judge_the_same_groups(tmp_path):
    """k = 0 over servers every process reaches (`Backend.spread`): both processes run the pump,
    each drives every other episode of each round with its own engine client, and the all-gathered
    groups (resampling rounds included) are those one process judges driving them all."""
    child = [sys.executable, str(TESTS / "spread_child.py")]
    port = free_port()
    procs = [_spawn([*child, str(tmp_path / f"p{i}.json"), f"localhost:{port}", "2", str(i)], 1,
                    tmp_path / "xla", tmp_path / f"log_{i}.txt") for i in range(2)]  # fmt: skip
    procs.append(_spawn([*child, str(tmp_path / "one.json")], 1, tmp_path / "xla", tmp_path / "log_one.txt"))
    _wait(procs, timeout=300)
    p0, p1, one = (json.loads((tmp_path / f"{n}.json").read_text()) for n in ("p0", "p1", "one"))
    assert p0["spread"] and p1["spread"] and not one["spread"]
    assert p0["groups"] == p1["groups"] == one["groups"]
    assert any(len(take) > 3 for take in one["groups"])  # a resampling round ran too
    assert p0["served"] and p1["served"] and not set(p0["served"]) & set(p1["served"])
    assert sorted(p0["served"] + p1["served"]) == sorted(one["served"])
