"""python -m minitp.export --load DIR --to hf OUT | --from hf DIR OUT (docs/export.md)."""

from __future__ import annotations

import argparse
import sys

from .convert import from_hf, to_hf

USAGE = ("python -m minitp.export --load DIR --to hf OUT   (a minitp checkpoint, any layout)\n"
         "       python -m minitp.export --from hf DIR OUT      (a transformers directory)")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m minitp.export", usage=USAGE,
                                     description="Write a minitp checkpoint as a transformers "
                                     "GPT-2 or Llama directory, or the reverse.")
    source = parser.add_mutually_exclusive_group(required=True)
    source.add_argument("--load", metavar="DIR", help="a minitp checkpoint (dense or sharded; "
                        "a run's directory: its newest complete step)")
    source.add_argument("--from", dest="source", choices=["hf"],
                        help="read a transformers directory (config.json, model.safetensors)")
    parser.add_argument("--to", choices=["hf"], help="with --load: the format to write")
    parser.add_argument("paths", nargs="+", metavar="PATH", help="OUT (--load), DIR OUT (--from)")
    return parser


def main(argv: list[str] | None = None) -> dict:
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.load is not None and (args.to is None or len(args.paths) != 1):
        parser.error(f"--load DIR needs --to hf and one OUT directory, got --to {args.to} and "
                     f"{args.paths}")
    if args.source is not None and (args.to is not None or len(args.paths) != 2):
        parser.error(f"--from hf needs DIR and OUT (and no --to), got {args.paths}")
    try:
        if args.load is not None:
            done = to_hf(args.load, args.paths[0])
            print(f"wrote {args.paths[0]}: a transformers {done['kind']} model, "
                  f"{done['parameters']:,} parameters in {done['dtype']} "
                  f"(from {done['source']}): {', '.join(done['files'])}")
        else:
            done = from_hf(*args.paths)
            print(f"wrote {args.paths[1]}: a minitp checkpoint of a {done['kind']} model, "
                  f"{done['parameters']:,} parameters in {done['dtype']} "
                  f"(load it with mt.checkpoint.load or --load)")
    except (ValueError, FileNotFoundError, NotADirectoryError, PermissionError) as exc:
        why = str(exc).removeprefix("minitp.export: ")
        print(f"python -m minitp.export: error: {why}", file=sys.stderr)
        raise SystemExit(1) from None
    return done


if __name__ == "__main__":
    main()
