"""The ``alignments`` stage for one shard: align with a CTC model (parakeet), or import alignments.

Either way the shard gets one alignments table (word and token rows), one score row per aligned
utterance, and a ``alignments`` rejects ledger. Aligning also writes NeMo Forced Aligner-format CTM
files per utterance (words and tokens).

Memory stays bounded: audio is streamed from the shard's audio container, buffered per language
up to ``buffer_s`` seconds, and each buffer is aligned in length-sorted batches.
"""

from __future__ import annotations

import dataclasses
import functools
import posixpath
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass

import numpy as np
import pyarrow as pa

from speechdata.accounting.rejects import Reject, rejects_table
from speechdata.accounting.stage import StageSummary
from speechdata.alignment.forced import (
    MAX_ALIGNMENT_FRAME_TOKENS,
    AlignmentRejected,
    WildcardSettings,
    align_transcript,
    alignment_size_problem,
    expected_frames,
)
from speechdata.alignment.formats import (
    AlignmentFormatError,
    decode_ctm,
    decode_textgrid,
    read_ctm,
    read_textgrid,
    write_ctm,
)
from speechdata.alignment.greedy import (
    GREEDY_HYPOTHESES_SCHEMA,
    greedy_hypotheses_path,
    greedy_transcript,
    normalized_reference,
)
from speechdata.alignment.log_probs import CTC_FRAME_S, MODEL_SAMPLE_RATE, ForwardFn, LogProbSettings, compute_log_probs
from speechdata.alignment.pseudo_labels import (
    TEXT_SOURCE_ASR,
    TEXT_SOURCE_LANDED,
    PseudoLabel,
    needs_pseudo_label,
    pseudo_label,
)
from speechdata.alignment.segmentation import MAX_SEGMENT_MS, cut_segments
from speechdata.alignment.shard_inputs import AlignmentShardInputs, UtteranceAudio, read_utterance_rows
from speechdata.alignment.streamed_audio import StreamedAudio, model_audio
from speechdata.alignment.table import (
    UTTERANCE_SCORES_SCHEMA,
    TimedUnit,
    alignment_rows,
    alignments_table,
)
from speechdata.alignment.transcript_units import CharVocabulary, SubwordVocabulary, ctc_targets
from speechdata.audio.budget import MAX_LONG_FORM_SECONDS, OVER_BUDGET_REASON
from speechdata.audio.container import iter_container_payloads
from speechdata.io import layout
from speechdata.io.storage import TEMP_PREFIX, DataRoot, before_change

STAGE = "alignments"


@dataclass(frozen=True)
class CtcAligner:
    """What aligning one language needs: the model's forward, its vocabulary and frame length."""

    name: str
    forward: ForwardFn
    vocabulary: CharVocabulary | SubwordVocabulary
    frame_s: float
    emission_offsets_ms: tuple[int, int] = (0, 0)
    """The model's calibrated emission delay (start, end), added to every token's span."""


@dataclass
class _Pending:
    utt_id: str
    text: str | None
    audio_16k: np.ndarray | StreamedAudio
    duration_ms: int


