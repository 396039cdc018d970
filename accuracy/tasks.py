"""Prompts and metrics of the study.

Needles, RULER style (its niah template and needle sentence), in the King James Bible as haystack:
"Some special magic numbers are hidden within the following text. ..." then the text with the
needles "One of the special magic numbers for {key} is: {7 digits}." at relative depths, then the
question. Kinds (RULER's niah_single, niah_multikey, niah_multivalue):
- `single`: one needle; the first number of the greedy answer must be its value.
- `multikey`: four needles for four different keys; the question asks for the one at the prompt's
  depth, the other three are distractors a quarter of the haystack apart.
- `multivalue`: four needles with the same key and four values, a quarter of the haystack apart
  starting at the depth; the answer must contain all four values.
Prompt i of a length has kind KINDS[i % 3] and depth DEPTHS[(i // 3) % 9] (0.1 ... 0.9), its own
keys and values (seeded by length and i) and its own stretch of the haystack, so any number of
prompts covers the kinds and depths evenly.
Text windows: plain text (`kjv`, `code`), scored at held-out positions of the second half.

`build_pack` makes every prompt's token ids once (the tokenizer and the corpora are needed only
there); `load_pack` reads them back on any machine.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import re

import numpy as np

KINDS = ("single", "multikey", "multivalue")
DEPTHS = tuple(round(0.1 * i, 1) for i in range(1, 10))
NEEDLES = {"single": 1, "multikey": 4, "multivalue": 4}
ANSWER_TOKENS = {"single": 12, "multikey": 12, "multivalue": 48}
NEEDLE_EVAL_POSITIONS = 64     # held-out haystack positions scored per needle prompt
WINDOW_EVAL_POSITIONS = 512    # per text window
KEYS = ("lantern", "orchard", "falcon", "harbor", "meadow", "copper", "violet", "glacier",
        "anchor", "basket", "candle", "desert", "engine", "feather", "garden", "hammer",
        "island", "jacket", "kettle", "ladder", "marble", "needle", "oyster", "pepper",
        "quartz", "ribbon", "saddle", "tunnel", "umbrella", "velvet", "walnut", "yellow",
        "zephyr", "bridge", "castle", "dragon", "forest", "helmet", "jungle", "meteor",
        "parrot", "rocket", "silver", "tiger", "wizard", "pillow", "mirror", "cactus")
PREFIX = ("Some special magic numbers are hidden within the following text. Make sure to memorize "
          "it. I will quiz you about the numbers afterwards.\n")


def _needle(key: str, value: str) -> str:
    return f" One of the special magic numbers for {key} is: {value}."


def _question(kind: str, key: str) -> str:
    if kind == "multivalue":
        return (f"\nWhat are all the special magic numbers for {key} mentioned in the provided "
                f"text? The special magic numbers for {key} mentioned in the provided text are")
    return (f"\nWhat is the special magic number for {key} mentioned in the provided text? The "
            f"special magic number for {key} mentioned in the provided text is")


@dataclasses.dataclass
class Prompt:
    name: str
    tokens: np.ndarray          # int64 [length]
    eval_rows: np.ndarray       # positions whose next-token distribution is compared
    kind: str = "text"          # "text" or one of KINDS
    depth: float | None = None
    answers: tuple = ()         # the values the answer must contain (needles)

    @property
    def answer_tokens(self) -> int:
        return ANSWER_TOKENS.get(self.kind, 0)


def eval_rows(lo: int, hi: int, n: int) -> np.ndarray:
    """Up to n positions in [lo, hi), evenly spaced (their next token is in the prompt)."""
    return np.unique(np.linspace(lo, hi - 1, min(n, hi - lo)).astype(np.int64))


def _rng(*tag) -> np.random.Generator:
    digest = hashlib.sha256("/".join(map(str, tag)).encode()).digest()
    return np.random.default_rng(int.from_bytes(digest[:8], "little"))


def needle_prompt(encode, haystack: np.ndarray, length: int, i: int, ends=None) -> Prompt:
    """Needle prompt i of `length` tokens exactly; `encode(str) -> ids` (no special tokens),
    `haystack` the corpus' ids (its stretch starts at a seeded offset); `ends`, a boolean array
    over the vocabulary, marks the tokens that end a sentence (needles start after one)."""
    kind, depth = KINDS[i % len(KINDS)], DEPTHS[(i // len(KINDS)) % len(DEPTHS)]
    rng = _rng("needle", length, i)
    n = NEEDLES[kind]
    keys = [str(k) for k in rng.choice(KEYS, size=1 if kind == "multivalue" else n, replace=False)]
    values = [str(int(v)) for v in rng.choice(np.arange(10**6, 10**7), size=n, replace=False)]
    pairs = [(keys[0], v) for v in values] if kind == "multivalue" else list(zip(keys, values))
    prefix = np.asarray(encode(PREFIX), np.int64)
    question = np.asarray(encode(_question(kind, keys[0])), np.int64)
    needles = [np.asarray(encode(_needle(k, v)), np.int64) for k, v in pairs]
    body = length - len(prefix) - len(question) - sum(len(x) for x in needles)
    start = int(rng.integers(0, len(haystack) - body))
    hay = np.asarray(haystack[start:start + body], np.int64)
    # needle j at depth + j / n (mod 1); needle 0 (the asked key / first value) at `depth`
    depths = [(depth + j / n) % 1.0 for j in range(n)]
    pieces, prev = [prefix], 0
    for j in np.argsort(depths, kind="stable"):
        cut = max(prev, _sentence_start(hay, int(depths[j] * body), ends))
        pieces += [hay[prev:cut], needles[j]]
        prev = cut
    pieces += [hay[prev:], question]
    ids = np.concatenate(pieces)
    assert len(ids) == length, (len(ids), length)
    answers = tuple(values) if kind == "multivalue" else (values[0],)
    return Prompt(f"needle/{kind}/d{depth:.1f}/{i}", ids,
                  eval_rows(length // 2, length - len(question) - 1, NEEDLE_EVAL_POSITIONS),
                  kind, depth, answers)


def _sentence_start(hay: np.ndarray, at: int, ends) -> int:
    """The first index >= at just after a sentence-ending token (at itself without `ends`)."""
    if ends is None or at == 0:
        return at
    after = np.flatnonzero(ends[hay[at - 1:-1]])
    return at + int(after[0]) if len(after) else at


def window_prompt(text: str, ids: np.ndarray, length: int, i: int) -> Prompt:
    """Text window i of `length` tokens: a seeded stretch of the corpus `text`."""
    start = int(_rng("window", text, length, i).integers(0, len(ids) - length + 1))
    window = np.asarray(ids[start:start + length], np.int64)
    return Prompt(f"text/{text}/{i}", window,
                  eval_rows(length // 2, length - 1, WINDOW_EVAL_POSITIONS))


def needle_correct(kind: str, answer: str, answers) -> bool:
    """Exact match: the first number is the value (single, multikey); every value is among the
    answer's numbers (multivalue)."""
    numbers = re.findall(r"\d+", answer)
    if kind == "multivalue":
        return set(answers) <= set(numbers)
    return bool(numbers) and numbers[0] == answers[0]


