"""The benchmark tools: the FLOP count against a hand computation, the sharded parameter bytes, a --quick run."""

import json
import os
import sys

import pytest

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))), "tools"))

import bench_t5  # noqa: E402
import bench_txl  # noqa: E402
from templm.models.t5 import T5_1_1_CONFIGS, count_parameters  # noqa: E402
from templm.models.transformer_xl import TXL_CONFIGS  # noqa: E402


def _lines(text):
    return [json.loads(line) for line in text.splitlines() if line.strip()]


def test_t5_flops_of_tiny_match_a_hand_computation():
    # tiny: d 64, 4 heads x 16 (i = 64), mlp 128, gated (a = 2), 2 + 2 layers, vocab 868; batch 8, 64 + 16 tokens.
    # encoder dense  6*8*64*2*(4*64*64 + 3*64*128)  = 6*512*81920   = 251,658,240
    # decoder dense  6*8*16*2*(6*64*64 + 3*64*128)  = 6*128*98304   =  75,497,472
    # cross k, v     6*8*64*2*(2*64*64)             = 6*512*16384   =  50,331,648
    # logits         6*8*16*64*868                                  =  42,663,936
    # enc attention  12*8*2*64*64*64                                =  50,331,648
    # dec attention  12*8*2*64*(16*17/2)                            =   1,671,168
    # cross attn     12*8*2*16*64*64                                =  12,582,912
    flops = bench_t5.t5_train_flops(T5_1_1_CONFIGS["tiny"], 8, 64, 16)
    assert flops["encoder_dense"] == 251_658_240
    assert flops["decoder_dense"] == 75_497_472
    assert flops["cross_kv_dense"] == 50_331_648
    assert flops["logits"] == 42_663_936
    assert flops["encoder_attention"] == 50_331_648
    assert flops["decoder_attention"] == 1_671_168
    assert flops["cross_attention"] == 12_582_912
    assert flops["total"] == 484_737_024
    # T5 v1.1 small at the reference point: about 98.7 GFLOP per step.
    assert bench_t5.t5_train_flops(T5_1_1_CONFIGS["small"], 8, 64, 16)["total"] == pytest.approx(98.7e9, rel=1e-3)


@pytest.mark.parametrize("name", ["tiny", "small"])
def test_the_flop_count_covers_every_matmul_parameter(name):
    config = T5_1_1_CONFIGS[name]
    d, heads = config.emb_dim, config.num_heads
    layers = config.num_encoder_layers + config.num_decoder_layers
    # Everything but the embedding table, the RMSNorm scales (2 per encoder layer, 3 per decoder layer, 2 final) and
    # the two relative-position tables enters a matmul.
    norms = d * (2 * config.num_encoder_layers + 3 * config.num_decoder_layers + 2)
    others = config.vocab_size * d + norms + 2 * heads * config.relative_attention_num_buckets
    assert bench_t5.dense_parameter_count(config) == count_parameters(config) - others
    assert layers > 0


def test_sharded_parameter_bytes_fall_with_the_model_axis(capsys):
    import jax

    if len(jax.devices()) < 8:
        pytest.skip("needs 8 devices (the suite's conftest sets them)")
    bench_t5.run_sharded(["tiny"], bench_t5.parse_args(["--dtype", "float32"]))
    lines = _lines(capsys.readouterr().out)
    assert [x["model_axis"] for x in lines] == [1, 2, 4, 8]
    mib = [x["value"] for x in lines]
    assert mib[0] == pytest.approx(count_parameters(T5_1_1_CONFIGS["tiny"]) * 4 / 2 ** 20, rel=1e-3)
    # Halving per doubling, up to the replicated norms.
    assert lines[1]["reduction_vs_model_1"] == pytest.approx(2.0, rel=0.02)
    assert lines[2]["reduction_vs_model_1"] == pytest.approx(4.0, rel=0.05)
    assert lines[1]["rules"] == lines[2]["rules"] == "standard rules"
    # At model=8 neither tiny's 4 heads nor its vocabulary of 868 divide: both are replicated, and said so.
    assert "heads, vocab replicated" in lines[3]["rules"]
    assert mib[2] < mib[3] < mib[0]
    for line in lines:
        assert set(line) >= {"name", "value", "unit", "config", "devices", "jax"}


def test_txl_theoretical_ratios():
    mid = TXL_CONFIGS["mid"]
    assert bench_txl.theoretical_ratio(mid, "all") == 3.0
    assert bench_txl.theoretical_ratio(mid, "biases") == 2.0
    assert 2.0 < bench_txl.theoretical_ratio(mid, "embeddings") < 3.0


def test_bench_txl_quick_prints_one_json_line_per_figure(capsys):
    assert bench_txl.main(["--quick", "--segments", "4"]) == 0
    lines = _lines(capsys.readouterr().out)
    names = [x["name"] for x in lines]
    assert names == ["matmul_peak", "txl_static_tokens_per_s", "txl_dynamic_all_tokens_per_s",
                     "txl_static_matmul_peak_share", "txl_dynamic_all_vs_static_time"]
    for line in lines:
        assert set(line) >= {"name", "value", "unit", "config", "devices", "jax"}
        assert line["value"] > 0
    assert lines[1]["unit"] == "tokens/s" and lines[-1]["theoretical"] == 3.0


def test_the_beam_benchmark_s_dump_repeats_the_test_dump_with_fresh_ids(tmp_path):
    """tools/bench_beam.py's dump: each copy renumbers its ids and its references to them, so N copies hold N times
    the test dump's queries (under the per-relation cut), every copy's subjects distinct."""
    import bench_beam

    from templm.data.wikidata import build_templama

    counts = {}
    for copies in (1, 3):
        dump = str(tmp_path / f"dump{copies}.json")
        assert bench_beam.write_dump(dump, copies) == 25 * copies
        stats = build_templama(dump, str(tmp_path / f"out{copies}"), require_enwiki=False)
        counts[copies] = (stats["queries"], stats["subjects"])
    assert counts[3] == (3 * counts[1][0], 3 * counts[1][1]) and counts[1][0] > 0


def test_the_beam_benchmark_s_corpus_is_wmt_news_with_its_near_copies_and_french(tmp_path):
    """tools/bench_beam.py's clean-up corpus: one WMT file a year that templm reads, the near-copies and the French
    articles it says it holds, each left out by the clean-up."""
    import bench_beam

    from templm.data.splits import index_corpus

    files = bench_beam.write_corpus(str(tmp_path), 600)
    assert [os.path.basename(f) for f in files] == [f"news-docs.{y}.en.filtered.gz" for y in range(2016, 2020)]
    index = index_corpus(files)
    cleaned = index.filtered
    assert index.read == 600 and index.duplicates == 0
    assert 0.02 < cleaned["near_duplicates_removed"] / 600 < 0.06 and 0.005 < cleaned["other_language_removed"] / 600 \
        < 0.04 and cleaned["languages_removed"].keys() == {"fr"}
    assert len(index) == 600 - cleaned["near_duplicates_removed"] - cleaned["other_language_removed"]
