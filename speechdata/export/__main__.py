"""``python -m speechdata.export nemo|lhotse|moshi ...``: the export commands without the ``speechdata`` CLI."""

import argparse
import sys

from speechdata.export.command import register


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="speechdata", description="speechdata commands")
    register(parser.add_subparsers(dest="command", required=True))
    args = parser.parse_args(["export", *(sys.argv[1:] if argv is None else argv)])
    return args.run(args)


if __name__ == "__main__":
    sys.exit(main())