class _ShardAlignmentWriter:
    """Collects rows, scores and rejects; writes CTM files as utterances finish."""

    def __init__(self, data_root: DataRoot, shard_id: str, write_ctm_files: bool):
        self.data_root, self.shard_id, self.write_ctm_files = data_root, shard_id, write_ctm_files
        self.rows: list[dict] = []
        self.scores: list[dict] = []
        self.rejects: list[Reject] = []
        self.hypotheses: list[dict] = []
        self.audio_seconds = 0.0
        self.ctm_written: dict[str, set[str]] = {"words": set(), "tokens": set()}

    def add(
        self,
        utt_id: str,
        aligner: str,
        words: list[TimedUnit],
        tokens: list[TimedUnit],
        score: float | None,
        n_frames: int,
        duration_s: float,
        untranscribed: list[tuple[int, int]] = (),
        segments: list[TimedUnit] = (),
        label: PseudoLabel | None = None,
    ) -> None:
        """``label``: the pseudo-label the words were aligned to (None: the landed text)."""
        self.rows += alignment_rows(utt_id, "word", words)
        self.rows += alignment_rows(utt_id, "token", tokens)
        self.rows += alignment_rows(utt_id, "segment", list(segments))
        self.scores.append(
            {
                "utt_id": utt_id,
                "aligner": aligner,
                "score": score,
                "n_words": len(words),
                "n_frames": n_frames,
                "untranscribed_ms": sum(end - start for start, end in untranscribed),
                "untranscribed": [{"start_ms": start, "end_ms": end} for start, end in untranscribed],
                "text_source": TEXT_SOURCE_LANDED if label is None else TEXT_SOURCE_ASR,
                "asr_text": None if label is None else label.text,
                "asr_confidence": None if label is None else label.confidence,
                "asr_word_confidences": None if label is None else label.word_confidences,
            }
        )
        self.audio_seconds += duration_s
        if self.write_ctm_files:
            self.data_root.write_bytes(
                layout.ctm(self.shard_id, "words", utt_id), write_ctm(utt_id, _ctm_units(words), "word").encode()
            )
            self.ctm_written["words"].add(utt_id)
            if tokens:
                self.ctm_written["tokens"].add(utt_id)
                self.data_root.write_bytes(
                    layout.ctm(self.shard_id, "tokens", utt_id), write_ctm(utt_id, tokens, "token").encode()
                )

    def _remove_stale_ctm_files(self) -> None:
        """CTMs of utterances this run did not align (gone after a re-landing, now rejected) and temps a
        killed run left must not outlive the run: the ctm/ folders hold exactly this run's files."""
        fs = self.data_root.fs
        for level in ("words", "tokens"):
            directory = self.data_root.path(posixpath.dirname(layout.ctm(self.shard_id, level, "x")))
            if not fs.exists(directory):
                continue
            for path in fs.ls(directory, detail=False):
                name = posixpath.basename(path)
                if name.startswith(TEMP_PREFIX) or name.removesuffix(".ctm") not in self.ctm_written[level]:
                    before_change(path)
                    fs.rm(path)

    def reject(self, utt_id: str, reason: str, detail: str) -> None:
        self.rejects.append(Reject(utt_id, STAGE, reason, detail))

    def hypothesis(
        self, utt_id: str, text: str, log_probs: np.ndarray, aligner: CtcAligner, language: str | None
    ) -> None:
        """The greedy transcript of log-probs already computed for alignment: the quality stage's
        transcript agreement, at no extra forward pass."""
        self.hypotheses.append(
            {
                "utt_id": utt_id,
                "hypothesis": greedy_transcript(log_probs, aligner.vocabulary),
                "reference": normalized_reference(text, aligner.vocabulary, language),
            }
        )

    def finish(self, rows_in: int, started: float) -> StageSummary:
        if self.write_ctm_files:
            self._remove_stale_ctm_files()
        table = alignments_table(self.rows)
        self.data_root.write_parquet(layout.alignments(self.shard_id), table)
        self.data_root.write_parquet(
            layout.alignment_scores(self.shard_id),
            pa.Table.from_pylist(sorted(self.scores, key=lambda r: r["utt_id"]), schema=UTTERANCE_SCORES_SCHEMA),
        )
        self.data_root.write_parquet(layout.rejects(self.shard_id, STAGE), rejects_table(self.rejects))
        # Written on every run (empty for imported alignments), so no earlier run's hypotheses linger.
        self.data_root.write_parquet(
            greedy_hypotheses_path(self.shard_id),
            pa.Table.from_pylist(sorted(self.hypotheses, key=lambda r: r["utt_id"]), schema=GREEDY_HYPOTHESES_SCHEMA),
        )
        return StageSummary(
            shard_id=self.shard_id,
            rows_in=rows_in,
            rows_out=len(self.scores),
            rejects=self.rejects,
            audio_seconds=self.audio_seconds,
            compute_seconds=time.perf_counter() - started,
            outputs={
                "alignments": self.data_root.uri(layout.alignments(self.shard_id)),
                "scores": self.data_root.uri(layout.alignment_scores(self.shard_id)),
                "rejects": self.data_root.uri(layout.rejects(self.shard_id, STAGE)),
                "greedy_hypotheses": self.data_root.uri(greedy_hypotheses_path(self.shard_id)),
            },
        )


