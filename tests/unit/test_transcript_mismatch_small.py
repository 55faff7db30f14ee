"""``transcript_mismatch`` has teeth in the ``small`` profile: a swapped transcript and audio cut short fail it.

Planted on the committed held-out speech (tests/fixtures/synthesized_speech/): the CER is computed
as the quality stage computes it, from the aligner's greedy transcript and the landed text
normalized through the aligner's vocabulary, and decided by the small profile's default policies.
"""

import json
from pathlib import Path

import jiwer
import pytest
import soundfile as sf

from resources.aligner import CtcAlignerResource, profile_alignment_models
from speechdata.alignment.greedy import greedy_transcript, normalized_reference
from speechdata.alignment.log_probs import compute_log_probs
from speechdata.quality.policy import decide, default_policies

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "synthesized_speech"


@pytest.fixture(scope="module")
def english(tmp_path_factory):
    resource = CtcAlignerResource(
        models=profile_alignment_models("small"), device="cpu", model_cache_dir=str(tmp_path_factory.mktemp("m"))
    )
    entries = [e for e in json.loads((FIXTURES / "heldout.json").read_text()) if e["language"] == "en"][:4]
    for entry in entries:
        entry["audio"], _ = sf.read(FIXTURES / f"{entry['utt_id']}.flac", dtype="float32")
    return resource.aligner_for("en"), entries


def cer(aligner, audio, text) -> float:
    [log_probs] = compute_log_probs(aligner.forward, [audio])
    return float(
        jiwer.cer(normalized_reference(text, aligner.vocabulary), greedy_transcript(log_probs, aligner.vocabulary))
    )


def verdicts(row: dict) -> dict[str, tuple[str, str] | None]:
    return {product: decide(row, policy) for product, policy in default_policies("small").items() if policy.max_cer}


def test_the_right_transcript_passes(english):
    aligner, entries = english
    for entry in entries:
        row = {"language": "en", "cer": cer(aligner, entry["audio"], entry["text"])}
        assert all(v is None for v in verdicts(row).values()), (entry["utt_id"], row)


def test_a_swapped_transcript_is_a_transcript_mismatch(english):
    aligner, entries = english
    for entry, other in zip(entries, entries[1:] + entries[:1], strict=True):
        row = {"language": "en", "cer": cer(aligner, entry["audio"], other["text"])}
        for product, verdict in verdicts(row).items():
            assert verdict is not None and verdict[0] == "transcript_mismatch", (product, entry["utt_id"], row)


def test_audio_cut_short_is_a_transcript_mismatch(english):
    """Two thirds of the audio cut off: even a perfect model's CER is then 2/3, above the 0.6 limit.
    (Cut in half, a perfect model's CER is 0.5: a model that transcribes well keeps such audio under
    the limit, and catching it is the speaking-rate filter's job, docs/quality.md.)"""
    aligner, entries = english
    for entry in entries:
        kept = entry["audio"][: len(entry["audio"]) // 3]
        row = {"language": "en", "cer": cer(aligner, kept, entry["text"])}
        for product, verdict in verdicts(row).items():
            assert verdict is not None and verdict[0] == "transcript_mismatch", (product, entry["utt_id"], row)


def test_only_the_trained_languages_are_judged_in_small_and_every_language_in_full():
    row = {"language": "fr", "cer": 0.9}
    assert all(v is None for v in verdicts(row).values())
    assert decide(row, default_policies("full")["bridge"])[0] == "transcript_mismatch"
    assert decide({"language": "de", "cer": 0.9}, default_policies("small")["bridge"])[0] == "transcript_mismatch"
    assert decide(row, default_policies("tiny")["bridge"]) is None
