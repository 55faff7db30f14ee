"""NeMo's own manifest reader over the ASR manifest's per-shard JSONL parts (run in ``.venv-nemo``).

``manifest.item_iter`` is what NeMo's ``ASRAudioText`` collection (behind ``AudioToCharDataset`` and
``AudioToBPEDataset``) reads manifests with; it resolves a relative ``audio_filepath`` against the
manifest's own directory. Arguments: the result path and a JSON list of part files.
"""

import json
import os
import sys

from nemo.collections.common.parts.preprocessing import manifest


def main(result_path: str, parts_json: str) -> None:
    items = [
        {"audio_file": item["audio_file"], "duration": item["duration"], "exists": os.path.isfile(item["audio_file"])}
        for item in manifest.item_iter(json.loads(parts_json))
    ]
    with open(result_path, "w") as handle:
        json.dump(items, handle)


if __name__ == "__main__":
    main(*sys.argv[1:])
