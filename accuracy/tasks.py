"""Prompts and metrics.

Needle-in-a-haystack, RULER style (its niah template): "One of the special magic numbers for
{word} is: {7-digit key}." is inserted into real text at a relative depth, the prompt ends with the
question, and the first number of the greedy answer must equal the key exactly.
- `single`: one needle.
- `multikey`: four needles for four different words; the question asks for the one at the stated
  depth, the other three are distractors spread evenly over the rest of the haystack.
Language-model windows: plain text, scored at held-out positions (the second half of the window).
"""

from __future__ import annotations

import dataclasses
import re

import numpy as np

WORDS = ["lantern", "orchard", "falcon", "harbor", "meadow", "copper", "violet", "glacier"]
MULTI_KEYS = 4
ANSWER_TOKENS = 10           # " " + 7 digits + "." + end
EVAL_POSITIONS = 512          # held-out positions scored per prompt (evenly spaced, second half)


@dataclasses.dataclass
class Prompt:
    name: str
    tokens: np.ndarray
    eval_rows: np.ndarray      # positions whose next-token distribution is compared
    answer: str | None = None  # expected key for needle prompts


def _needle(key: str, word: str) -> str:
    return f" One of the special magic numbers for {word} is: {key}."


def _question(word: str) -> str:
    return (f"\n\nWhat is the special magic number for {word} mentioned in the provided text? "
            f"The special magic number for {word} mentioned in the provided text is")


def _sentence_end(tokenizer, haystack: np.ndarray, at: int) -> int:
    """First index >= at just after a token that ends a sentence (so needles start a sentence)."""
    for i in range(at, len(haystack)):
        if tokenizer.decode([int(haystack[i - 1])]).rstrip().endswith((".", ";", ":")):
            return i
    return at


def _eval_rows(lo: int, hi: int) -> np.ndarray:
    """Up to EVAL_POSITIONS positions in [lo, hi), evenly spaced, whose next token is known."""
    n = min(EVAL_POSITIONS, hi - lo)
    return np.unique(np.linspace(lo, hi - 1, n).astype(np.int64))


def lm_prompt(name: str, ids: np.ndarray) -> Prompt:
    return Prompt(f"lm/{name}", ids, _eval_rows(len(ids) // 2, len(ids) - 1))


def needle_prompt(tokenizer, haystack: np.ndarray, length: int, kind: str, depth: float,
                  rng: np.random.Generator) -> Prompt:
    """A prompt of exactly `length` tokens: haystack text with needles, then the question."""
    words = list(rng.permutation(WORDS)[:1 if kind == "single" else MULTI_KEYS])
    keys = [f"{int(rng.integers(10**6, 10**7))}" for _ in words]
    target = 0
    question = np.asarray(tokenizer.encode(_question(words[target])), dtype=np.int64)
    needles = [np.asarray(tokenizer.encode(_needle(k, w)), dtype=np.int64) for k, w in zip(keys, words)]
    body = length - len(question) - sum(len(n) for n in needles)
    hay = np.asarray(haystack[:body], dtype=np.int64)
    # the target sits at `depth`; distractors at evenly spread other depths
    depths = [depth] + [((depth + (i + 1) / len(words)) % 1.0) for i in range(len(words) - 1)]
    order = np.argsort(depths)
    pieces, prev = [], 0
    for j in order:
        cut = max(prev, _sentence_end(tokenizer, hay, max(1, int(depths[j] * body))))
        pieces += [hay[prev:cut], needles[j]]
        prev = cut
    pieces += [hay[prev:], question]
    ids = np.concatenate(pieces)
    assert len(ids) == length, (len(ids), length)
    return Prompt(f"needle/{kind}/d{depth:.2f}", ids, _eval_rows(length // 2, length - len(question) - 1),
                  answer=keys[target])


def needle_correct(tokenizer, answer_ids, key: str) -> bool:
    m = re.search(r"\d+", tokenizer.decode(answer_ids))
    return m is not None and m.group() == key


def log_softmax(logits: np.ndarray) -> np.ndarray:
    z = logits.astype(np.float64)
    z -= z.max(axis=-1, keepdims=True)
    return z - np.log(np.exp(z).sum(axis=-1, keepdims=True))


def compare_logits(dense_logits, sparse_logits, next_tokens):
    """Per-position next-token metrics between dense and sparse prefill logits [N, V] (numpy arrays,
    or torch tensors: then computed in float64 where they live)."""
    if not isinstance(dense_logits, np.ndarray):
        return _compare_logits_torch(dense_logits, sparse_logits, next_tokens)
    lp_d, lp_s = log_softmax(dense_logits), log_softmax(sparse_logits)
    kl = (np.exp(lp_d) * (lp_d - lp_s)).sum(axis=-1)                    # KL(dense || sparse)
    idx = np.arange(len(next_tokens))
    return {
        "n": int(len(next_tokens)),
        "top1_agree": float((dense_logits.argmax(-1) == sparse_logits.argmax(-1)).mean()),
        "kl_mean": float(kl.mean()),
        "kl_max": float(kl.max()),
        "nll_dense": float(-lp_d[idx, next_tokens].mean()),
        "nll_sparse": float(-lp_s[idx, next_tokens].mean()),
    }


def _compare_logits_torch(dense_logits, sparse_logits, next_tokens):
    import torch
    lp_d = torch.log_softmax(dense_logits.double(), dim=-1)
    lp_s = torch.log_softmax(sparse_logits.double(), dim=-1)
    kl = (lp_d.exp() * (lp_d - lp_s)).sum(dim=-1)
    idx = torch.arange(len(next_tokens), device=lp_d.device)
    nxt = torch.as_tensor(np.asarray(next_tokens, np.int64), device=lp_d.device)
    return {
        "n": int(len(next_tokens)),
        "top1_agree": float((dense_logits.argmax(-1) == sparse_logits.argmax(-1)).double().mean()),
        "kl_mean": float(kl.mean()),
        "kl_max": float(kl.max()),
        "nll_dense": float(-lp_d[idx, nxt].mean()),
        "nll_sparse": float(-lp_s[idx, nxt].mean()),
    }
