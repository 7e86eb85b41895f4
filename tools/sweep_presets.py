"""The data and vocabulary stages of a reproduction preset over many seeds of the embedded world: each seed's world,
splits, task data and SentencePiece models, with the checks `templm reproduce` relies on (the time-aware half's data
checks, TempLAMA test queries, a vocabulary of more than 100 and at most the preset's pieces, non-empty streaming
splits). One JSON line per seed, then a summary line; exit 1 when any seed fails. The suite runs two seeds
(tests/experiments/test_presets.py); this tool runs the sweep:

    python tools/sweep_presets.py --preset smoke --seeds 100-119
    python tools/sweep_presets.py --preset small --seeds 100-119 --out /tmp/sweep
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from typing import Dict, List

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO)


def check_seed(preset: str, seed: int, out: str) -> Dict[str, object]:
    """Runs the data and vocabulary stages of `preset` for `seed` under `out`; raises AssertionError naming what a
    seed's data lacks. Returns the seed's figures (vocabulary sizes, split sizes)."""
    import sentencepiece

    from templm.experiments.reproduce import PRESETS, Reproduction
    from templm.experiments.streaming import PRESETS as STREAM_PRESETS
    from templm.experiments.streaming import prepare_preset_data

    run = Reproduction(PRESETS[preset], os.path.join(out, f"{preset}_{seed}"), seed)
    data = run.prepare_data()
    data.check()  # the time-aware half can run on it
    assert data.seen and data.future, f"seed {seed}: no seen or no future years"
    assert data.manifest["counts"]["templama"]["test"], f"seed {seed}: no TempLAMA test queries"
    t5 = sentencepiece.SentencePieceProcessor(model_file=f"{run.data_dir}/spm/vocab.model").get_piece_size()
    assert 100 < t5 <= PRESETS[preset].vocab_size, f"seed {seed}: T5 vocabulary of {t5} pieces"
    stream = prepare_preset_data(os.path.join(out, f"{preset}_{seed}", "stream"), preset, seed)
    stream_pieces = []
    for spm_file in stream["spm_models"].values():  # one per setup, each on its own training split
        size = sentencepiece.SentencePieceProcessor(model_file=spm_file).get_piece_size()
        assert 100 < size <= STREAM_PRESETS[preset].vocab_size, f"seed {seed}: streaming vocabulary of {size}"
        stream_pieces.append(size)
    splits = {name: stream["splits"]["splits"][name]["documents"]
              for name in ("time_stratified_train", "control_train", "test")}
    assert all(splits.values()), f"seed {seed}: an empty streaming split {splits}"
    return {"t5_pieces": t5, "stream_pieces": stream_pieces, "stream_documents": splits}


def parse_seeds(text: str) -> List[int]:
    seeds = []
    for part in text.split(","):
        first, _, last = part.partition("-")
        seeds += list(range(int(first), int(last or first) + 1))
    return seeds


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--preset", choices=["smoke", "small"], required=True)
    parser.add_argument("--seeds", default="100-119", help="e.g. 100-119 or 100,105")
    parser.add_argument("--out", default=None, help="where the seeds' data go (default: a temporary folder)")
    args = parser.parse_args(argv)
    from templm import tasks

    failed = []
    with tempfile.TemporaryDirectory() as scratch, tasks.registration_scope():
        for seed in parse_seeds(args.seeds):
            start = time.time()
            try:
                row = {"preset": args.preset, "seed": seed, "ok": True, **check_seed(args.preset, seed,
                                                                                     args.out or scratch)}
            except AssertionError as e:
                row = {"preset": args.preset, "seed": seed, "ok": False, "error": str(e)}
                failed.append(seed)
            row["seconds"] = round(time.time() - start, 1)
            print(json.dumps(row), flush=True)
    print(json.dumps({"preset": args.preset, "seeds": len(parse_seeds(args.seeds)), "failed": failed}))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
