"""Where every product lives under the data root (docs/storage-layout.md).

All paths are relative to the data root and use forward slashes, so the same layout works on a
local directory and on object storage (``s3://bucket/prefix``). Every key in a path is checked by
:mod:`speechdata.io.keys` (whose names are re-exported here, where callers have found them).
"""

from __future__ import annotations

import re

from speechdata.io.keys import (
    ANY_KEY,
    KEY_KINDS,
    KEY_PLACEHOLDER,
    NAME_PATTERN,
    PARTITION_VALUE_PATTERN,
    SHARD_ID_PATTERN,
    UTT_ID_PATTERN,
    ConfinementError,
    InvalidKey,
    is_valid_key,
    key_segment,
    validate_key,
)

__all__ = [
    "ANY_KEY",
    "KEY_KINDS",
    "KEY_PLACEHOLDER",
    "NAME_PATTERN",
    "PARTITION_VALUE_PATTERN",
    "SHARD_ID_PATTERN",
    "UTT_ID_PATTERN",
    "ConfinementError",
    "InvalidKey",
    "is_valid_key",
    "validate_key",
]


def _shard(shard_id: str) -> str:
    return key_segment("shard", shard_id)


def _utt(utt_id: str) -> str:
    return key_segment("utterance", utt_id)


def _name(name: str) -> str:
    return key_segment("name", name)


def _country(country: str) -> str:
    return key_segment("country", country)


def _language(language: str) -> str:
    return key_segment("language", language)


def _dataset(dataset: str) -> str:
    return key_segment("dataset", dataset)


LANDING = "landing"
SHARDS = "shards"

METADATA_FILE = "metadata.parquet"
AUDIO_DIR = "audio"
AUDIO_TAR = "audio.tar"
SUCCESS_MARKER = "_SUCCESS"


def is_valid_shard_id(shard_id: str) -> bool:
    return is_valid_key("shard", shard_id)


def landing_dir(shard_id: str) -> str:
    return f"{LANDING}/{_shard(shard_id)}"


def landing_metadata(shard_id: str) -> str:
    return f"{LANDING}/{_shard(shard_id)}/{METADATA_FILE}"


def landing_success_marker(shard_id: str) -> str:
    return f"{LANDING}/{_shard(shard_id)}/{SUCCESS_MARKER}"


def landing_audio_dir(shard_id: str) -> str:
    return f"{LANDING}/{_shard(shard_id)}/{AUDIO_DIR}"


def landing_audio_tar(shard_id: str) -> str:
    return f"{LANDING}/{_shard(shard_id)}/{AUDIO_TAR}"


def shard_dir(shard_id: str) -> str:
    return f"{SHARDS}/{_shard(shard_id)}"


def shard_file(shard_id: str, name: str) -> str:
    """A per-shard product's file beside the shard's other products (``shards/<shard>/<name>``): where
    a new product line's output goes, so it needs no folder of its own at the top of the root."""
    return f"{SHARDS}/{_shard(shard_id)}/{_name(name)}"


def utterance_index(shard_id: str) -> str:
    """One row per utterance that passed the landing contract, with its probed audio header."""
    return f"{SHARDS}/{_shard(shard_id)}/utterances.parquet"


def normalized_audio(shard_id: str) -> str:
    """The shard's 24 kHz mono audio: one parquet file, one FLAC-encoded row per utterance."""
    return f"{SHARDS}/{_shard(shard_id)}/audio_24k.parquet"


def rejects_dir(shard_id: str) -> str:
    return f"{SHARDS}/{_shard(shard_id)}/rejects"


def rejects(shard_id: str, stage: str) -> str:
    return f"{SHARDS}/{_shard(shard_id)}/rejects/{_name(stage)}.parquet"


def alignments(shard_id: str) -> str:
    """Word and token spans of every aligned utterance of the shard (:mod:`speechdata.alignment.table`)."""
    return f"{SHARDS}/{_shard(shard_id)}/alignments.parquet"


def alignment_scores(shard_id: str) -> str:
    """One row per aligned utterance: aligner and mean frame log-prob on the path."""
    return f"{SHARDS}/{_shard(shard_id)}/alignment_scores.parquet"


