import importlib
import subprocess
import sys

import pytest

import meshfeed
from meshfeed.sources import TarSource
from meshfeed.train import History


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
    for name in meshfeed.__all__:
        assert getattr(meshfeed, name) is not None


SUBMODULES = ("sources", "schedules", "inspect", "train", "types")


def test_the_top_level_holds_at_most_40_names_and_each_module_names_its_own():
    assert len(meshfeed.__all__) <= 40
    homes = {m: set(importlib.import_module(f"meshfeed.{m}").__all__) for m in SUBMODULES}
    seen = set(meshfeed.__all__)
    for module, names in homes.items():
        assert not names & seen, f"meshfeed.{module} repeats {sorted(names & seen)}"
        seen |= names


def test_a_moved_name_warns_with_its_new_home_and_still_works():
    with pytest.warns(DeprecationWarning, match=r"meshfeed\.sources\.TarSource"):
        assert meshfeed.TarSource is TarSource
    with pytest.warns(DeprecationWarning, match=r"meshfeed\.train\.History"):
        from meshfeed import History as old  # the from-import of user code
    assert old is History
    with pytest.raises(AttributeError, match="no attribute 'Nope'"):
        _ = meshfeed.Nope
