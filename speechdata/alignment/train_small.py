"""Train the ``small`` profile's CTC aligner on synthesized speech (CPU, deterministic).

    OMP_WAIT_POLICY=PASSIVE nice -n 10 python -m speechdata.alignment.train_small --out speechdata/alignment/small_model

The model is the production aligner's class, transformers' ``ParakeetForCTC``, saved with
``save_pretrained`` beside its ``ParakeetFeatureExtractor`` and ``ParakeetTokenizer``, so it loads
through :func:`speechdata.alignment.acoustic_models.load_ctc_model` like any production model.

Why characters at 40 ms (``subsampling_factor`` 4) and not subwords at 80 ms: a CTC word boundary
is where the word's first and last token fire, so each word needs tokens spread over it. Characters
give several per word; at 80 ms a character model cannot keep up with speech (12.5 labels/s), at
40 ms it can (25/s; espeak-ng at 200 words per minute speaks about 17 characters per second).

Data: :func:`speechdata.alignment.synthetic_speech.training_utterance` (espeak-ng, English and
German, many voices, speeds and pitches, noise and reverberation). Log-mel features are computed
once with the model's own feature extractor and cached under ``--work``. Training: AdamW with
linear warmup and cosine decay, length-bucketed batches, fixed seeds, one thread; a checkpoint is
saved into ``--out`` every ``--save-every`` steps, so an interrupted run still leaves a model.
"""

from __future__ import annotations

import argparse
import json
import math
import time
from pathlib import Path

import numpy as np

from speechdata.alignment.acoustic_models import BLANK_TOKEN
from speechdata.alignment.transcript_units import WORD_DELIMITER
from speechdata.profiles import SMALL_ALIGNER_LANGUAGES

SMALL_ALPHABET = "abcdefghijklmnopqrstuvwxyz'äöüß"
"""The small model's letters: English and German (the languages it was trained on)."""
SEED = 20_260_127
SMALL_ENCODER = {
    "hidden_size": 128,
    "num_hidden_layers": 4,
    "num_attention_heads": 4,
    "intermediate_size": 256,
    "num_mel_bins": 80,
    "subsampling_factor": 4,
    "subsampling_conv_channels": 64,
    "conv_kernel_size": 15,
    "dropout": 0.1,
    "dropout_positions": 0.0,
    "layerdrop": 0.0,
    "activation_dropout": 0.1,
    "attention_dropout": 0.1,
}


def char_tokenizer():
    """A ``ParakeetTokenizer`` whose pieces are single letters, ``<unk>`` and the word delimiter
    ``|`` (wav2vec2's), then the blank last."""
    from tokenizers import AddedToken, Tokenizer, models
    from transformers import ParakeetTokenizer

    vocabulary = {c: i for i, c in enumerate(SMALL_ALPHABET)}
    vocabulary["<unk>"] = len(vocabulary)
    vocabulary[WORD_DELIMITER] = len(vocabulary)
    tokenizer = ParakeetTokenizer(
        tokenizer_object=Tokenizer(models.BPE(vocab=vocabulary, merges=[], unk_token="<unk>")),
        clean_up_tokenization_spaces=False,
    )
    blank = AddedToken(BLANK_TOKEN, normalized=False, special=True)
    tokenizer.add_tokens([blank])
    tokenizer.add_special_tokens({"pad_token": blank, "unk_token": "<unk>"})
    return tokenizer


def text_targets(text: str, tokenizer) -> list[int]:
    """The transcript as the aligner tokenizes it: word by word, letters, ``|`` between words."""
    from speechdata.alignment.transcript_units import SubwordVocabulary, ctc_targets

    return ctc_targets(text, SubwordVocabulary(tokenizer, tokenizer.pad_token_id)).targets


def log_mels(feature_extractor, audios: list[np.ndarray], group: int = 25) -> list[np.ndarray]:
    """Log-mels as the aligner computes them (batched, each trimmed to its own frames), float16."""
    mels: list[np.ndarray | None] = [None] * len(audios)
    order = sorted(range(len(audios)), key=lambda i: len(audios[i]))
    for start in range(0, len(order), group):
        indices = order[start : start + group]
        batch = feature_extractor(
            [audios[i] for i in indices], sampling_rate=16_000, return_tensors="np", return_attention_mask=True
        )
        for row, i in enumerate(indices):
            frames = int(batch["attention_mask"][row].sum())
            mels[i] = batch["input_features"][row, :frames].astype(np.float16)
    return mels  # type: ignore[return-value]


