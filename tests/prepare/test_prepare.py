"""``meshfeed.prepare``: text in, token documents out -- the same bytes however it runs."""

from __future__ import annotations

import gzip
import importlib
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

import meshfeed
from prepare_fns import (
    documents,
    token_documents,
    train_tokenizer,
    tree,
    write_jsonl,
    write_parquet,
)

tokenizers = pytest.importorskip("tokenizers", reason="the text extra (tokenizers) is needed")
PART = 6000  # bytes per part: a dozen parts from the small corpus


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    folder = tmp_path_factory.mktemp("corpus")
    records = documents(40)
    return {
        "records": records,
        "folder": folder,
        "jsonl": write_jsonl(folder / "jsonl", records, 3),
        "tokenizer": train_tokenizer(folder / "tokenizer.json"),
    }


def _expected(tokenizer_path, texts, *, bos: int | None = None, eos: int | None = 0):
    model = tokenizers.Tokenizer.from_file(str(tokenizer_path))
    out = []
    for text in texts:
        ids = model.encode(text, add_special_tokens=False).ids
        if ids:
            out.append(
                [*([bos] if bos is not None else []), *ids, *([eos] if eos is not None else [])]
            )
    return out


def _prepare(corpus, out, **kwargs):
    kwargs.setdefault("progress", False)
    kwargs.setdefault("part_bytes", PART)
    kwargs.setdefault("tokenizer", corpus["tokenizer"])
    return meshfeed.prepare([str(p) for p in corpus["jsonl"]], out, **kwargs)


def test_tokens_are_the_tokenizers_own_ids_plus_eos_in_input_order(corpus, tmp_path):
    status = _prepare(corpus, tmp_path / "out", workers=2, keep={"id": "str", "n": "int"})
    assert status.complete and status.parts > 5 and status.ran == status.parts
    assert status.empty == 1 and status.skipped == 0 and status.documents == 39
    source = meshfeed.open_source(tmp_path / "out")
    assert source.fields["tokens"].dtype == np.uint16  # the narrowest for 600 ids
    texts = [r["text"] for r in corpus["records"]]
    want = _expected(corpus["tokenizer"], texts, eos=0)  # <|endoftext|> is id 0
    got = token_documents(source)
    assert [g.tolist() for g in got] == want
    assert status.tokens == sum(map(len, want))
    rows = source[np.arange(len(source))]
    kept = [r for r in corpus["records"] if r["text"]]
    assert rows["n"].tolist() == [r["n"] for r in kept]
    assert [bytes(v).decode() for v in rows["id"].to_list()] == [r["id"] for r in kept]


def test_bos_and_eos_from_the_tokenizers_template_or_switched_off(corpus, tmp_path):
    template = train_tokenizer(tmp_path / "template.json", template=True)
    model = tokenizers.Tokenizer.from_file(str(template))
    bos, eos = model.token_to_id("<s>"), model.token_to_id("</s>")
    texts = [r["text"] for r in corpus["records"]]
    meshfeed.prepare(
        [str(p) for p in corpus["jsonl"]], tmp_path / "both", tokenizer=template, progress=False
    )
    got = token_documents(meshfeed.open_source(tmp_path / "both"))
    assert [g.tolist() for g in got] == _expected(template, texts, bos=bos, eos=eos)
    meshfeed.prepare(
        [str(p) for p in corpus["jsonl"]],
        tmp_path / "none",
        tokenizer=template,
        bos=False,
        eos=False,
        progress=False,
    )
    got = token_documents(meshfeed.open_source(tmp_path / "none"))
    assert [g.tolist() for g in got] == _expected(template, texts, bos=None, eos=None)


def _command(inputs, tokenizer, out, part_bytes: int, workers: int) -> list[str]:
    """``meshfeed prepare`` of ``inputs`` into ``out``, quiet, as a new process runs it."""
    return [
        sys.executable, "-m", "meshfeed", "prepare", *map(str, inputs),
        "--tokenizer", str(tokenizer), "--out", str(out), "--part-bytes", str(part_bytes),
        "--workers", str(workers), "--quiet",
    ]  # fmt: skip


