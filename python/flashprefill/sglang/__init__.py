"""SGLang prefill attention backend: FlashPrefill V2 for the extend phase, as a plugin.

    pip install flashprefill sglang
    python -m sglang.launch_server --model-path ... \\
        --prefill-attention-backend flashprefill --decode-attention-backend fa3

SGLang (0.5.23) runs `register` through its `sglang.srt.plugins` entry point in every process;
it adds "flashprefill" to the attention backend choices and to SGLang's backend registry. With a
different decode backend SGLang's HybridAttnBackend sends EXTEND and MIXED batches here and
decode batches to the decode backend. Settings: FLASHPREFILL_* environment variables, read when
the backend is built (layout.Settings; docs/SGLANG.md lists them).

Modules: backend.py (the AttentionBackend; imports SGLang), layout.py (the translation from
SGLang's batch and pools to the library's paged plan; torch only). Importing this package
imports neither SGLang nor torch.
"""

BACKEND_NAME = "flashprefill"


def create_backend(model_runner):
    """SGLang's factory for the backend: FlashPrefillAttnBackend(model_runner)."""
    from .backend import FlashPrefillAttnBackend

    return FlashPrefillAttnBackend(model_runner)


def register():
    """Adds BACKEND_NAME to SGLang's attention backend choices and registry (idempotent)."""
    from sglang.srt.arg_groups.choices import (ATTENTION_BACKEND_CHOICES,
                                               add_attention_backend_choices)
    from sglang.srt.layers.attention.attention_registry import register_attention_backend

    if BACKEND_NAME not in ATTENTION_BACKEND_CHOICES:
        add_attention_backend_choices([BACKEND_NAME])
    register_attention_backend(BACKEND_NAME)(create_backend)