def _ctm_units(words: list[TimedUnit]) -> list[TimedUnit]:
    return [w for w in words if w.text.strip()]


AudioItems = Iterator[tuple[str, int, int, Callable[[], np.ndarray]]]
"""``(utt_id, n_samples, sample_rate, audio_16k())`` in container order; ``audio_16k`` resamples (or
hands over the read-ahead's samples) only when the utterance is aligned."""


def _shard_inputs(
    data_root: DataRoot, shard_id: str, inputs: AlignmentShardInputs | None
) -> tuple[dict[str, dict], AudioItems]:
    if inputs is None:
        return read_utterance_rows(data_root, shard_id), _streamed_audio(data_root, shard_id)
    if inputs.shard_id != shard_id:
        raise ValueError(f"shard {shard_id}: given the inputs read for shard {inputs.shard_id}")
    return inputs.utterances, _pre_read_audio(inputs)


def _streamed_audio(data_root: DataRoot, shard_id: str) -> AudioItems:
    """From the container, row group by row group; decoded only when aligned, a long one in windows."""
    for utt_id, n_samples, rate, codec, data in iter_container_payloads(data_root, layout.normalized_audio(shard_id)):
        yield utt_id, n_samples, rate, functools.partial(model_audio, data, codec, rate, n_samples, MODEL_SAMPLE_RATE)


def _pre_read_audio(inputs: AlignmentShardInputs) -> AudioItems:
    """From the audio a GPU worker read and resampled ahead."""
    for item in inputs.audio:
        yield item.utt_id, item.n_samples, item.sample_rate, functools.partial(_resampled_ahead, inputs.shard_id, item)


def _resampled_ahead(shard_id: str, item: UtteranceAudio) -> np.ndarray:
    if item.audio_16k is None:
        raise ValueError(
            f"shard {shard_id}: utterance {item.utt_id!r} has an aligner but its audio was not read ahead "
            "(the inputs were read for a different set of model languages)"
        )
    return item.audio_16k


