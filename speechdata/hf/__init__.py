"""Per-country Hugging Face datasets: splits, publishing state, Hub-layout files, cards and upload."""
