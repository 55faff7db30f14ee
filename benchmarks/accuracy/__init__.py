"""How right the outputs are, beside a baseline: alignment (short and long form), quality filters,
near duplicates on a planted set."""
