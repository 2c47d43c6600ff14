"""Resume past corrupt checkpoints: unreadable steps are moved aside, the newest good one is used,
the next save of that step works, and a directory with no readable step is an error (no silent restart)."""

import jax
import jax.numpy as jnp
import pytest

from jaxswe.run.checkpoint import CheckpointError, Checkpoints


def _items(value: float) -> dict:
    return {"params": {"w": jnp.full((4,), value, jnp.float32)}}


def _corrupt(step_dir):
    """Garbage in every data file of a step (what a torn write or a bad disk leaves)."""
    for f in step_dir.rglob("*"):
        if f.is_file() and f.parent.name == "d":
            f.write_bytes(b"\0garbage" * 8)


def test_corrupt_latest_step_is_moved_aside_and_the_previous_one_used(tmp_path, capsys):
    ckpts = Checkpoints(tmp_path / "checkpoints", max_to_keep=None)
    for step in (1, 2, 3):
        ckpts.save(step, _items(float(step)), {"step": step})
    _corrupt(tmp_path / "checkpoints" / "3")
    abstract = jax.eval_shape(lambda: _items(0.0))
    step, items, meta = ckpts.restore_latest(abstract)
    assert (step, meta, float(items["params"]["w"][0])) == (2, {"step": 2}, 2.0)
    assert "checkpoints/3 is unreadable" in capsys.readouterr().err
    assert ckpts.steps() == [1, 2] and len(list((tmp_path / "checkpoints" / "unreadable").iterdir())) == 1
    ckpts.save(3, _items(3.5), {"step": 3})  # iteration 3 runs again and saves: no StepAlreadyExistsError
    assert float(ckpts.restore_latest(abstract)[1]["params"]["w"][0]) == 3.5


def test_every_step_unreadable_is_an_error(tmp_path):
    ckpts = Checkpoints(tmp_path / "checkpoints", max_to_keep=None)
    for step in (1, 2):
        ckpts.save(step, _items(float(step)), {"step": step})
        _corrupt(tmp_path / "checkpoints" / str(step))
    with pytest.raises(CheckpointError, match="no checkpoint is readable"):
        ckpts.restore_latest(jax.eval_shape(lambda: _items(0.0)))
    assert Checkpoints(tmp_path / "empty").restore_latest({}) is None  # nothing saved yet: a fresh start