def ctm(shard_id: str, level: str, utt_id: str) -> str:
    """NeMo Forced Aligner-format CTM of one utterance, ``level`` = ``words`` or ``tokens``."""
    return f"{SHARDS}/{_shard(shard_id)}/ctm/{_name(level)}/{_utt(utt_id)}.ctm"


def landing_alignments_dir(shard_id: str) -> str:
    """Alignments made elsewhere, landed beside the shard: ``<utt_id>.ctm`` or ``<utt_id>.TextGrid``."""
    return f"{LANDING}/{_shard(shard_id)}/alignments"


def frame_grids(shard_id: str) -> str:
    """Per utterance ``tokens [T]``, ``grid [F]``, ``dur [T]`` (int32 lists) and counts."""
    return f"{SHARDS}/{_shard(shard_id)}/frame_grids.parquet"


def qwen_hidden_states(shard_id: str) -> str:
    """float16 ``[T, hidden]`` per utterance (:mod:`speechdata.features.array_store`)."""
    return f"{SHARDS}/{_shard(shard_id)}/qwen_hidden_states.parquet"


def wavlm_features(shard_id: str) -> str:
    """float16 ``[F, hidden]`` per utterance (:mod:`speechdata.features.array_store`)."""
    return f"{SHARDS}/{_shard(shard_id)}/wavlm_features.parquet"


BRIDGE = "bridge"


BRIDGE_TAR_DIGEST_CHARS = 16
"""Hex digits of the tar's sha256 in its name: a new version never takes an old version's name."""


def bridge_tar(shard_id: str, number: int, sha256: str) -> str:
    """WebDataset tar ``number`` of the shard's bridge samples, named by its content.

    ``bridge/<shard>-NNNNNN-<first 16 hex of the tar's sha256>.tar``: a re-run that packs different
    bytes writes new names, so the tars the published manifest names stay in place until a new
    manifest replaces it; identical bytes get the identical name (re-runs stay byte-identical).
    """
    return f"{BRIDGE}/{_shard(shard_id)}-{number:06d}-{sha256[:BRIDGE_TAR_DIGEST_CHARS]}.tar"


def is_bridge_tar_of(shard_id: str, name: str) -> bool:
    """``name`` (a file name in ``bridge/``) is one of ``shard_id``'s tars, never another shard's
    (shard ``a`` must not claim ``a-b-000000-….tar``); unversioned ``<shard>-NNNNNN.tar`` names of
    older roots count too."""
    pattern = rf"{re.escape(shard_id)}-\d{{6}}(-[0-9a-f]{{{BRIDGE_TAR_DIGEST_CHARS}}})?\.tar"
    return re.fullmatch(pattern, name) is not None


def bridge_staging_dir(shard_id: str) -> str:
    """Where ``bridge_tars`` stages a shard's new tars and index until ``shard_manifest`` commits them."""
    return f"{SHARDS}/{_shard(shard_id)}/bridge_staged"


def staged_bridge_tar(shard_id: str, number: int) -> str:
    return f"{SHARDS}/{_shard(shard_id)}/bridge_staged/{_shard(shard_id)}-{number:06d}.tar"


def staged_bridge_index(shard_id: str) -> str:
    """Written last by ``bridge_tars``, after its tars read back: its presence means "ready to commit"."""
    return f"{SHARDS}/{_shard(shard_id)}/bridge_staged/bridge_index.parquet"


def bridge_index(shard_id: str) -> str:
    """Where each packed sample is: ``key``, ``tar_url``, ``offset``, ``size`` (and the tars' sha256)."""
    return f"{SHARDS}/{_shard(shard_id)}/bridge_index.parquet"


MANIFESTS = "manifests"


def shard_manifest(shard_id: str) -> str:
    """The shard's bridge manifest (``speechdata.bridge.manifest``): one row per packed sample, the
    bridge product line's output, hive-partitioned by shard so one glob reads every shard's."""
    return f"{MANIFESTS}/shard={_shard(shard_id)}/part-0.parquet"


