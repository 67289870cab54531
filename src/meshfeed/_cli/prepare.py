"""``meshfeed prepare``: its flags, and the call each makes (``prepare`` or ``prepare_status``)."""

from __future__ import annotations

import argparse
import json
from typing import Any

from meshfeed._cli.flags import fail

EPILOG = """examples:
  meshfeed prepare 'corpus/*.jsonl.zst' --tokenizer tokenizer.json --out tokens --workers 8
  meshfeed prepare 'corpus/*.jsonl' --tokenizer tokenizer.json --out tokens --part 3/16
  meshfeed prepare 's3://bucket/text/*.parquet' --text body --tokenizer t.json \
      --out s3://bucket/tokens --ray
  meshfeed prepare --status --out tokens
"""


def add_parser(sub: Any) -> None:
    p = sub.add_parser(
        "prepare",
        help="tokenize text (JSONL, Parquet, .txt) into a meshfeed folder of token documents",
        description="Tokenizes every record of the inputs into a meshfeed folder with a "
        "'tokens' field, in parts that any number of workers or runs can write; a re-run "
        "finishes a killed build. The same bytes however it is run.",
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument(
        "inputs",
        nargs="*",
        help="paths, globs or URLs of .jsonl[.gz|.zst], .parquet or .txt files, in order",
    )
    p.add_argument("--out", required=True, help="the folder to write (a path or URL)")
    p.add_argument(
        "--tokenizer",
        help="a tokenizer.json (Hugging Face tokenizers); with --chat, a Hugging Face "
        "tokenizer folder",
    )
    p.add_argument("--text", default="text", help="the field holding the text (default text)")
    p.add_argument(
        "--chat",
        default=None,
        help="the field holding a conversation (a list of messages): tokens and an "
        "assistant-only loss_mask, as HF's chat template makes them",
    )
    p.add_argument(
        "--chat-template",
        default=None,
        help="a file holding the Jinja chat template (default: the tokenizer's)",
    )
    p.add_argument(
        "--chat-tools",
        default="tools",
        help="with --chat: the field holding a record's tools (default tools; 'none': never read)",
    )
    p.add_argument(
        "--chat-documents",
        default=None,
        help="with --chat: the field holding a record's RAG documents",
    )
    p.add_argument(
        "--chat-template-kwargs",
        default=None,
        help="with --chat: the template's keyword arguments, as JSON: "
        "'{\"enable_thinking\": false}'",
    )
    p.add_argument(
        "--chat-openai",
        action="store_true",
        help="with --chat: messages in OpenAI's format (arguments as JSON strings, "
        "content as parts)",
    )
    p.add_argument("--keep", default="", help="other fields to keep, comma-separated: id,url")
    p.add_argument(
        "--txt",
        choices=["file", "line"],
        default="file",
        help=".txt inputs: a document per file (default) or per line",
    )
    p.add_argument("--bos", default="auto", help="auto (the tokenizer's, if any), none, or a token")
    p.add_argument("--eos", default="auto", help="auto (the tokenizer's), none, or a token")
    p.add_argument(
        "--on-error",
        choices=["raise", "skip"],
        default="raise",
        help="a bad record stops the build, or is skipped and counted",
    )
    p.add_argument("--workers", type=int, default=None, help="local processes (default: cores)")
    p.add_argument("--part", default=None, help="i/N: write only share i of N (a Slurm array)")
    p.add_argument("--ray", action="store_true", help="run the parts as Ray tasks")
    p.add_argument(
        "--part-bytes", type=int, default=None, help="input bytes a part (inputs/64, 1-32 MiB)"
    )
    p.add_argument("--endpoint-url", default=None, help="an S3-compatible store's endpoint")
    p.add_argument("--status", action="store_true", help="say how far the build in --out is")
    p.add_argument("--quiet", action="store_true", help="no progress output")


def run(args: argparse.Namespace) -> int:
    import meshfeed

    options = {"endpoint_url": args.endpoint_url} if args.endpoint_url else None
    if args.status:
        print(meshfeed.prepare_status(args.out, storage_options=options))
        return 0
    if not args.inputs:
        fail("prepare needs inputs (paths, globs or URLs), or --status.")
    if not args.tokenizer:
        fail("prepare needs --tokenizer tokenizer.json.")
    extra: dict[str, Any] = {}
    if args.part_bytes is not None:
        extra["part_bytes"] = args.part_bytes
    if args.chat is not None:
        extra["chat"] = args.chat
        extra["chat_tools"] = None if args.chat_tools == "none" else args.chat_tools
        extra["chat_documents"] = args.chat_documents
        extra["chat_openai"] = args.chat_openai
    if args.chat_template_kwargs is not None:
        try:
            extra["chat_template_kwargs"] = json.loads(args.chat_template_kwargs)
        except ValueError as error:
            fail(f"--chat-template-kwargs is not JSON ({error}); pass an object: '{{\"a\": 1}}'.")
        if not isinstance(extra["chat_template_kwargs"], dict):
            fail("--chat-template-kwargs must be a JSON object: '{\"enable_thinking\": false}'.")
    if args.chat_template is not None:
        with open(args.chat_template, encoding="utf-8") as f:
            extra["chat_template"] = f.read()
    status = meshfeed.prepare(
        args.inputs,
        args.out,
        tokenizer=args.tokenizer,
        text=args.text,
        keep=[k for k in args.keep.split(",") if k],
        txt=args.txt,
        bos=_special(args.bos),
        eos=_special(args.eos),
        on_error=args.on_error,
        workers=args.workers,
        part=_part(args.part),
        executor="ray" if args.ray else "local",
        storage_options=options,
        progress=not args.quiet,
        **extra,
    )
    rate = f"; {status.tokens_per_s:,.0f} tokens/s" if status.ran else ""
    print(f"{status} (this run wrote {status.ran} parts in {status.seconds:.1f} s{rate})")
    return 0


def _special(text: str) -> bool | str:
    return {"auto": True, "none": False}.get(text, text)


def _part(text: str | None) -> tuple[int, int] | None:
    if text is None:
        return None
    i, _, n = text.partition("/")
    if not (i.isdigit() and n.isdigit()) or not int(i) < int(n):
        fail(f"--part {text}: write i/N with 0 <= i < N, e.g. --part 0/4.")
    return int(i), int(n)