def build_features(work: Path, count: int, tokenizer, feature_extractor, chunk: int = 250) -> list[dict]:
    """Synthesize ``count`` utterances and their log-mels, cached in chunks under ``work``."""
    from speechdata.alignment.synthetic_speech import training_utterance

    work.mkdir(parents=True, exist_ok=True)
    items: list[dict] = []
    for first in range(0, count, chunk):
        path = work / f"features-{SEED}-{first:06d}-{chunk}.npz"
        if not path.exists():
            utterances = [training_utterance(index, SEED) for index in range(first, min(first + chunk, count))]
            features = log_mels(feature_extractor, [u.audio for u in utterances])
            tmp = path.with_suffix(".tmp.npz")
            np.savez(
                tmp,
                lengths=np.array([len(f) for f in features]),
                features=np.concatenate(features),
                texts=np.array([u.text for u in utterances]),
            )
            tmp.rename(path)
        # Each NpzFile item access reads the whole array again: read each once, keep views into it.
        with np.load(path) as data:
            lengths, features, texts = data["lengths"], data["features"], data["texts"]
        feature_offsets = np.concatenate([[0], np.cumsum(lengths)])
        # Targets come from the cached texts, not the cache: the same audio serves any vocabulary.
        for k in range(len(lengths)):
            items.append(
                {
                    "features": features[feature_offsets[k] : feature_offsets[k + 1]],
                    "targets": np.asarray(text_targets(str(texts[k]), tokenizer), dtype=np.int64),
                }
            )
    return items


def length_batches(items: list[dict], max_frames: int, rng: np.random.Generator) -> list[list[int]]:
    """Batches of similar length holding at most ``max_frames`` padded feature frames, shuffled."""
    order = sorted(range(len(items)), key=lambda i: len(items[i]["features"]))
    batches, current = [], []
    for i in order:
        if current and len(items[i]["features"]) * (len(current) + 1) > max_frames:
            batches.append(current)
            current = []
        current.append(i)
    if current:
        batches.append(current)
    return [batches[int(i)] for i in rng.permutation(len(batches))]


