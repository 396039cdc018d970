"""vLLM integration: the FLASHPREFILL attention backend, an out-of-tree vLLM plugin.

    pip install flashprefill vllm
    vllm serve MODEL --attention-backend FLASHPREFILL

vLLM calls register() through the `vllm.general_plugins` entry point
(flashprefill = "flashprefill.vllm:register"); calling it directly does the same. Settings
come from FLASHPREFILL_* environment variables (batch.Settings), read when vLLM builds the
backend's metadata builder. docs/VLLM.md has the whole story.

batch.py (the translation from vLLM's metadata and cache tensors to the library's calls) does
not import vLLM; backend.py does, and is only imported by vLLM through register().
"""

from .batch import Settings

BACKEND = "flashprefill.vllm.backend.FlashPrefillBackend"
CPU_BACKEND = "flashprefill.vllm.backend.FlashPrefillCPUBackend"


def register():
    """Registers FLASHPREFILL with vLLM's attention backend registry (idempotent); with
    FLASHPREFILL_VLLM_CPU=1 also puts the CPU backend in CPU_ATTN's place."""
    from vllm.v1.attention.backends.registry import AttentionBackendEnum, register_backend

    if "FLASHPREFILL" not in AttentionBackendEnum.__members__:
        register_backend("FLASHPREFILL", BACKEND)
    if Settings.from_env().cpu:
        register_backend(AttentionBackendEnum.CPU_ATTN, CPU_BACKEND)


__all__ = ["BACKEND", "CPU_BACKEND", "Settings", "register"]
