"""Export a shard as a Montreal Forced Aligner corpus: ``<utt_id>.wav`` + ``<utt_id>.lab`` per utterance.

For people who run MFA themselves::

    mfa align <corpus_dir> english_us_arpa english_us_arpa <output_dir> --clean

The audio is the shard's normalized audio (cut to the utterance, mono) as 16-bit WAV at 16 kHz
(MFA's acoustic models' rate), so the TextGrids' times are relative to the utterance's own audio,
the alignments table's convention. The ``.lab`` is the transcript on one line. Bring the TextGrids
back by landing them at ``landing/<shard>/alignments/<utt_id>.TextGrid`` and materializing
``alignments`` with ``source: import``. Utterances with an empty transcript are not exported (MFA
cannot align them); they are listed in the result.

    python -m speechdata.alignment.mfa_corpus DATA_ROOT SHARD_ID [OUT_DIR]
"""

from __future__ import annotations

import argparse
import io
from dataclasses import dataclass

import soundfile as sf

from speechdata.audio.codec import resample
from speechdata.audio.container import iter_container_audio
from speechdata.io import layout
from speechdata.io.storage import DataRoot

MFA_SAMPLE_RATE = 16_000


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


DESCRIPTION = __doc__.splitlines()[0]
EPILOG = """example:
  speechdata mfa-corpus "$DATA_ROOT" granary-0001 /tmp/corpus   # then: mfa align /tmp/corpus ..."""


def register(subparsers) -> None:
    """The ``speechdata mfa-corpus`` subcommand."""
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
    parser.add_argument("data_root", help="the platform's data root (path or fsspec URL)")
    parser.add_argument("shard_id")
    parser.add_argument("out_dir", nargs="?", help="default: translation/mfa_corpus/<shard> in the data root")


def main(argv: list[str] | None = None) -> int:
    """``python -m speechdata.alignment.mfa_corpus``: an alias of ``speechdata mfa-corpus``."""
    parser = argparse.ArgumentParser(prog="python -m speechdata.alignment.mfa_corpus", description=DESCRIPTION)
    add_arguments(parser)
    return run(parser.parse_args(argv))


def run(args: argparse.Namespace) -> int:
    result = export_mfa_corpus(
        DataRoot(args.data_root), args.shard_id, DataRoot(args.out_dir) if args.out_dir else None
    )
    print(
        f"exported {result.utterances} utterances ({result.audio_seconds / 3600:.3f} h) to {result.directory}; "
        f"skipped {len(result.skipped)}"
    )
    return 0


if __name__ == "__main__":
    import sys

    sys.exit(main())
