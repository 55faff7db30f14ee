"""The model-based signals reach the decisions: a classifier and a MOS model with fixed outputs."""

from speechdata.io.storage import DataRoot
from speechdata.landing.ingest import run_normalized_audio, run_raw_shards
from speechdata.quality.decisions import excluded_utterances
from speechdata.quality.paths import quality_signals
from speechdata.quality.policy import default_policies
from speechdata.quality.stage import run_quality_decisions, run_quality_signals
from speechdata.testing.shards import build_sample_shard
from speechdata.vad.silero import load_silero_model


class AlwaysGerman:
    def __init__(self):
        self.calls = 0

    def identify(self, audios_16k):
        self.calls += 1
        return [("de", 0.95)] * len(audios_16k)


class FixedMos:
    def __init__(self, score: float):
        self.score = score

    def mos(self, audios_16k):
        return [self.score] * len(audios_16k)


def test_fixed_model_outputs_are_stored_and_decide_only_where_the_policy_uses_them(tmp_path):
    root = DataRoot(str(tmp_path / "data"))
    landed = build_sample_shard(root, "s1", 4, seed=11, long_recordings=0, formats=("flac",))
    run_raw_shards(root, "s1")
    run_normalized_audio(root, "s1")
    german = AlwaysGerman()
    run_quality_signals(root, "s1", vad_model=load_silero_model(), audio_language=german, speech_quality=FixedMos(1.5))
    rows = root.read_parquet(quality_signals("s1")).to_pylist()
    assert german.calls == 1 and {(r["audio_language"], r["audio_language_confidence"], r["mos"]) for r in rows} == {
        ("de", 0.95, 1.5)
    }

    run_quality_decisions(root, "s1", default_policies("full"))
    languages = dict(zip(landed["utt_id"].to_pylist(), landed["language"].to_pylist(), strict=True))
    expected = {u: ("low_mos" if lang == "de" else "audio_language_mismatch") for u, lang in languages.items()}
    excluded = excluded_utterances(root, "s1", "bridge")
    assert {u: reason for u, (reason, _) in excluded.items()} == expected
    assert "mos 1.5 < 3" in excluded[next(u for u, lang in languages.items() if lang == "de")][1]

    run_quality_decisions(root, "s1", default_policies("tiny"))
    assert excluded_utterances(root, "s1", "bridge") == {}  # computed, but off by default in tiny