def run_alignments(
    data_root: DataRoot,
    shard_id: str,
    aligner_for: Callable[[str | None], CtcAligner | None],
    *,
    settings: LogProbSettings = LogProbSettings(),
    buffer_s: float = 1800.0,
    write_ctm_files: bool = True,
    on_progress: Callable[[int, int], None] | None = None,
    max_frame_tokens: int = MAX_ALIGNMENT_FRAME_TOKENS,
    inputs: AlignmentShardInputs | None = None,
    wildcard: WildcardSettings | None = None,
) -> StageSummary:
    """Force-align every normalized utterance of the shard with the aligner of its language.

    ``aligner_for(language)`` returns the language's aligner, or None when no model is configured
    (the utterance becomes a ``no_aligner_for_language`` reject). An utterance landed without text
    is aligned to the model's own greedy transcript (a pseudo-label, ``text_source`` ``asr`` in the
    scores table: speechdata.alignment.pseudo_labels), or becomes a ``no_words_recognized`` reject
    when that transcript is empty. An utterance whose frames x target
    tokens exceed ``max_frame_tokens`` becomes a ``too_long_to_align`` reject before its log-probs
    are computed (speechdata.alignment.forced); a long one within it is aligned in bounded memory.
    ``wildcard``: where a wildcard may explain stretches the transcript does not cover (reported per
    utterance in the scores' ``untranscribed`` column); None aligns every frame to the transcript.

    ``inputs``: the shard's transcripts and resampled audio already read (a GPU worker's read-ahead,
    :func:`speechdata.alignment.shard_inputs.read_alignment_inputs`); when None the audio streams
    from the container row group by row group. The outputs are the same either way.
    """
    started = time.perf_counter()
    utterances, audio = _shard_inputs(data_root, shard_id, inputs)
    writer = _ShardAlignmentWriter(data_root, shard_id, write_ctm_files)
    buffers: dict[str, list[_Pending]] = {}
    buffered_s: dict[str, float] = {}
    aligner_of = functools.cache(aligner_for)  # each language's aligner is built once
    done = 0
    total = 0

    def flush(language: str) -> None:
        nonlocal done
        pending = buffers.pop(language, [])
        buffered_s.pop(language, None)
        if not pending:
            return
        aligner = aligner_of(language)
        # Long audio is windowed on the model's own frame grid (40 ms for the small model, 80 ms for parakeet).
        model_settings = dataclasses.replace(settings, frame_s=aligner.frame_s)
        log_probs = compute_log_probs(aligner.forward, [p.audio_16k for p in pending], model_settings)
        frame_ms = int(round(aligner.frame_s * 1000))
        for item, lp in zip(pending, log_probs, strict=True):
            text_and_label = _text_to_align(writer, item, lp, aligner, language)
            if text_and_label is None:
                continue
            text, label = text_and_label
            try:
                result = align_transcript(
                    lp,
                    text,
                    aligner.vocabulary,
                    frame_ms,
                    item.duration_ms,
                    max_frame_tokens,
                    language=language,
                    emission_offsets_ms=aligner.emission_offsets_ms,
                    wildcard=wildcard,
                )
            except AlignmentRejected as exc:
                writer.reject(item.utt_id, exc.reason, f"{aligner.name}: {exc}")
                continue
            writer.add(
                item.utt_id,
                aligner.name,
                result.words,
                result.tokens,
                result.score,
                result.n_frames,
                item.duration_ms / 1000.0,
                untranscribed=result.untranscribed,
                # too long for one training sample: where to cut it (speechdata.alignment.segmentation)
                segments=cut_segments(result.words, item.duration_ms, result.untranscribed)
                if item.duration_ms > MAX_SEGMENT_MS
                else (),
                label=label,
            )
        done += len(pending)
        if on_progress:
            on_progress(done, total)

    for utt_id, n_samples, rate, audio_16k in audio:
        total += 1
        row = utterances.get(utt_id)
        if row is None:  # raw_shards and normalized_audio disagree: the index was re-written since
            writer.reject(utt_id, "not_in_utterance_index", "normalized audio has no index row")
            continue
        language = row["language"]
        aligner = aligner_of(language)
        problem = _alignment_problem(row, aligner, n_samples / rate, max_frame_tokens)
        if problem is not None:
            writer.reject(utt_id, *problem)
            continue
        buffers.setdefault(language, []).append(
            _Pending(utt_id, row["text"], audio_16k(), int(round(n_samples * 1000 / rate)))
        )
        buffered_s[language] = buffered_s.get(language, 0.0) + n_samples / rate
        if buffered_s[language] >= buffer_s:
            flush(language)
    for language in list(buffers):
        flush(language)
    return writer.finish(total, started)


def _text_to_align(
    writer: _ShardAlignmentWriter, item: _Pending, log_probs: np.ndarray, aligner: CtcAligner, language: str
) -> tuple[str, PseudoLabel | None] | None:
    """The landed text, or the model's pseudo-label where none landed; None when the model heard no word."""
    if not needs_pseudo_label(item.text):
        writer.hypothesis(item.utt_id, item.text, log_probs, aligner, language)
        return item.text, None
    # A transcript compared with itself says nothing: no greedy hypothesis for the quality stage.
    label = pseudo_label(log_probs, aligner.vocabulary)
    if not label.words:
        writer.reject(
            item.utt_id,
            "no_words_recognized",
            f"{aligner.name}: no text landed and the model's greedy transcript is empty",
        )
        return None
    return label.text, label


