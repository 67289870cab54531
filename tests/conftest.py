"""Eight CPU devices for every test, set before JAX initialises its backend; the helper
modules of ``tests/helpers/`` importable by name, here and in every process a test starts."""

import atexit
import os
import shutil
import sys
import tempfile
from pathlib import Path

import pytest

# The tests sit in one folder per layer and import their helpers by bare name
# (``import train_fns``); the processes they start (``meshfeed launch``, a job script,
# ``python -c``) import them too, by the same name, so the folder goes on PYTHONPATH as well.
HELPERS = str(Path(__file__).resolve().parent / "helpers")
if HELPERS not in sys.path:
    sys.path.insert(0, HELPERS)
os.environ["PYTHONPATH"] = os.pathsep.join(filter(None, [HELPERS, os.environ.get("PYTHONPATH")]))

os.environ["XLA_FLAGS"] = " ".join(
    [
        *(
            f
            for f in os.environ.get("XLA_FLAGS", "").split()
            if not f.startswith("--xla_force_host_platform_device_count")
        ),
        "--xla_force_host_platform_device_count=8",
    ]
)
os.environ.setdefault("JAX_PLATFORMS", "cpu")
os.environ.setdefault("KERAS_BACKEND", "jax")

# One compilation cache for the session, shared with the processes the tests start: a
# program another test (or process) compiled already is read back, not compiled again.
# Fresh each session, so nothing carries over from another version of the code.
if "JAX_COMPILATION_CACHE_DIR" not in os.environ:
    os.environ["JAX_COMPILATION_CACHE_DIR"] = tempfile.mkdtemp(prefix="meshfeed-tests-xla-")
    atexit.register(shutil.rmtree, os.environ["JAX_COMPILATION_CACHE_DIR"], ignore_errors=True)
os.environ.setdefault("JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS", "0")
os.environ.setdefault("JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES", "0")


@pytest.fixture(scope="session")
def server():
    """An S3-compatible server (moto) on 127.0.0.1 with a bucket ``data``, for the session."""
    from meshfeed.testing import S3Server

    s3 = S3Server()
    s3.make_bucket("data")
    yield s3
    s3.close()
