"""Test-suite setup: 8 fake CPU devices for sharding tests, float32 matmuls at full precision."""

import os
import tempfile

os.environ.setdefault("XLA_FLAGS", "--xla_force_host_platform_device_count=8")
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
