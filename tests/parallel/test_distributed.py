"""jaxswe.distributed on one process: flag checks, cluster detection, and the helpers being
identities (the 2-process behaviour is in test_multiprocess)."""

import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import NamedSharding, PartitionSpec

from jaxswe import distributed as D
from jaxswe.cli import main
from sharding import make_mesh


@pytest.mark.parametrize(
    "args, message",
    [
        (("localhost:1234", None, None), "go together"),
        (("localhost:1234", 2, 2), "--process-id 2 must be in [0, --num-processes 2)"),
        (("localhost", 2, 0), "expected HOST:PORT"),
    ],
)
def test_bad_process_flags(args, message):
    with pytest.raises(D.DistributedError, match=re.escape(message)):
        D.initialize(*args)


def test_no_flags_no_cluster_is_one_process(monkeypatch):
    for keys in D._CLUSTER_ENV.values():
        for k in keys:
            monkeypatch.delenv(k, raising=False)
    D.initialize()  # nothing to start
    D.initialize("localhost:1234", 1, 0)
    assert jax.process_count() == 1 and D.is_main()


def test_cluster_detection(monkeypatch):
    for keys in D._CLUSTER_ENV.values():
        for k in keys:
            monkeypatch.delenv(k, raising=False)
    assert D.detected_cluster() is None
    slurm = {"SLURM_JOB_ID": "7", "SLURM_STEP_NODELIST": "n[1-2]", "SLURM_PROCID": "0", "SLURM_LOCALID": "0"}
    for k, v in slurm.items():
        monkeypatch.setenv(k, v)
    monkeypatch.setenv("SLURM_NTASKS", "1")
    assert D.detected_cluster() is None  # a one-task step is one process
    monkeypatch.setenv("SLURM_NTASKS", "16")
    assert D.detected_cluster() == "SLURM"


def test_single_process_helpers_are_identities():
    obj = {"a": [1, 2], "b": "x"}
    assert D.broadcast(obj) is obj and D.on_main(lambda: 3) == 3
    mesh = make_mesh({"fsdp": -1})
    x = jax.device_put(jnp.arange(16.0).reshape(8, 2), NamedSharding(mesh, PartitionSpec("fsdp")))
    np.testing.assert_array_equal(D.to_host(x), np.arange(16.0).reshape(8, 2))
    D.barrier("nothing to wait for")


def test_cli_process_flags_error_is_one_line(tmp_path, capsys):
    with pytest.raises(SystemExit) as exit_info:
        main(["rl", "--config", "configs/demo-cpu.yaml", "--run-dir", str(tmp_path), "--num-processes", "2"])
    assert exit_info.value.code == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and "--coordinator, --num-processes and --process-id go together" in err
