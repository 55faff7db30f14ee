"""NeMo's ``viterbi_decoding`` paths for cases saved with ``torch.save``: {label: (log_probs, targets, blank)}.

Writes {label: states}, NeMo's state index per frame, batch of one, on the CPU.
"""

import json
import sys

import torch


def state_tokens(targets: list[int], blank: int) -> list[int]:
    """NeMo's interleaved state labels ``[blank, t_1, blank, ..., t_L, blank]``."""
    labels = [blank]
    for token in targets:
        labels += [token, blank]
    return labels


def nemo_path(log_probs: torch.Tensor, targets: list[int], blank: int) -> list[int]:
    from nemo.collections.asr.parts.utils.aligner_utils import viterbi_decoding

    y = state_tokens(targets, blank)
    paths = viterbi_decoding(
        log_probs[None].to(torch.float32),
        torch.tensor([y], dtype=torch.int64),
        torch.tensor([log_probs.shape[0]]),
        torch.tensor([len(y)]),
        viterbi_device="cpu",
    )
    return [int(state) for state in paths[0]]


def main(result_path: str, cases_path: str) -> None:
    cases = torch.load(cases_path, weights_only=True)
    paths = {label: nemo_path(lp, targets, blank) for label, (lp, targets, blank) in cases.items()}
    with open(result_path, "w") as out:
        json.dump(paths, out)


if __name__ == "__main__":
    main(*sys.argv[1:])
