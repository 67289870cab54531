"""Eight CPU devices for every test, set before JAX initialises its backend."""

import os

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


import pytest


@pytest.fixture(scope="session")
def server():
    """An S3-compatible server (moto) on 127.0.0.1 with a bucket ``data``, for the session."""
    from meshfeed.testing import S3Server

    s3 = S3Server()
    s3.make_bucket("data")
    yield s3
    s3.close()
