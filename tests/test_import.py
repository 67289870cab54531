import subprocess
import sys


def test_importing_meshfeed_touches_no_device():
    # If importing meshfeed initialised a backend, changing the CPU device count
    # afterwards would not take effect.
    code = (
        "import jax, meshfeed\n"
        "jax.config.update('jax_num_cpu_devices', 3)\n"
        "assert jax.device_count() == 3, jax.device_count()\n"
    )
    env = {"JAX_PLATFORMS": "cpu", "PATH": "/usr/bin:/bin"}
    subprocess.run([sys.executable, "-c", code], check=True, env=env, timeout=120)


def test_public_names_are_exported():
    import meshfeed

    for name in meshfeed.__all__:
        assert getattr(meshfeed, name) is not None