def collate(items: list[dict], batch: list[int]):
    import torch

    # Padded to a multiple of 64 frames: few distinct shapes, so the allocator's memory stays flat.
    longest = -(-max(len(items[i]["features"]) for i in batch) // 64) * 64
    features = torch.zeros(len(batch), longest, SMALL_ENCODER["num_mel_bins"])
    mask = torch.zeros(len(batch), longest, dtype=torch.long)
    for row, i in enumerate(batch):
        f = items[i]["features"]
        features[row, : len(f)] = torch.from_numpy(f.astype(np.float32))
        mask[row, : len(f)] = 1
    targets = torch.cat([torch.from_numpy(items[i]["targets"]) for i in batch])
    target_lengths = torch.tensor([len(items[i]["targets"]) for i in batch])
    return features, mask, targets, target_lengths


def spec_augment(features, rng: np.random.Generator):
    """Two frequency masks (up to 12 bands) and two time masks (up to 30 frames) per utterance."""
    for row in range(features.shape[0]):
        for _ in range(2):
            width = int(rng.integers(0, 13))
            start = int(rng.integers(0, features.shape[2] - width + 1))
            features[row, :, start : start + width] = 0
            width = int(rng.integers(0, 31))
            start = int(rng.integers(0, max(1, features.shape[1] - width)))
            features[row, start : start + width, :] = 0
    return features


def ctc_loss(model, features, mask, targets, target_lengths):
    import torch

    encoded = model.encoder(input_features=features, attention_mask=mask)
    log_probs = torch.log_softmax(model.ctc_head(encoded.last_hidden_state), dim=-1)
    frames = encoded.attention_mask.sum(-1)
    return torch.nn.functional.ctc_loss(
        log_probs.transpose(0, 1),
        targets,
        frames,
        target_lengths,
        blank=model.config.pad_token_id,
        reduction="mean",
        zero_infinity=True,
    )


def save(model, feature_extractor, tokenizer, out: Path, info: dict) -> None:
    from transformers import ParakeetProcessor

    tmp = out.with_name(out.name + ".tmp")
    model.save_pretrained(tmp)
    ParakeetProcessor(feature_extractor=feature_extractor, tokenizer=tokenizer).save_pretrained(tmp)
    (tmp / "training.json").write_text(json.dumps(info, indent=1, sort_keys=True) + "\n")
    if out.exists():
        import shutil

        shutil.rmtree(out)
    tmp.rename(out)


def warm_started(init_from: str, tokenizer):
    """The model saved in ``init_from``, its output layer extended to ``tokenizer``'s vocabulary.

    Tokens the saved model has keep their rows (found by name, so the blank moves to the new last
    class); a new token starts as a copy of the blank's row with its bias lowered by
    ``NEW_TOKEN_BIAS_OFFSET``: it fires where the blank fires (between words, for ``|``) but loses
    to it until training moves it, so the warm-started model starts out decoding as the saved one."""
    import torch
    from transformers import AutoTokenizer, ParakeetForCTC

    model = ParakeetForCTC.from_pretrained(init_from)
    old_vocabulary = AutoTokenizer.from_pretrained(init_from).get_vocab()
    new_vocabulary = tokenizer.get_vocab()
    if old_vocabulary == new_vocabulary:
        return model
    old_blank = model.config.pad_token_id
    head = model.ctc_head
    weight, bias = head.weight.detach(), head.bias.detach()
    new_weight = weight[old_blank].expand(len(new_vocabulary), *weight.shape[1:]).clone()
    new_bias = bias[old_blank].expand(len(new_vocabulary)).clone() - NEW_TOKEN_BIAS_OFFSET
    for token, new_id in new_vocabulary.items():
        if token in old_vocabulary:
            new_weight[new_id] = weight[old_vocabulary[token]]
            new_bias[new_id] = bias[old_vocabulary[token]]
    head.weight = torch.nn.Parameter(new_weight)
    head.bias = torch.nn.Parameter(new_bias)
    head.out_channels = len(new_vocabulary)
    model.config.vocab_size = len(new_vocabulary)
    model.config.pad_token_id = tokenizer.pad_token_id
    return model


NEW_TOKEN_BIAS_OFFSET = 2.0


def train(args) -> None:
    import torch
    from transformers import ParakeetCTCConfig, ParakeetFeatureExtractor, ParakeetForCTC

    torch.set_num_threads(args.threads)
    torch.manual_seed(SEED)
    rng = np.random.default_rng(SEED)

    def say(message: str) -> None:
        print(message, flush=True)
        if args.log:
            with open(args.log, "a") as log:
                log.write(message + "\n")

    tokenizer = char_tokenizer()
    feature_extractor = ParakeetFeatureExtractor(feature_size=SMALL_ENCODER["num_mel_bins"])
    started = time.monotonic()
    items = build_features(Path(args.work), args.utterances, tokenizer, feature_extractor)
    audio_h = sum(len(i["features"]) for i in items) / 100 / 3600
    say(f"data: {len(items)} utterances, {audio_h:.2f} h, {time.monotonic() - started:.0f} s")

    config = ParakeetCTCConfig(
        vocab_size=len(tokenizer), pad_token_id=tokenizer.pad_token_id, encoder_config=dict(SMALL_ENCODER)
    )
    # --init-from continues from a saved model (the committed one was trained in three such runs);
    # a model saved before a token was added gets its output layer extended (warm_started).
    model = warm_started(args.init_from, tokenizer) if args.init_from else ParakeetForCTC(config)
    say(f"parameters: {sum(p.numel() for p in model.parameters()) / 1e6:.2f} M")
    init_info = json.loads((Path(args.init_from) / "training.json").read_text()) if args.init_from else {}
    # Steps the initial model had seen, over all the runs behind it.
    init_steps = init_info.get("steps", 0) + init_info.get("init_from_steps", 0)
    optimizer = torch.optim.AdamW(model.parameters(), lr=args.lr, weight_decay=0.01, betas=(0.9, 0.98))

    def learning_rate(step: int) -> float:
        if step < args.warmup:
            return args.lr * (step + 1) / args.warmup
        progress = (step - args.warmup) / max(1, args.steps - args.warmup)
        return args.lr * (0.05 + 0.95 * 0.5 * (1 + math.cos(math.pi * min(1.0, progress))))

    step, epoch, smoothed = 0, 0, None
    train_started = time.monotonic()
    while step < args.steps:
        for batch in length_batches(items, args.batch_frames, rng):
            if step >= args.steps:
                break
            model.train()
            features, mask, targets, target_lengths = collate(items, batch)
            features = spec_augment(features, rng)
            for group in optimizer.param_groups:
                group["lr"] = learning_rate(step)
            loss = ctc_loss(model, features, mask, targets, target_lengths)
            optimizer.zero_grad()
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 5.0)
            optimizer.step()
            step += 1
            value = float(loss.detach())
            smoothed = value if smoothed is None else 0.95 * smoothed + 0.05 * value
            if step % 10 == 0:
                elapsed = time.monotonic() - train_started
                say(f"step {step} epoch {epoch} loss {value:.3f} smoothed {smoothed:.3f} {elapsed:.0f} s")
            if step % args.save_every == 0 or step == args.steps:
                info = {
                    "seed": SEED,
                    "steps": step,
                    "init_from_steps": init_steps,
                    "utterances": len(items),
                    "audio_hours": round(audio_h, 3),
                    "smoothed_loss": round(smoothed, 4),
                    "train_seconds": round(time.monotonic() - train_started),
                    "languages": list(SMALL_ALIGNER_LANGUAGES),
                }
                save(model.eval(), feature_extractor, tokenizer, Path(args.out), info)
                say(f"saved {args.out} at step {step}")
        epoch += 1


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", default="speechdata/alignment/small_model")
    parser.add_argument("--work", default=".cache/small-aligner")
    parser.add_argument("--log", default=None)
    parser.add_argument("--utterances", type=int, default=1250)
    parser.add_argument("--steps", type=int, default=2400)
    parser.add_argument("--warmup", type=int, default=100)
    parser.add_argument("--lr", type=float, default=1.5e-3)
    parser.add_argument("--batch-frames", type=int, default=2_500, help="padded 10 ms feature frames per batch")
    parser.add_argument("--save-every", type=int, default=50)
    parser.add_argument("--init-from", default=None, help="a saved model directory to continue training from")
    # One thread: on a shared, loaded machine a second one mostly waits for the first.
    parser.add_argument("--threads", type=int, default=1)
    train(parser.parse_args(argv))


if __name__ == "__main__":
    main()
