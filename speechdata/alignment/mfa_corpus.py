"""Export a shard as a Montreal Forced Aligner corpus: ``<utt_id>.wav`` + ``<utt_id>.lab`` per utterance.

For people who run MFA themselves::

    mfa align <corpus_dir> english_us_arpa english_us_arpa <output_dir> --clean

The audio is the shard's normalized audio (cut to the utterance, mono) as 16-bit WAV at 16 kHz
(MFA's acoustic models' rate), so the TextGrids' times are relative to the utterance's own audio,
the alignments table's convention. The ``.lab`` is the transcript on one line. Bring the TextGrids
back by landing them at ``landing/<shard>/alignments/<utt_id>.TextGrid`` and materializing
``alignments`` with ``source: import``. Utterances with an empty transcript are not exported (MFA
cannot align them); they are listed in the result.

    speechdata mfa-corpus SHARD_ID [--out URL] [--data-root URL]
"""

from __future__ import annotations

import argparse
import io
import sys
from dataclasses import dataclass

import soundfile as sf

from speechdata.audio.codec import resample
from speechdata.audio.container import iter_container_audio
from speechdata.command_options import (
    add_data_root_option,
    data_root_from_args,
    require_key,
    take_positional_data_root,
)
from speechdata.io import layout
from speechdata.io.storage import DataRoot

MFA_SAMPLE_RATE = 16_000
EXIT_FAILED = 1


@dataclass(frozen=True)
class MfaCorpusExport:
    directory: str
    utterances: int
    audio_seconds: float
    skipped: dict[str, str]
    """``utt_id -> reason`` for utterances not exported."""


def export_mfa_corpus(
    data_root: DataRoot, shard_id: str, out: DataRoot | None = None, *, sample_rate: int = MFA_SAMPLE_RATE
) -> MfaCorpusExport:
    """Write the corpus under ``out``'s root (a local folder MFA can read), or by default under
    ``translation/mfa_corpus/<shard>/`` in the data root."""
    target, prefix = (out, "") if out is not None else (data_root, layout.mfa_corpus_dir(shard_id) + "/")
    index = data_root.read_parquet(layout.utterance_index(shard_id), columns=["utt_id", "text"])
    texts = dict(zip(index["utt_id"].to_pylist(), index["text"].to_pylist(), strict=True))
    skipped: dict[str, str] = {}
    exported, audio_seconds = 0, 0.0
    for utt_id, samples, rate in iter_container_audio(data_root, layout.normalized_audio(shard_id)):
        text = " ".join((texts.get(utt_id) or "").split())
        if not text:
            skipped[utt_id] = "empty_transcript"
            continue
        audio = resample(samples, rate, sample_rate)
        buffer = io.BytesIO()
        sf.write(buffer, audio, sample_rate, format="WAV", subtype="PCM_16")
        target.write_bytes(f"{prefix}{utt_id}.wav", buffer.getvalue())
        target.write_bytes(f"{prefix}{utt_id}.lab", (text + "\n").encode())
        exported += 1
        audio_seconds += samples.shape[0] / rate
    return MfaCorpusExport(target.uri(prefix.rstrip("/")), exported, audio_seconds, skipped)


DESCRIPTION = "Export a shard as a Montreal Forced Aligner corpus: <utt_id>.wav (16 kHz) and <utt_id>.lab."
EPILOG = """example:
  speechdata mfa-corpus granary-0001 --out /tmp/corpus --data-root "$DATA_ROOT"
  mfa align /tmp/corpus english_us_arpa english_us_arpa /tmp/aligned --clean

The data root used to be the first positional argument (DATA_ROOT SHARD_ID [OUT_DIR]); that form
still works for one release and prints a deprecation warning."""


def register(subparsers) -> None:
    """The speechdata mfa-corpus subcommand."""
    parser = subparsers.add_parser(
        "mfa-corpus",
        help="export a shard as an MFA corpus (<utt>.wav 16 kHz + <utt>.lab)",
        description=DESCRIPTION,
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    add_arguments(parser)
    parser.set_defaults(run=run)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("shard_id", metavar="SHARD_ID", help="the published shard to export")
    # The deprecated form "DATA_ROOT SHARD_ID [OUT_DIR]": run() shifts these when they are present.
    parser.add_argument("legacy_shard_id", nargs="?", help=argparse.SUPPRESS)
    parser.add_argument("legacy_out_dir", nargs="?", help=argparse.SUPPRESS)
    parser.add_argument(
        "--out", metavar="URL", help="the corpus folder (default: translation/mfa_corpus/<shard> in the data root)"
    )
    add_data_root_option(parser)


def main(argv: list[str] | None = None) -> int:
    """python -m speechdata.alignment.mfa_corpus: an alias of speechdata mfa-corpus."""
    parser = argparse.ArgumentParser(
        prog="python -m speechdata.alignment.mfa_corpus",
        description=DESCRIPTION,
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    add_arguments(parser)
    return run(parser.parse_args(argv))


def run(args: argparse.Namespace) -> int:
    try:
        if args.legacy_shard_id is not None:
            legacy_root, args.shard_id = args.shard_id, args.legacy_shard_id
            if args.legacy_out_dir is not None:
                if args.out is not None:
                    raise ValueError(f"two output folders: positional {args.legacy_out_dir!r} and --out {args.out!r}")
                args.out = args.legacy_out_dir
            take_positional_data_root(args, legacy_root, "mfa-corpus")
        require_key("shard", args.shard_id, "mfa-corpus")
        root = data_root_from_args(args, what="mfa-corpus")
        result = export_mfa_corpus(root, args.shard_id, DataRoot(args.out) if args.out else None)
    except (ValueError, OSError) as error:
        print(f"speechdata mfa-corpus: error: {error}", file=sys.stderr)
        return EXIT_FAILED
    print(
        f"exported {result.utterances} utterances ({result.audio_seconds / 3600:.3f} h) to {result.directory}; "
        f"skipped {len(result.skipped)}"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
