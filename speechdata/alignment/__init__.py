"""Word and token time spans per utterance: CTC models (parakeet, through transformers), an exact Viterbi, imported alignments."""
