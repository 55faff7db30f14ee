"""``speechdata export nemo|lhotse|moshi``: the command-line side of the exports.

``register(subparsers)`` adds ``export`` to the ``speechdata`` CLI; ``python -m speechdata.export``
builds its own parser with it. Filters are the catalog CLI's and reach the export as typed values
(never text in a query). Progress goes to stderr; errors print one line and exit with status 2.
"""

from __future__ import annotations

import argparse
import sys
import textwrap

from speechdata.command_options import (
    add_data_root_option,
    add_quiet_option,
    data_root_from_args,
    finite_float,
    positive_int,
    progress_enabled,
)
from speechdata.export.output import ExportError
from speechdata.export.selection import SampleFilter

EXIT_ERROR = 2

_EXAMPLES = {
    "nemo": "speechdata export nemo --data-root .data --out /tmp/nemo-en --language en --min-score -2.5\n"
    "  # -> /tmp/nemo-en/audio_0.tar ..., tarred_audio_manifest.json, sharded_manifests/manifest_0.json ...\n"
    "speechdata export nemo --data-root s3://bucket/root --out /tmp/nemo-plain --plain\n"
    "  # -> /tmp/nemo-plain/manifest.json + audio/<shard>/<key>.wav",
    "lhotse": "speechdata export lhotse --data-root .data --out /tmp/shar --language en\n"
    "  # CutSet.from_shar(in_dir='/tmp/shar/shar'); cut.load_qwen(), cut.load_wavlm(), cut.load_grid() ...",
    "moshi": "speechdata export moshi --data-root .data --out /tmp/moshi --language en\n"
    "  # -> /tmp/moshi/dataset.jsonl + audio/<shard>/<key>.wav (stereo, speech left) + <key>.json",
}


def _common(parser: argparse.ArgumentParser) -> None:
    add_data_root_option(parser)
    parser.add_argument("--out", required=True, metavar="DIR", help="local output directory (replaced atomically)")
    parser.add_argument("--language", action="append", help="keep this language (repeatable)")
    parser.add_argument("--country", action="append", help="keep this country (repeatable)")
    parser.add_argument("--min-score", type=finite_float, help="minimum alignment_score (inclusive)")
    parser.add_argument("--min-duration", type=finite_float, help="minimum duration in s (inclusive)")
    parser.add_argument("--max-duration", type=finite_float, help="maximum duration in s (inclusive)")
    quality = parser.add_argument_group("quality filters (shards/<shard>/quality.parquet; unmeasured fails)")
    quality.add_argument("--max-cer", type=finite_float, help="maximum greedy-CTC character error rate (inclusive)")
    quality.add_argument("--max-wer", type=finite_float, help="maximum greedy-CTC word error rate (inclusive)")
    quality.add_argument("--min-snr", type=finite_float, help="minimum WADA-SNR estimate in dB (inclusive)")
    quality.add_argument("--min-bandwidth", type=finite_float, help="minimum effective bandwidth in Hz (inclusive)")
    quality.add_argument("--min-mos", type=finite_float, help="minimum MOS estimate, 1-5 (inclusive)")
    quality.add_argument(
        "--language-confirmed", action="store_true", help="only samples whose text LID agrees with the landed language"
    )
    add_quiet_option(parser)


def register(subparsers) -> argparse.ArgumentParser:
    """Add export (with nemo, lhotse, moshi) to an add_subparsers() object."""
    export = subparsers.add_parser(
        "export",
        help="write published samples in a trainer's own layout (NeMo, Lhotse Shar, moshi-finetune)",
        description="Write the published samples of a data root in a trainer's own layout.",
        epilog="examples:\n" + textwrap.indent("\n".join(_EXAMPLES.values()), "  "),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    kinds = export.add_subparsers(dest="export_kind", required=True, metavar="{nemo,lhotse,moshi}")
    nemo = kinds.add_parser(
        "nemo",
        help="NeMo tarred audio dataset (or a plain JSONL manifest with --plain)",
        description="NeMo ASR data: audio_<n>.tar + tarred_audio_manifest.json + sharded_manifests/ "
        "(TarredAudioToCharDataset/BPEDataset, Lhotse's LazyNeMoTarredIterator), or with --plain "
        "manifest.json + audio/ (AudioToCharDataset).",
        epilog="example:\n" + textwrap.indent(_EXAMPLES["nemo"], "  "),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    _common(nemo)
    nemo.add_argument("--plain", action="store_true", help="WAV files and manifest.json instead of tars")
    nemo.add_argument("--samples-per-tar", type=positive_int, default=1000, help="samples per audio_<n>.tar")
    lhotse = kinds.add_parser(
        "lhotse",
        help="Lhotse Shar: cuts, recordings, qwen/wavlm/tokens/grid/dur arrays",
        description="Lhotse Shar read by CutSet.from_shar; arrays load with cut.load_<field>().",
        epilog="example:\n" + textwrap.indent(_EXAMPLES["lhotse"], "  "),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    _common(lhotse)
    lhotse.add_argument("--samples-per-shard", type=positive_int, default=1000, help="cuts per Shar shard")
    moshi = kinds.add_parser(
        "moshi",
        help="moshi-finetune: dataset.jsonl + stereo 24 kHz WAV + alignments JSON",
        description="kyutai-labs/moshi-finetune's layout: JSONL of {path, duration}, stereo 24 kHz WAV "
        "(speech on channel 0, the main speaker), <audio>.json with word alignments.",
        epilog="example:\n" + textwrap.indent(_EXAMPLES["moshi"], "  "),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    _common(moshi)
    moshi.add_argument("--absolute-paths", action="store_true", help="absolute paths in dataset.jsonl")
    for parser in (nemo, lhotse, moshi):
        parser.set_defaults(run=run_export)
    return export


def run_export(args: argparse.Namespace) -> int:
    from speechdata.export.lhotse import export_lhotse
    from speechdata.export.moshi import export_moshi
    from speechdata.export.nemo import export_nemo

    try:
        selection = SampleFilter(
            languages=tuple(args.language) if args.language else None,
            countries=tuple(args.country) if args.country else None,
            min_alignment_score=args.min_score,
            min_duration_s=args.min_duration,
            max_duration_s=args.max_duration,
            max_cer=args.max_cer,
            max_wer=args.max_wer,
            min_snr_db=args.min_snr,
            min_bandwidth_hz=args.min_bandwidth,
            min_mos=args.min_mos,
            language_confirmed=args.language_confirmed,
        )
        root = data_root_from_args(args, what=f"export {args.export_kind}")
        progress = progress_enabled(args.quiet)
        if args.export_kind == "nemo":
            result = export_nemo(
                root,
                args.out,
                selection,
                tarred=not args.plain,
                samples_per_tar=args.samples_per_tar,
                progress=progress,
            )
        elif args.export_kind == "lhotse":
            result = export_lhotse(
                root, args.out, selection, samples_per_shard=args.samples_per_shard, progress=progress
            )
        else:
            result = export_moshi(root, args.out, selection, absolute_paths=args.absolute_paths, progress=progress)
    except (ExportError, ValueError, OSError) as error:
        print(f"export {args.export_kind}: error: {error}", file=sys.stderr)
        return EXIT_ERROR
    print(f"wrote {result.samples} samples ({result.audio_s / 3600:.4f} h) to {result.out_dir}")
    return 0