def build_pack(path: str, encode, corpora: dict, lengths, needles: int, windows: int,
               ends=None) -> None:
    """Writes every prompt (needles and text windows of each length) to an .npz."""
    prompts = []
    for length in lengths:
        prompts += [needle_prompt(encode, corpora["kjv"], length, i, ends) for i in range(needles)]
        prompts += [window_prompt(name, ids, length, i) for name, ids in sorted(corpora.items())
                    for i in range(windows)]
    meta = [{"name": p.name, "kind": p.kind, "depth": p.depth, "answers": list(p.answers),
             "length": len(p.tokens), "eval_rows": p.eval_rows.tolist()} for p in prompts]
    np.savez_compressed(path, tokens=np.concatenate([p.tokens for p in prompts]).astype(np.int32),
                        meta=np.asarray(json.dumps(meta)))


def load_pack(path: str) -> list[Prompt]:
    z = np.load(path)
    tokens, out, at = z["tokens"].astype(np.int64), [], 0
    for m in json.loads(str(z["meta"])):
        out.append(Prompt(m["name"], tokens[at:at + m["length"]], np.asarray(m["eval_rows"]),
                          m["kind"], m["depth"], tuple(m["answers"])))
        at += m["length"]
    return out


def select(prompts, length: int, needles: int, windows: int, texts=("code", "kjv")) -> list[Prompt]:
    """The first `needles` needle prompts and `windows` windows of each of `texts` at `length`."""
    at = [p for p in prompts if len(p.tokens) == length]
    picked = [p for p in at if p.kind != "text"][:needles]
    for text in sorted(texts):
        picked += [p for p in at if p.name.startswith(f"text/{text}/")][:windows]
    return picked


def compare_logits(dense_logits, sparse_logits, next_tokens):
    """Next-token metrics between dense and sparse logits [N, V] (torch tensors, float64 where
    they live): top-1 agreement, KL(dense || sparse), both NLLs of the text's next token."""
    import torch
    lp_d = torch.log_softmax(dense_logits.double(), dim=-1)
    lp_s = torch.log_softmax(sparse_logits.double(), dim=-1)
    kl = (lp_d.exp() * (lp_d - lp_s)).sum(dim=-1)
    idx = torch.arange(len(next_tokens), device=lp_d.device)
    nxt = torch.as_tensor(np.asarray(next_tokens, np.int64), device=lp_d.device)
    return {
        "n": int(len(next_tokens)),
        "top1_agree": float((dense_logits.argmax(-1) == sparse_logits.argmax(-1)).double().mean()),
        "top1_hits": int((dense_logits.argmax(-1) == sparse_logits.argmax(-1)).sum()),
        "kl_mean": float(kl.mean()),
        "kl_max": float(kl.max()),
        "nll_dense": float(-lp_d[idx, nxt].mean()),
        "nll_sparse": float(-lp_s[idx, nxt].mean()),
    }
