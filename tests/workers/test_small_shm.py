"""Record workers under a /dev/shm as small as Docker's: the same bytes, said, nothing left.

Docker gives a container 64 MiB of /dev/shm, and batches that do not fit there killed the
loading process with a bare ``Bus error``. Here a private 8 MiB tmpfs is mounted over
/dev/shm for one process (``unshare``: a user and mount namespace, no root needed) and
``small_shm_job.py`` runs loaders with 2 worker processes in it: one whose read-ahead is
cut to what fits, one whose rows go through files, one whose batch grows after another
process filled /dev/shm; then loaders dropped, a worker and a loading process SIGKILLed.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

JOB = Path(__file__).resolve().parents[1] / "helpers" / "small_shm_job.py"
CUT = "the read-ahead is cut to"
FILES = "the rows go through memory-mapped files in"
FILLED = "could not be made in /dev/shm"


def _namespaces_allowed() -> bool:
    if shutil.which("unshare") is None:
        return False
    done = subprocess.run(["unshare", "-rm", "true"], capture_output=True, check=False)
    return done.returncode == 0


def _run(*argv: str, small_shm: bool, tmp: Path) -> tuple[dict, str]:
    command = [sys.executable, str(JOB), *argv]
    if small_shm:
        mount = 'mount -t tmpfs -o size=8m tmpfs /dev/shm && exec "$@"'
        command = ["unshare", "-rm", "sh", "-c", mount, "sh", *command]
    done = subprocess.run(
        command,
        capture_output=True,
        text=True,
        timeout=300,
        cwd=JOB.parent,
        env={**os.environ, "TMPDIR": str(tmp)},  # the files' folder: nobody else's
        check=False,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1]), done.stderr


@pytest.mark.skipif(
    not _namespaces_allowed(),
    reason="this machine does not let an unprivileged user mount a tmpfs in a namespace "
    "(unshare -rm), which is how the test gets a small /dev/shm without root",
)
def test_a_small_dev_shm_gives_the_same_bytes_says_so_and_leaves_nothing(tmp_path):
    small, said = _run(small_shm=True, tmp=tmp_path)
    roomy, roomy_said = _run("hashes", small_shm=False, tmp=tmp_path)
    for run in ("small", "large", "filled"):
        assert small[run]["hash"] == roomy[run]["hash"], run  # two epochs, the same bytes
    # Small rows: the read-ahead is cut to what fits in half of the 8 MiB.
    assert 1 <= small["small"]["depth"] <= 13
    assert said.count(CUT) >= 1 and "--shm-size" in said and "medium: Memory" in said
    assert said.count(FILES) >= 2  # the large rows (twice: two loaders) ...
    assert said.count(FILLED) == 1  # ... and the new blocks of the filled /dev/shm
    assert "Bus error" not in said
    assert CUT not in roomy_said and FILES not in roomy_said
    # Nothing is left in /dev/shm or the temporary folder: after each loader closed, was
    # dropped, lost a worker, or was SIGKILLed itself.
    for run, out in small.items():
        assert out["left"] == {"shm": [], "folders": []}, run
    assert "was killed by SIGKILL" in small["killed"]["error"]