def catalog_database() -> str:
    """The DuckDB catalog over every shard manifest."""
    return "catalog.duckdb"


HF = "hf"


def hf_dataset_dir(dataset: str) -> str:
    """A Hugging Face dataset in the Hub's layout: ``README.md`` (card) + ``<config>/<split>-NNNNN-of-NNNNN.parquet``."""
    return f"{HF}/{_dataset(dataset)}"


def hf_dataset_file(dataset: str, path_in_repo: str) -> str:
    return f"{HF}/{_dataset(dataset)}/{path_in_repo}"


def hf_build_dir(dataset: str, country: str) -> str:
    """Where a split's parquet files are written before they replace the published ones."""
    return f"{HF}/_build/{_dataset(dataset)}/{_country(country)}"


def hf_state_database(dataset: str, country: str) -> str:
    """The country's publishing state (:mod:`speechdata.hf.state`): recordings, segments, files."""
    return f"{HF}/_state/{_dataset(dataset)}/{_country(country)}.duckdb"


HF_PUBLISHED_PREFIX = "published-"
"""Every per-shard published index's name starts with it, so a writer's temp file (``._tmp-...``)
never matches :func:`hf_published_index_parts`."""


def hf_published_index_parts(shard_id: str) -> str:
    """Every country's published index of the shard (a glob over ``published-<country>.parquet``,
    :mod:`speechdata.hf.shard_paths`): the ``hf`` product line's output."""
    return f"{SHARDS}/{_shard(shard_id)}/hf/{HF_PUBLISHED_PREFIX}*.parquet"


# --- translation ----------------------------------------------------------------------

TRANSLATION = "translation"


def landing_segmentation_dir(shard_id: str) -> str:
    """LLM segmentation inputs landed beside the shard: one ``<utt_id>.json`` per utterance."""
    return f"{LANDING}/{_shard(shard_id)}/segmentation"


def mfa_corpus_dir(shard_id: str) -> str:
    """The shard exported for the Montreal Forced Aligner: ``<utt_id>.wav`` + ``<utt_id>.lab``."""
    return f"{TRANSLATION}/mfa_corpus/{_shard(shard_id)}"


def streaming_segments(shard_id: str) -> str:
    """One row per (utterance, latency level, emitted segment) of the shard."""
    return f"{TRANSLATION}/segments/shard={_shard(shard_id)}/segments.parquet"


def streaming_segments_json(shard_id: str, utt_id: str) -> str:
    """One utterance's streaming segments in the original per-utterance JSON format."""
    return f"{TRANSLATION}/segments/shard={_shard(shard_id)}/json/{_utt(utt_id)}.json"


def metricx_input(shard_id: str) -> str:
    """The shard's segments flattened to MetricX JSONL (``source``, ``hypothesis``, metadata)."""
    return f"{TRANSLATION}/qe/shard={_shard(shard_id)}/metricx_input.jsonl"


def metricx_output(shard_id: str) -> str:
    """MetricX JSONL with a ``prediction`` (error score in [0, 25], lower is better) per line."""
    return f"{TRANSLATION}/qe/shard={_shard(shard_id)}/metricx_output.jsonl"


def qe_scores(shard_id: str) -> str:
    """The scored segments as a table (the MetricX output's columns)."""
    return f"{TRANSLATION}/qe/shard={_shard(shard_id)}/scores.parquet"


def streaming_pairs_jsonl(shard_id: str) -> str:
    """Segments whose QE score passed the threshold, as JSONL."""
    return f"{TRANSLATION}/pairs/shard={_shard(shard_id)}/pairs.jsonl"


def streaming_pairs(shard_id: str) -> str:
    """Segments whose QE score passed the threshold, as parquet."""
    return f"{TRANSLATION}/pairs/shard={_shard(shard_id)}/pairs.parquet"


ASR = "asr"


ASR_FLAC_DIGEST_CHARS = 16
"""Hex characters of the PCM's SHA-1 in a FLAC's name: new samples always get a new file."""


