"""Our NeMo exports read by NeMo's own loaders: what each loader returned, sample by sample.

The request (JSON, one argument) names the tarred export (``tarred_dir``, ``tars``, its manifest),
the relocated plain manifest, the character labels, a SentencePiece model for the BPE dataset and
where to save the audio the Lhotse iterator loaded (``lhotse_audio_npz``).
"""

import json
import os
import sys

import numpy as np


def tarred_char_dataset(request: dict) -> list[dict]:
    from nemo.collections.asr.data.audio_to_text import TarredAudioToCharDataset

    tarred = request["tarred_dir"]
    dataset = TarredAudioToCharDataset(
        audio_tar_filepaths=[os.path.join(tarred, f"audio_{n}.tar") for n in range(request["tars"])],
        manifest_filepath=os.path.join(tarred, request["tarred_manifest"]),
        labels=request["labels"],
        sample_rate=16_000,
        normalize=False,
        parser="base",
        return_sample_id=True,
    )
    seen = []
    for _audio, audio_len, _tokens, _token_len, sample_id in dataset:
        entry = dataset.get_manifest_sample(int(sample_id))
        seen.append(
            {
                "member": os.path.basename(entry.audio_file),
                "text_raw": entry.text_raw,
                "duration": entry.duration,
                "audio_len": int(audio_len),
            }
        )
    return seen


def tarred_bpe_dataset(request: dict) -> dict:
    from nemo.collections.asr.data.audio_to_text import TarredAudioToBPEDataset
    from nemo.collections.common.tokenizers import SentencePieceTokenizer

    tokenizer = SentencePieceTokenizer(request["sentencepiece_model"])
    tarred = request["tarred_dir"]
    dataset = TarredAudioToBPEDataset(
        audio_tar_filepaths=os.path.join(tarred, f"audio__OP_0..{request['tars'] - 1}_CL_.tar"),
        manifest_filepath=os.path.join(tarred, request["tarred_manifest"]),
        tokenizer=tokenizer,
        sample_rate=16_000,
        use_start_end_token=False,
    )
    items = list(dataset)
    return {
        "length": len(dataset),
        "items": len(items),
        "decoded": [tokenizer.ids_to_text(tokens.tolist()) for _, _, tokens, _ in items],
    }


def lhotse_tarred_iterator(request: dict) -> list[dict]:
    from lhotse import CutSet
    from nemo.collections.common.data.lhotse.nemo_adapters import LazyNeMoTarredIterator

    tarred = request["tarred_dir"]
    cuts = CutSet(
        LazyNeMoTarredIterator(
            manifest_path=[
                os.path.join(tarred, "sharded_manifests", f"manifest_{n}.json") for n in range(request["tars"])
            ],
            tar_paths=[os.path.join(tarred, f"audio_{n}.tar") for n in range(request["tars"])],
            shard_seed=0,
        )
    )
    seen, audio = [], {}
    for cut in cuts:
        supervision = cut.supervisions[0]
        seen.append(
            {
                "recording_id": cut.recording.id,
                "text": supervision.text,
                "language": supervision.language,
                "sampling_rate": cut.sampling_rate,
            }
        )
        audio[cut.recording.id] = cut.load_audio()[0]
    np.savez(request["lhotse_audio_npz"], **audio)
    return seen


def plain_char_dataset(request: dict) -> dict:
    from nemo.collections.asr.data.audio_to_text import AudioToCharDataset

    dataset = AudioToCharDataset(
        manifest_filepath=request["plain_manifest"],
        labels=request["labels"],
        sample_rate=16_000,
        normalize=False,
        parser="base",
    )
    return {"length": len(dataset), "audio_lens": [int(dataset[i][1]) for i in range(len(dataset))]}


def main(result_path: str, request_json: str) -> None:
    request = json.loads(request_json)
    result = {
        "tarred_char": tarred_char_dataset(request),
        "tarred_bpe": tarred_bpe_dataset(request),
        "lhotse_tarred": lhotse_tarred_iterator(request),
        "plain_char": plain_char_dataset(request),
    }
    with open(result_path, "w") as out:
        json.dump(result, out)


if __name__ == "__main__":
    main(*sys.argv[1:])