def _alignment_problem(
    row: dict, aligner: CtcAligner | None, duration_s: float, max_frame_tokens: int
) -> tuple[str, str] | None:
    """Why the utterance cannot be aligned, as ``(reason, detail)``; None when it can."""
    if aligner is None:
        return "no_aligner_for_language", f"no CTC model is configured for language {row['language']!r}"
    if duration_s > MAX_LONG_FORM_SECONDS:
        return (
            OVER_BUDGET_REASON,
            f"{duration_s:.1f} s of audio, over the alignment stage's long-form budget of {MAX_LONG_FORM_SECONDS:.0f} s",
        )
    if needs_pseudo_label(row["text"]):
        return None  # transcribed by the model once its log-probs are computed, then aligned
    targets = ctc_targets(row["text"], aligner.vocabulary, row["language"])
    if not targets.targets:
        return (
            "text_not_in_vocabulary",
            f"nothing in {row['text'][:80]!r} can be expressed in {aligner.name}'s vocabulary",
        )
    too_long = alignment_size_problem(
        expected_frames(duration_s, aligner.frame_s), len(targets.targets), max_frame_tokens
    )
    if too_long is not None:
        return "too_long_to_align", f"{aligner.name}: {too_long}"
    return None


def run_alignments_from_import(data_root: DataRoot, shard_id: str) -> StageSummary:
    """Read alignments landed beside the shard (``<utt_id>.ctm`` word CTM or ``<utt_id>.TextGrid``).

    An utterance with neither file, or with a file that cannot be read, becomes a reject whose
    detail names the file (and line, where the parser knows it).
    """
    started = time.perf_counter()
    utterances = read_utterance_rows(data_root, shard_id)
    container = data_root.read_parquet(layout.normalized_audio(shard_id), columns=["utt_id", "duration_s"])
    writer = _ShardAlignmentWriter(data_root, shard_id, write_ctm_files=False)
    directory = layout.landing_alignments_dir(shard_id)
    for utt_id, duration_s in zip(container["utt_id"].to_pylist(), container["duration_s"].to_pylist(), strict=True):
        ctm_path, grid_path = f"{directory}/{utt_id}.ctm", f"{directory}/{utt_id}.TextGrid"
        try:
            if data_root.exists(ctm_path):
                source = data_root.uri(ctm_path)
                text = decode_ctm(data_root.fs.cat_file(data_root.path(ctm_path)), source)
                words = read_ctm(text, source, "word").get(utt_id, [])
                aligner = "import:ctm"
            elif data_root.exists(grid_path):
                source = data_root.uri(grid_path)
                words = read_textgrid(decode_textgrid(data_root.fs.cat_file(data_root.path(grid_path)), source), source)
                aligner = "import:textgrid"
            else:
                writer.reject(utt_id, "no_imported_alignment", f"neither {ctm_path} nor {grid_path} exists")
                continue
        except AlignmentFormatError as exc:
            writer.reject(utt_id, "malformed_alignment_file", str(exc))
            continue
        text = (utterances.get(utt_id) or {}).get("text") or ""
        words = _match_transcript_words(text, words)
        if words is None:
            writer.reject(
                utt_id,
                "alignment_does_not_match_transcript",
                f"the imported words do not spell the transcript {text[:80]!r}",
            )
            continue
        writer.add(utt_id, aligner, words, [], None, int(np.ceil(duration_s / CTC_FRAME_S)), duration_s)
    return writer.finish(container.num_rows, started)


def _match_transcript_words(text: str, imported: list[TimedUnit]) -> list[TimedUnit] | None:
    """Imported words re-labelled with the transcript's words, or None when the counts differ.

    Aligners drop punctuation and change case, so words are matched by position; a transcript
    word the aligner dropped entirely is not recoverable, and the utterance is rejected.
    """
    words = text.split()
    if len(words) != len(imported):
        return None
    return [TimedUnit(w, u.start_ms, u.end_ms, u.score) for w, u in zip(words, imported, strict=True)]
