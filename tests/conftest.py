"""Test-suite setup: 8 fake CPU devices for sharding tests, float32 matmuls at full precision and
fast XLA compiles. A test that runs `jaxswe` as a user does runs it without these (`helpers.user_env`)."""

import os
import subprocess
import sys
import tempfile

from helpers import ROOT, user_env

# The suite's programs are tiny, so compiling them is most of their cost: XLA's CPU code is
# generated at LLVM optimization level 0 (slower code, no fast-math at either level; every
# numerical test holds at it) with one thread per op (the workers share few cores, where intra-op
# threads only take cycles from each other). tests/train and tests/model, 2 workers on 2 cores:
# 295 s -> 146 s (docs/performance.md, "CI time").
os.environ.setdefault(
    "XLA_FLAGS",
    "--xla_force_host_platform_device_count=8 --xla_cpu_multi_thread_eigen=false "
    "--xla_backend_optimization_level=0",
)
os.environ.setdefault("JAX_PLATFORMS", "cpu")

import jax  # noqa: E402
import pytest  # noqa: E402

jax.config.update("jax_default_matmul_precision", "highest")

# One XLA compile cache for a whole run, shared by both workers and the `jaxswe` processes tests
# start: the many tests that compile the same tiny programs compile them once.
_XLA_CACHE = os.environ.setdefault(
    "JAXSWE_COMPILE_CACHE", os.path.join(tempfile.gettempdir(), f"jaxswe-tests-xla-{os.getuid()}")
)
jax.config.update("jax_compilation_cache_dir", _XLA_CACHE)
jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.2)


# In CI every prerequisite is installed (.ci/run starts a Docker engine, builds the base image and
# lays ../shared beside the checkout): a test skipped for lacking one fails there instead.
_CI_REQUIRED = ("Docker engine", "not built", "shared repositories missing", "chromium not installed",
                "the swebench extra")  # fmt: skip


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    report = (yield).get_result()
    if os.environ.get("CI") == "true" and report.skipped and call.excinfo is not None:
        reason = str(call.excinfo.value)
        if any(r in reason for r in _CI_REQUIRED):
            report.outcome = "failed"
            report.longrepr = f"skipped in CI, where this prerequisite must exist: {reason}"


@pytest.fixture(scope="session")
def shared_dir(tmp_path_factory, worker_id):
    """A directory all of the session's xdist workers share (what one builds under a FileLock there,
    the others read)."""
    base = tmp_path_factory.getbasetemp()
    return base if worker_id == "master" else base.parent


@pytest.fixture(scope="session")
def toy_rl_run(shared_dir):
    """(RUN_DIR, MLflow URI) of one `jaxswe rl` on the toy game, 2 iterations, logging to
    TensorBoard, W&B (offline) and MLflow (a file store): run once per session, shared by its xdist
    workers (tests/cli/test_metrics.py reads its trackers, tests/cli/test_inspect.py reports on a copy)."""
    from filelock import FileLock

    run_dir, uri = shared_dir / "toy_rl_run", f"file://{shared_dir / 'toy_rl_mlruns'}"
    sets = ("rl.iterations=2", "rl.resample_to_fill=false", "logging.backends=[tensorboard,wandb,mlflow]")
    argv = [sys.executable, "-m", "jaxswe", "rl", "--config", "configs/toy-rl.yaml", "--run-dir",
            str(run_dir), *(a for s in sets for a in ("--set", s))]  # fmt: skip
    env = user_env()
    env |= {"WANDB_MODE": "offline", "WANDB_SILENT": "true", "MLFLOW_ALLOW_FILE_STORE": "true",
            "MLFLOW_TRACKING_URI": uri}  # fmt: skip
    with FileLock(shared_dir / "toy_rl_run.lock"):
        if not (run_dir / "rl" / "summary.json").is_file():
            done = subprocess.run(argv, env=env, capture_output=True, text=True, cwd=ROOT)
            assert done.returncode == 0, done.stderr[-3000:]
    return run_dir, uri
