"""Hugging Face T5 folders as transformers itself writes them, major versions 4 and 5, each installed from the
package index into a virtual environment of the test's own (with PyTorch; no model is downloaded from the hub):
tiny T5 v1.0 (tied, scaled) and v1.1 (gated-gelu, its own head) models made there with fixed weights, saved with
save_pretrained, a v1.1 folder of transformers 4 converted by transformers 5, and templm's own folders read back by
both. templm's logits equal the ones transformers computes on the same ids. `make test-network` (pip needs the
index)."""

import json
import subprocess
import sys
import textwrap

import numpy as np
import pytest

from templm.models import t5

pytestmark = [pytest.mark.e2e, pytest.mark.network]

TRANSFORMERS = {4: "transformers>=4.40,<5", 5: "transformers>=5,<6"}
ENC = [[5, 9, 13, 7, 1, 0, 0], [4, 4, 8, 21, 30, 11, 1]]
DEC = [[0, 6, 12, 3], [0, 2, 17, 9]]

# Run with the environment's python: ARGV mode folder...; "write" makes the two models, "read" loads each folder
# and writes the logits transformers computes beside it.
SCRIPT = textwrap.dedent("""
    import json, os, sys
    import numpy as np, torch
    from transformers import T5Config, T5ForConditionalGeneration
    enc, dec = torch.tensor(json.loads(sys.argv[2])), torch.tensor(json.loads(sys.argv[3]))
    def logits(model):
        with torch.no_grad():
            return model(input_ids=enc, attention_mask=(enc > 0).long(), decoder_input_ids=dec).logits.numpy()
    mode, folders = sys.argv[1], sys.argv[4:]
    if mode == "write":
        torch.manual_seed(0)
        for folder, proj, tie in zip(folders, ("relu", "gated-gelu"), (True, False)):
            config = T5Config(vocab_size=40, d_model=12, d_kv=6, d_ff=24, num_layers=2, num_heads=2,
                              feed_forward_proj=proj, tie_word_embeddings=tie, decoder_start_token_id=0)
            model = T5ForConditionalGeneration(config).eval()
            with torch.no_grad():
                for p in model.parameters():
                    p.normal_(0.0, 0.5)
            model.save_pretrained(folder, safe_serialization=True)
    else:
        for folder in folders:
            model = T5ForConditionalGeneration.from_pretrained(folder).eval()
            np.save(os.path.join(folder, "hf_logits.npy"), logits(model))
""")


@pytest.fixture(scope="module")
def environments(tmp_path_factory):
    """{major version: python of a virtual environment with torch and that transformers}."""
    root = tmp_path_factory.mktemp("transformers")
    pythons = {}
    for major, requirement in TRANSFORMERS.items():
        venv = root / f"t{major}"
        subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, timeout=300)
        python = str(venv / "bin" / "python")
        result = subprocess.run([python, "-m", "pip", "install", "--quiet", "torch==2.13.0", requirement, "numpy",
                                 "safetensors"], capture_output=True, text=True, timeout=1800)
        if result.returncode != 0 and any(w in result.stderr.lower() for w in ("connection", "resolve")):
            pytest.skip(f"the package index cannot be reached: {result.stderr.strip().splitlines()[-1]}")
        assert result.returncode == 0, result.stderr[-3000:]
        pythons[major] = python
    (root / "hf.py").write_text(SCRIPT)
    return root, pythons


def hf(environments, major, mode, *folders):
    root, pythons = environments
    result = subprocess.run([pythons[major], str(root / "hf.py"), mode, json.dumps(ENC), json.dumps(DEC),
                             *map(str, folders)], capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stderr[-3000:]


def templm_logits(folder):
    config, params = t5.load_hf_checkpoint(str(folder))
    model = t5.EncoderDecoderModel(config)
    return config, params, np.asarray(model.logits(params, {"encoder_input_tokens": np.array(ENC, np.int32),
                                                            "decoder_input_tokens": np.array(DEC, np.int32)}))


def test_folders_written_by_transformers_4_and_5_give_their_logits_and_templm_writes_folders_both_read(
        environments, tmp_path):
    made = {}
    for major in TRANSFORMERS:
        made[major] = [tmp_path / f"t{major}_v1_0", tmp_path / f"t{major}_v1_1"]
        hf(environments, major, "write", *made[major])
    # transformers 5 converting transformers 4's v1.1 folder: tie_word_embeddings true beside lm_head.weight.
    converted = tmp_path / "t5_from_t4_v1_1"
    script = ("import sys; from transformers import T5ForConditionalGeneration as M; "
              "M.from_pretrained(sys.argv[1]).save_pretrained(sys.argv[2], safe_serialization=True)")
    subprocess.run([environments[1][5], "-c", script, str(made[4][1]), str(converted)], check=True, timeout=600)
    configs = {folder.name: json.loads((folder / "config.json").read_text())
               for folder in (*made[4], *made[5], converted)}
    assert "scale_decoder_outputs" not in configs["t4_v1_1"] and configs["t4_v1_1"]["tie_word_embeddings"] is False
    assert configs["t5_from_t4_v1_1"]["tie_word_embeddings"] is True
    assert configs["t5_from_t4_v1_1"]["scale_decoder_outputs"] is False

    for major, folders in made.items():
        hf(environments, major, "read", *folders)
    hf(environments, 5, "read", converted)
    for folder in (*made[4], *made[5], converted):
        config, params, ours = templm_logits(folder)
        want = np.load(folder / "hf_logits.npy")
        assert np.abs(want).max() > 0.5, folder.name
        np.testing.assert_allclose(ours, want, atol=2e-5, rtol=1e-5, err_msg=folder.name)
        # templm's own folder of the same model: both versions compute templm's logits from it.
        saved = tmp_path / f"templm_{folder.name}"
        t5.save_hf_checkpoint(params, config, str(saved))
        for major in TRANSFORMERS:
            hf(environments, major, "read", saved)
            np.testing.assert_allclose(np.load(saved / "hf_logits.npy"), ours, atol=2e-5, rtol=1e-5,
                                       err_msg=f"{saved.name} in transformers {major}")
