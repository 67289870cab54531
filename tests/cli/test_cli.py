import json
import subprocess
import sys

import pytest


def _meshfeed(*args):
    run = subprocess.run(
        [sys.executable, "-m", "meshfeed", *args], capture_output=True, text=True, timeout=120
    )
    assert run.returncode == 0, run.stderr
    return run.stdout


def test_show_prints_the_layout_and_draws_it(tmp_path):
    out = _meshfeed(
        "show",
        "--mesh",
        "data=4,model=2",
        "--spec",
        "data,model",
        "--shape",
        "256,128",
        "--processes",
        "2",
        "--out",
        str(tmp_path / "layout.png"),
    )
    assert "P('data', 'model') on mesh data=4 x model=2" in out
    assert "[192:256]" in out and "p1" in out
    assert (tmp_path / "layout.png").stat().st_size > 1000


def test_plan_prints_every_strategy_and_the_choice():
    out = _meshfeed(
        "plan",
        "--mesh",
        "data=4,model=2",
        "--spec",
        "data",
        "--shape",
        "256,784",
        "--dtype",
        "uint8",
        "--processes",
        "2",
    )
    for strategy in ("global", "per_device", "per_process", "reshard"):
        assert strategy in out
    assert "auto -> per_process" in out and "128 each" in out


def test_spec_joins_axes_with_plus():
    out = _meshfeed(
        "show", "--mesh", "data=4,model=2", "--spec", "data+model,none", "--shape", "16,3"
    )
    assert "P(('data', 'model'), None)" in out and "[14:16]" in out


def test_bench_matmul_prints_the_table_and_each_layout():
    out = _meshfeed(
        "bench", "matmul", "--size", "64", "--mesh", "data=4,model=2", "--repeats", "2", "--layouts"
    )
    lines = [json.loads(line) for line in out.splitlines() if line.startswith("{")]
    assert [r["name"] for r in lines] == [
        "one device",
        "replicated",
        "rows",
        "allgather",
        "reduce_scatter",
        "2d",
        "auto",
    ]
    # 64 x 64 on a loaded host can round to 0.0000 TFLOP/s: the time says it ran.
    assert all(r["ms"] > 0 and r["tflops"] >= 0 for r in lines)
    assert "strategy" in out and "TFLOP/s" in out and "bytes moved" in out
    two_d = out.split("== 2d\n")[1]
    assert two_d.startswith("a: ") and "('data', 'model')" in two_d.splitlines()[0]


def test_bench_loader_prints_json_lines():
    out = _meshfeed(
        "bench",
        "loader",
        "--mesh",
        "data=8",
        "--examples",
        "2048",
        "--batch",
        "64",
        "--seconds",
        "0.05",
    )
    names = [json.loads(line)["name"] for line in out.splitlines()]
    assert names == ["floor", "global", "per_device", "per_process", "reshard", "auto"]


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["show", "--mesh", "data=four", "--spec", "data", "--shape", "8"], "axis=size pairs"),
        (["show", "--mesh", "data=8", "--spec", "model", "--shape", "8"], "not axes of --mesh"),
    ],
)
def test_bad_flags_say_what_to_write(args, message):
    run = subprocess.run(
        [sys.executable, "-m", "meshfeed", *args], capture_output=True, text=True, timeout=60
    )
    assert run.returncode != 0 and message in run.stderr


def test_index_refuses_a_tgz_of_one_member_with_the_command_then_makes_it_seekable(tmp_path):
    from formats_fns import read_as_peers_do, write_compressed

    shard = write_compressed(tmp_path, "webdataset")  # one gzip member of 17 MiB of tar
    theirs = read_as_peers_do(shard)
    run = subprocess.run(
        [sys.executable, "-m", "meshfeed", "index", shard], capture_output=True, text=True,
        timeout=120,
    )  # fmt: skip
    assert run.returncode != 0
    assert "reading one sample would decompress all of it" in run.stderr
    assert f"meshfeed index --seekable {shard}" in run.stderr
    out = _meshfeed("index", "--seekable", "--quiet", shard)
    assert "indexed 1 files (34 samples" in out
    assert read_as_peers_do(shard) == theirs  # webdataset reads the rewritten shard the same
