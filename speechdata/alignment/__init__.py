"""Word and token time spans per utterance: NeMo CTC models, an exact Viterbi, imported alignments."""