def asr_flac_dir(shard_id: str) -> str:
    """Every FLAC of one shard, of every version still named by a published table."""
    return f"{ASR}/flac/{_shard(shard_id)}"


def asr_flac(shard_id: str, utt_id: str, audio_sha1: str) -> str:
    """One utterance's 16 kHz mono FLAC for ASR training (the file NeMo manifests point at), named by
    its content so a rewrite never changes the bytes under a name a published manifest holds. A long
    recording's segment is named by its key ``<utt_id>+<4 digits>`` (docs/asr-data.md)."""
    return f"{asr_flac_dir(shard_id)}/{_utt_or_segment(utt_id)}-{audio_sha1[:ASR_FLAC_DIGEST_CHARS]}.flac"


_SEGMENT_INDEX = re.compile(r"^[0-9]{4,9}$")


def _utt_or_segment(key: str) -> str:
    utt_id, separator, index = key.partition("+")
    if separator and not _SEGMENT_INDEX.match(index):
        raise ValueError(f"refusing segment key {key!r}: its index {index!r} must be 4 to 9 digits")
    return _utt(utt_id) + separator + index


def asr_flac_index(shard_id: str) -> str:
    """One row per extracted FLAC: ``utt_id``, ``flac_path``, ``n_samples``, ``duration_s``, ``audio_sha1``."""
    return f"{SHARDS}/{_shard(shard_id)}/asr_flac.parquet"


def asr_manifest(split: str, suffix: str = "parquet") -> str:
    """The ASR training manifests: ``split`` is ``train``, ``validation`` or ``eval``; ``suffix``
    ``parquet`` (every column) or ``jsonl`` (NeMo: ``audio_filepath``, ``duration``, ``text``, ``lang``)."""
    return f"{ASR}/manifests/{_name(split)}.{suffix}"


def asr_manifest_removed() -> str:
    """Every utterance the ASR manifest build left out, with the filter that removed it."""
    return f"{ASR}/manifests/removed.parquet"


ASR_MANIFEST_PART_KINDS = ("train", "validation", "removed")


def asr_manifest_part(split: str, shard_id: str, suffix: str = "parquet") -> str:
    """One shard's rows of a manifest (``split``: ``train``, ``validation`` or ``removed``): the
    published parts the corpus-wide files are concatenated from, rewritten only when that shard's
    rows change."""
    return f"{ASR}/manifests/parts/{_name(split)}/{_shard(shard_id)}.{suffix}"


def asr_manifest_prepared(shard_id: str) -> str:
    """One shard's rows after the per-shard steps of the manifest build (corrections, filters,
    cleaning, keys): what a later build reads instead of the shard's inputs while they are unchanged."""
    return f"{ASR}/prepared/{_shard(shard_id)}.parquet"


def asr_manifest_state() -> str:
    """The incremental manifest build's state (SQLite): each shard's input version, the keys
    deduplication looks up, kept recordings, eval candidates."""
    return "_state/asr_manifest.sqlite"


def asr_language_corrections() -> str:
    """The default language-tag corrections table (``utt_id`` or ``recording_id`` -> ``language``)."""
    return f"{ASR}/language_corrections.parquet"


def landing_vad_segments(shard_id: str) -> str:
    """Speech segments computed elsewhere, landed beside the shard (``audio_path``, ``start_s``/``end_s`` lists)."""
    return f"{LANDING}/{_shard(shard_id)}/vad_segments.parquet"


def vad_segments(shard_id: str) -> str:
    """One row per audio file of the shard: its speech segments, language and streaming tar key."""
    return f"{SHARDS}/{_shard(shard_id)}/vad_segments.parquet"


PACKED_AUDIO_TAR_DIGEST_CHARS = 16
"""Hex digits of the packed tar's sha256 in its name: a re-packed shard never takes an old tar's name."""


def packed_audio_tar(shard_id: str, sha256: str) -> str:
    """The landed audio files of a shard that landed them as a directory, packed for streaming and
    named by content (``shards/<shard>/audio-<sha16>.tar``), so the tar a published
    ``vad_segments.parquet`` or language index names keeps the bytes it described."""
    return f"{SHARDS}/{_shard(shard_id)}/audio-{sha256[:PACKED_AUDIO_TAR_DIGEST_CHARS]}.tar"