def test_the_same_bytes_for_1_2_or_3_workers_part_runs_and_ray(corpus, tmp_path):
    _prepare(corpus, tmp_path / "w1", workers=1)
    reference = tree(tmp_path / "w1")
    assert len([k for k in reference if k.endswith("meshfeed.json")]) > 5
    for workers in (2, 3):
        _prepare(corpus, tmp_path / f"w{workers}", workers=workers)
        assert tree(tmp_path / f"w{workers}") == reference
    # Three separate runs of the command, each one share, in another order.
    command = _command(corpus["jsonl"], corpus["tokenizer"], tmp_path / "parts", PART, 1)
    for share in ("2/3", "0/3", "1/3"):
        run = subprocess.run([*command, "--part", share], capture_output=True, text=True)
        assert run.returncode == 0, run.stderr[-2000:]
        assert ("complete" in run.stdout) == (share == "1/3")
    assert tree(tmp_path / "parts") == reference
    # Ray (a local one of this machine's 2 CPUs, started by the command; in a process of
    # its own, since Ray forks and this one runs JAX).
    pytest.importorskip("ray", reason="the ray extra is needed for executor='ray'")
    command[command.index(str(tmp_path / "parts"))] = str(tmp_path / "ray")
    run = subprocess.run([*command, "--ray"], capture_output=True, text=True)
    assert run.returncode == 0, run.stderr[-2000:]
    assert tree(tmp_path / "ray") == reference


def test_a_build_killed_midway_is_finished_by_a_rerun_that_redoes_only_what_is_missing(tmp_path):
    records = documents(160, max_chars=20_000)
    inputs = write_jsonl(tmp_path / "big", records, 4)
    tokenizer = train_tokenizer(tmp_path / "tokenizer.json")
    command = _command(inputs, tokenizer, tmp_path / "killed", 40_000, 2)
    build = subprocess.Popen(command, start_new_session=True, stderr=subprocess.PIPE)
    deadline = time.monotonic() + 120
    while len(list((tmp_path / "killed").glob("part-*/meshfeed.json"))) < 3:
        if build.poll() is not None or time.monotonic() > deadline:
            raise AssertionError(build.communicate()[1].decode()[-2000:])
        time.sleep(0.01)
    os.killpg(build.pid, signal.SIGKILL)  # the command and its workers, at once
    build.communicate()
    written = {
        p.parent.name: p.stat().st_mtime_ns
        for p in (tmp_path / "killed").glob("part-*/meshfeed.json")
    }
    status = meshfeed.prepare_status(tmp_path / "killed")
    assert not status.complete and status.done == len(written) < status.parts
    with pytest.raises(
        FileNotFoundError,
        match=r"unfinished meshfeed.prepare build: parts .* of \d+ are not written yet",
    ):
        meshfeed.open_source(tmp_path / "killed")
    again = meshfeed.prepare(  # part_bytes left out: the build's own is kept
        [str(p) for p in inputs], tmp_path / "killed", tokenizer=tokenizer, workers=2,
        progress=False,
    )  # fmt: skip
    assert again.complete and again.ran == again.parts - len(written)
    for name, mtime in written.items():  # finished parts were not written again
        assert (tmp_path / "killed" / name / "meshfeed.json").stat().st_mtime_ns == mtime
    meshfeed.prepare(
        [str(p) for p in inputs],
        tmp_path / "whole",
        tokenizer=tokenizer,
        part_bytes=40000,
        workers=2,
        progress=False,
    )
    assert tree(tmp_path / "killed") == tree(tmp_path / "whole")


