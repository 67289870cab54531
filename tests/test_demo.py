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
