import re
import subprocess
import sys

import pytest

from meshfeed._cli import main


@pytest.mark.multiprocess
def test_demo_command_trains_to_95_percent_on_2_processes():
    # README's command, as a user runs it (CI runs it nowhere else).
    run = subprocess.run(
        [sys.executable, "-m", "meshfeed", "demo"], capture_output=True, text=True, timeout=600
    )
    assert run.returncode == 0, run.stdout + run.stderr
    out = run.stdout
    assert "2 processes x 4 CPU devices" in out
    assert "[Gloo]" not in out  # only process 0 speaks, without gloo's chatter
    accuracy = float(re.findall(r"test accuracy ([\d.]+)%", out)[0])
    assert accuracy >= 95.0, out


def test_cli_help_lists_the_demo(capsys):
    with pytest.raises(SystemExit) as exit_info:
        main(["--help"])
    assert exit_info.value.code == 0
    assert "demo" in capsys.readouterr().out


@pytest.mark.multiprocess
def test_lm_demo_packs_trains_and_resumes_exactly():
    run = subprocess.run(
        [sys.executable, "-m", "meshfeed", "demo", "--lm", "--steps", "20"],  # 300 by default
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert run.returncode == 0, run.stdout + run.stderr
    out = " ".join(run.stdout.split())  # rich wraps long lines
    assert "2 processes x 4 CPU devices" in out and "'model': 2" in out
    padding = float(re.findall(r"rows of 256: ([\d.]+)% padding", out)[0])
    assert padding < 2.0, out
    bits = float(re.findall(r"final loss ([\d.]+) bits per byte", out)[0])
    assert bits <= 4.5, out  # from 8 (uniform bytes); 4.1 at 20 steps, 3.4 at 90, 3.0 at 300
    assert "the next batch is the uninterrupted stream's: True" in out, out