def test_the_default_cuts_about_64_parts_of_1_to_32_mib():
    inputs = importlib.import_module("meshfeed.prepare._inputs")
    mib = 1 << 20

    def default(*sizes: int) -> int:
        return inputs.default_part_bytes([{"kind": "jsonl", "size": s} for s in sizes])

    assert default(20 * 10**6) == mib  # 20 MB: 20 parts of the smallest
    assert default(100 * 10**6, 100 * 10**6) == -(-200 * 10**6 // 64)  # 200 MB: 64 parts
    assert default(10 * 2**30) == 32 * mib  # 10 GiB: parts of the largest
    dataset = {"kind": "dataset", "size": 1000, "bytes": 640 * mib}  # rows, and bytes
    assert inputs.default_part_bytes([dataset]) == 10 * mib


def _kinds(corpus, folder):
    """The corpus as every input kind, each paired with the texts it holds, in order."""
    records = corpus["records"]
    texts = [r["text"] for r in records]
    txt = folder / "txt"
    txt.mkdir()
    for r in records:
        (txt / f"{r['n']:03d}.txt").write_text(r["text"])
    lines = [line for t in texts for line in t.split("\n")]
    (folder / "lines.txt").write_text("\n".join(lines) + "\n")
    return {
        "jsonl.gz": (write_jsonl(folder / "gz", records, 2, ".jsonl.gz"), {}, texts),
        "jsonl.zst": (write_jsonl(folder / "zst", records, 2, ".jsonl.zst"), {}, texts),
        "parquet": ([write_parquet(folder / "t.parquet", records)], {}, texts),
        "txt files": (sorted(txt.glob("*.txt")), {"txt": "file"}, texts),
        "txt lines": ([folder / "lines.txt"], {"txt": "line"}, lines),
    }


def test_every_input_kind_and_a_dataset(corpus, tmp_path):
    for kind, (paths, options, texts) in _kinds(corpus, tmp_path).items():
        out = tmp_path / kind.replace(" ", "_")
        meshfeed.prepare(
            [str(p) for p in paths],
            out,
            tokenizer=corpus["tokenizer"],
            part_bytes=PART,
            workers=2,
            progress=False,
            **options,
        )
        got = [g.tolist() for g in token_documents(meshfeed.open_source(out))]
        assert got == _expected(corpus["tokenizer"], texts), kind
    datasets = pytest.importorskip("datasets", reason="the hf extra is needed for a Dataset")
    records = corpus["records"]
    dataset = datasets.Dataset.from_dict({k: [r[k] for r in records] for k in ("id", "text")})
    meshfeed.prepare(
        dataset,
        tmp_path / "dataset",
        tokenizer=corpus["tokenizer"],
        part_bytes=PART,
        keep=["id"],
        progress=False,
    )
    source = meshfeed.open_source(tmp_path / "dataset")
    want = _expected(corpus["tokenizer"], [r["text"] for r in records])
    assert [g.tolist() for g in token_documents(source)] == want


def test_inputs_and_output_on_the_s3_server(corpus, tmp_path, server):
    opts = server.storage_options
    import fsspec

    fs = fsspec.filesystem("s3", **opts)
    kinds = _kinds(corpus, tmp_path)
    kinds["jsonl"] = (corpus["jsonl"], {}, [r["text"] for r in corpus["records"]])
    for kind, (paths, options, texts) in kinds.items():
        prefix = f"data/prepare-in/{kind.replace(' ', '_')}"
        for p in paths:
            fs.put(str(p), f"{prefix}/{p.name}")
        pattern = f"s3://{prefix}/*"
        out = f"s3://data/prepare-out/{kind.replace(' ', '_')}"
        status = meshfeed.prepare(
            pattern,
            out,
            tokenizer=corpus["tokenizer"],
            part_bytes=PART,
            workers=2,
            storage_options=opts,
            progress=False,
            **options,
        )
        assert status.complete, kind
        source = meshfeed.open_source(out, storage_options=opts, tokenizer=corpus["tokenizer"])
        got = [g.tolist() for g in token_documents(source)]
        assert got == _expected(corpus["tokenizer"], texts), kind


@pytest.mark.parametrize(
    ("line", "match"),
    [
        (b"{not json\n", r"c00.jsonl, line 3: not JSON"),
        (b'{"body": "x"}\n', r"c00.jsonl, line 3: no field 'text', not a string of text"),
        (b'{"text": 5}\n', r"c00.jsonl, line 3: a int in field 'text', not a string"),
    ],
    ids=["not json", "no text", "text not a string"],
)
def test_a_bad_record_is_named_or_skipped_and_counted(corpus, tmp_path, line, match):
    records = corpus["records"][:6]
    (path,) = write_jsonl(tmp_path / "bad", records, 1)
    data = path.read_bytes().split(b"\n")
    path.write_bytes(b"\n".join(data[:2]) + b"\n" + line + b"\n".join(data[2:]))
    with pytest.raises(ValueError, match=match):
        meshfeed.prepare(
            str(path), tmp_path / "raised", tokenizer=corpus["tokenizer"], progress=False
        )
    assert meshfeed.prepare_status(tmp_path / "raised").done == 0  # nothing taken for done
    status = meshfeed.prepare(
        str(path),
        tmp_path / "skipped",
        tokenizer=corpus["tokenizer"],
        on_error="skip",
        progress=False,
    )
    assert status.complete and status.skipped == 1 and status.documents == 5  # one was empty


@pytest.mark.parametrize("suffix", [".jsonl.gz", ".jsonl.zst"])
def test_a_truncated_compressed_file_is_named(corpus, tmp_path, suffix):
    (path,) = write_jsonl(tmp_path / "c", corpus["records"], 1, suffix)
    path.write_bytes(path.read_bytes()[:-40])
    for on_error in ("raise", "skip"):
        with pytest.raises(ValueError, match=rf"c00{suffix}: truncated"):
            meshfeed.prepare(
                str(path),
                tmp_path / on_error,
                tokenizer=corpus["tokenizer"],
                on_error=on_error,
                progress=False,
            )


def test_another_tokenizer_is_refused_when_opening_or_resuming(corpus, tmp_path):
    out = tmp_path / "out"
    _prepare(corpus, out, workers=1)
    meshfeed.open_source(out, tokenizer=corpus["tokenizer"])  # the same one: accepted
    other_vocab = train_tokenizer(tmp_path / "other.json", vocab_size=700)
    with pytest.raises(
        ValueError, match=r"another tokenizer .* vocabulary size: 600 in the folder, 700 here"
    ):
        meshfeed.open_source(out, tokenizer=other_vocab)
    lowercase = train_tokenizer(tmp_path / "lower.json", lowercase=True)
    config = json.loads(lowercase.read_text())
    assert config["model"] == json.loads(Path(corpus["tokenizer"]).read_text())["model"]
    with pytest.raises(
        ValueError, match=r"content hash .* fingerprint: 'Hello, world!' encodes to"
    ):
        meshfeed.open_source(out, tokenizer=lowercase)
    with pytest.raises(ValueError, match=r"holds a build of other inputs or settings .* tokenizer"):
        meshfeed.prepare(
            [str(p) for p in corpus["jsonl"]],
            out,
            tokenizer=lowercase,
            part_bytes=PART,
            progress=False,
        )
    with pytest.raises(ValueError, match=r"text='body' now, 'text' when it started"):
        _prepare(corpus, out, text="body")


def test_a_function_tokenizer_is_recorded_by_name_and_version(corpus, tmp_path):
    def encode(texts):
        return [list(t.encode()) for t in texts]  # bytes as ids

    tok = meshfeed.types.TokenizerFunction(
        encode, name="bytes", version="1", vocab_size=257, eos_id=256
    )
    _prepare(corpus, tmp_path / "out", tokenizer=tok, workers=2)
    source = meshfeed.open_source(tmp_path / "out", tokenizer=tok)
    texts = [r["text"] for r in corpus["records"] if r["text"]]
    assert [g.tolist() for g in token_documents(source)] == [[*t.encode(), 256] for t in texts]
    v2 = meshfeed.types.TokenizerFunction(
        encode, name="bytes", version="2", vocab_size=257, eos_id=256
    )
    with pytest.raises(ValueError, match=r"name: 'bytes@1' in the folder, 'bytes@2' here"):
        meshfeed.open_source(tmp_path / "out", tokenizer=v2)


@pytest.mark.parametrize(
    ("kwargs", "error", "match"),
    [
        ({"text": ""}, ValueError, r"text='' must name the field"),
        ({"keep": "id"}, TypeError, r"keep='id' is a string; pass a list"),
        ({"keep": {"id": "date"}}, ValueError, r"each field's type must be one of"),
        ({"txt": "page"}, ValueError, r"txt='page' must be 'file'"),
        ({"on_error": "ignore"}, ValueError, r"on_error='ignore' must be 'raise' or 'skip'"),
        ({"workers": 0}, ValueError, r"workers=0 must be an int >= 1"),
        ({"part": (2, 2)}, ValueError, r"part=\(2, 2\) must be \(i, n\) with 0 <= i < n"),
        ({"executor": "dask"}, ValueError, r"executor='dask' must be 'local' or 'ray'"),
        ({"part_bytes": 0}, ValueError, r"part_bytes=0 must be an int >= 1"),
        ({"tokenizer": 5}, TypeError, r"tokenizer is a int; pass a tokenizers.Tokenizer"),
        (
            {"tokenizer": "nowhere.json"},
            FileNotFoundError,
            r"tokenizer='nowhere.json' is not a file",
        ),
        ({"bos": "<nope>"}, ValueError, r"bos='<nope>' is not a token of the tokenizer"),
        ({"eos": 10_000}, ValueError, r"eos=10000 is not an id of the vocabulary \(0..599\)"),
    ],
)
def test_bad_arguments_are_refused_before_anything_is_written(
    corpus, tmp_path, kwargs, error, match
):
    kwargs = {"tokenizer": corpus["tokenizer"], **kwargs}
    with pytest.raises(error, match=match):
        meshfeed.prepare(
            [str(p) for p in corpus["jsonl"]], tmp_path / "out", progress=False, **kwargs
        )
    assert not (tmp_path / "out").exists()


def test_bad_inputs_are_refused_by_name(corpus, tmp_path):
    (tmp_path / "x.csv").write_text("a,b\n")
    with pytest.raises(ValueError, match=r"x.csv: meshfeed.prepare reads .jsonl, .jsonl.gz"):
        meshfeed.prepare(str(tmp_path / "x.csv"), tmp_path / "o", tokenizer=corpus["tokenizer"])
    with pytest.raises(FileNotFoundError, match=r"matches no file"):
        meshfeed.prepare(str(tmp_path / "*.jsonl"), tmp_path / "o", tokenizer=corpus["tokenizer"])
    no_eos = tokenizers.Tokenizer(
        tokenizers.models.WordLevel({"a": 0, "[UNK]": 1}, unk_token="[UNK]")
    )
    with pytest.raises(ValueError, match=r"defines no EOS token, and eos=True .* eos=False"):
        meshfeed.prepare([str(p) for p in corpus["jsonl"]], tmp_path / "o", tokenizer=no_eos)
    (tmp_path / "gz").mkdir()
    (tmp_path / "gz" / "a.jsonl.gz").write_bytes(gzip.compress(b'{"text": "x"}\n') + b"junk")
    with pytest.raises(ValueError, match=r"a.jsonl.gz: not a gzip stream"):
        meshfeed.prepare(
            str(tmp_path / "gz" / "a.jsonl.gz"),
            tmp_path / "o2",
            tokenizer=corpus["tokenizer"],
            progress=False,
        )


def test_the_command_prepares_and_reports_status(corpus, tmp_path):
    out = tmp_path / "out"
    base = [sys.executable, "-m", "meshfeed", "prepare"]
    run = subprocess.run(
        [
            *base,
            *map(str, corpus["jsonl"]),
            "--tokenizer",
            str(corpus["tokenizer"]),
            "--out",
            str(out),
            "--workers",
            "2",
            "--part-bytes",
            str(PART),
        ],
        capture_output=True,
        text=True,
    )
    assert run.returncode == 0, run.stderr[-2000:]
    assert "prepare: part" in run.stderr  # a line per part off a terminal
    assert "complete" in run.stdout and "39 documents" in run.stdout
    status = subprocess.run([*base, "--status", "--out", str(out)], capture_output=True, text=True)
    assert status.returncode == 0 and "parts written (complete)" in status.stdout
    bad = subprocess.run([*base, "--out", str(out)], capture_output=True, text=True)
    assert bad.returncode == 2 and "prepare needs inputs" in bad.stderr
