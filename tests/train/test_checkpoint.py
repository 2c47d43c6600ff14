import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from jaxswe.run.checkpoint import CheckpointError, Checkpoints, find_checkpoint_dir


def _state(v):
    params = {"w": jnp.full((3, 4), v, jnp.bfloat16), "b": jnp.full((4,), v, jnp.float32)}
    return {"params": params, "opt_state": optax.adamw(1e-3).init(params)}


def test_restore_only_params(tmp_path):
    ck = Checkpoints(tmp_path / "c")
    ck.save(3, _state(3.0), {"iteration": 3})
    items, meta = ck.restore(3, {"params": _state(0.0)["params"]})
    assert set(items) == {"params"} and meta == {"iteration": 3}
    np.testing.assert_array_equal(np.asarray(items["params"]["w"], np.float32), 3.0)


def test_save_restore_and_fallback_on_corruption(tmp_path, capsys):
    ck = Checkpoints(tmp_path / "checkpoints")
    ck.save(1, _state(1.0), {"iteration": 1, "history": {"t": [1, 0]}})
    ck.save(2, _state(2.0), {"iteration": 2, "history": {"t": [1, 0, 1]}})
    step, state, meta = ck.restore_latest(_state(0.0))
    assert step == 2 and meta["history"]["t"] == [1, 0, 1]
    assert state["params"]["w"].dtype == jnp.bfloat16
    np.testing.assert_array_equal(np.asarray(state["params"]["b"]), 2.0)
    assert jax.tree.structure(state) == jax.tree.structure(_state(0.0))
    for f in (tmp_path / "checkpoints" / "2" / "params").rglob("*"):
        if f.is_file():
            f.write_bytes(b"garbage")
    step, state, meta = Checkpoints(tmp_path / "checkpoints").restore_latest(_state(0.0))
    assert step == 1 and meta["iteration"] == 1
    assert "unreadable" in capsys.readouterr().err
    assert find_checkpoint_dir(tmp_path) == (tmp_path / "checkpoints").absolute()


def test_missing_checkpoint_is_user_error(tmp_path):
    with pytest.raises(CheckpointError, match="no checkpoint"):
        find_checkpoint_dir(tmp_path / "nowhere")
    assert Checkpoints(tmp_path / "empty").restore_latest(_state(0.0)) is None


def test_async_save_returns_before_commit_and_restores_what_was_saved(tmp_path):
    ck = Checkpoints(tmp_path / "c")
    n = 32 * 2**20  # 128 MiB: the write commits well after save returns
    big = {"params": {"w": jnp.arange(n, dtype=jnp.float32)}}
    ck.save(1, big, {"iteration": 1}, wait=False)
    assert not (tmp_path / "c" / "1").exists()  # still being written under a temporary name
    big["params"]["w"].delete()  # what a donating train step does: save copied it to host already
    assert ck.steps() == [1]  # waits for the commit
    items, meta = ck.restore(1, {"params": {"w": jnp.zeros(n, jnp.float32)}})
    np.testing.assert_array_equal(np.asarray(items["params"]["w"]), np.arange(n, dtype=np.float32))
    assert meta == {"iteration": 1}
    ck.close()
