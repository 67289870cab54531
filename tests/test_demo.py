import pytest

from meshfeed._cli import main
from meshfeed._demo import train_digits
from meshfeed.testing import run_in_processes


@pytest.mark.multiprocess
def test_demo_training_reaches_95_percent_on_2_processes():
    results = run_in_processes(_train_quietly, num_processes=2, devices_per_process=4)
    for r in results:
        assert r["accuracy"] >= 0.95, r
    assert results[0]["accuracy"] == results[1]["accuracy"]


def _train_quietly():
    return train_digits(progress=False)


def test_cli_help_lists_the_demo(capsys):
    with pytest.raises(SystemExit) as exit_info:
        main(["--help"])
    assert exit_info.value.code == 0
    assert "demo" in capsys.readouterr().out