def packed_audio_tar_staging(shard_id: str) -> str:
    """Where ``vad_segments`` packs a shard's tar before it knows the content's name."""
    return f"{SHARDS}/{_shard(shard_id)}/audio-staged.tar"


def is_packed_audio_tar_name(name: str) -> bool:
    """``name`` (a file name in ``shards/<shard>/``) is a packed tar: content-named, or the single
    ``audio.tar`` of older roots."""
    return re.fullmatch(rf"audio(-[0-9a-f]{{{PACKED_AUDIO_TAR_DIGEST_CHARS}}})?\.tar", name) is not None


LANGUAGE_INDEX = "language_index"


def language_shard_index(language: str) -> str:
    """The single-file form of a language's index (every shard in one file), as earlier builds and
    :func:`speechdata.vad.language_index.build_language_shard_index` callers write it; the
    incremental build writes :func:`language_shard_index_part` files and removes this one."""
    return f"{LANGUAGE_INDEX}/language={_language(language)}/part-0.parquet"


def language_shard_index_dir(language: str) -> str:
    """Every part of one language's index (a hive partition: ``language_index/*/*.parquet``)."""
    return f"{LANGUAGE_INDEX}/language={_language(language)}"


def language_shard_index_part(language: str, shard_id: str) -> str:
    """One shard's rows of one language's index, written only when that shard's inputs change."""
    return f"{language_shard_index_dir(language)}/shard-{_shard(shard_id)}.parquet"


LANGUAGE_INDEX_STATE = "_state/language_index"


def language_shard_index_state(language: str) -> str:
    """Per shard: the version of its inputs the language's index part was built from, and its totals."""
    return f"{LANGUAGE_INDEX_STATE}/language={_language(language)}.parquet"


# --- near duplicates ------------------------------------------------------------------

NEAR_DUPLICATES_INDEX = "index/near_duplicates"


def near_duplicates(shard_id: str) -> str:
    """One row per utterance of the shard that copies an utterance indexed before it (docs/near-duplicates.md)."""
    return f"{SHARDS}/{_shard(shard_id)}/near_duplicates.parquet"


def near_duplicates_index_order() -> str:
    """The corpus index's shards in the order they were indexed: the index's commit point."""
    return f"{NEAR_DUPLICATES_INDEX}/shards.parquet"


def near_duplicates_index_entries(shard_id: str, version: str) -> str:
    """One indexed shard's signals (exact hash, audio fingerprint, transcript MinHash, representative),
    named by a ``version`` the order file points at, so a re-indexed shard never overwrites the file
    the committed order still names."""
    return f"{NEAR_DUPLICATES_INDEX}/entries/{_shard(shard_id)}-{_name(version)}.parquet"


def near_duplicates_index_entries_dir() -> str:
    return f"{NEAR_DUPLICATES_INDEX}/entries"


def near_duplicates_index_entries_written(shard_id: str) -> str:
    """The versions of one shard's entries files written since its last commit cleaned them up (the
    files its commit removes, but the one it commits: no listing of the entries folder)."""
    return f"{NEAR_DUPLICATES_INDEX}/entries_written/{_shard(shard_id)}.json"


# --- the root's top level ---------------------------------------------------------------

INDEX = "index"
STATE = "_state"
LOCKS = "_locks"
CATALOG_FILES = ("catalog.duckdb", ".catalog.duckdb.refresh-lock", ".catalog.duckdb.state")

PRODUCT_FOLDERS = (LANDING, SHARDS, BRIDGE, MANIFESTS, ASR, LANGUAGE_INDEX, TRANSLATION, HF, INDEX, STATE, LOCKS)
"""Every folder at the top of the data root. None may be a symlink out of the root (the link rule of
:class:`speechdata.io.storage.DataRoot`); a stage that writes a new top-level folder adds it here, and
the confinement test (``tests/integration/test_attacks_confinement_everywhere.py``) links it out."""
