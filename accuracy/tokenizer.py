"""GPT-2 style byte-level BPE built from the GGUF's own tables (tokenizer.ggml.tokens / merges).

Pre-tokenization follows the GGUF's `tokenizer.ggml.pre = "smollm"`: every digit is its own piece,
then the GPT-2 split regex runs on the rest. Special (control) tokens such as <|im_start|> are matched
literally before BPE.
"""

from __future__ import annotations

import functools

import regex

GPT2_SPLIT = regex.compile(
    r"""'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+""")
DIGIT = regex.compile(r"\p{N}")
CONTROL_TOKEN_TYPE = 3


def _byte_to_unicode() -> dict[int, str]:
    """GPT-2's reversible map from bytes to printable code points."""
    printable = (list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1))
                 + list(range(ord("®"), ord("ÿ") + 1)))
    mapping, extra = {}, 0
    for b in range(256):
        if b in printable:
            mapping[b] = chr(b)
        else:
            mapping[b] = chr(256 + extra)
            extra += 1
    return mapping


class ByteLevelBPE:
    def __init__(self, tables: dict):
        if tables["pre"] not in ("smollm", "gpt2", "default"):
            raise ValueError(f"unsupported pre-tokenizer {tables['pre']!r}")
        self.tokens: list[str] = tables["tokens"]
        self.token_to_id = {t: i for i, t in enumerate(self.tokens)}
        self.merge_rank = {tuple(m.split(" ", 1)): r for r, m in enumerate(tables["merges"])}
        self.byte_encoder = _byte_to_unicode()
        self.byte_decoder = {u: b for b, u in self.byte_encoder.items()}
        self.bos_id, self.eos_id = tables["bos_id"], tables["eos_id"]
        self.specials = {self.tokens[i]: i for i, t in enumerate(tables["token_type"])
                         if t == CONTROL_TOKEN_TYPE}
        self.split_digits = tables["pre"] == "smollm"
        alternatives = "|".join(regex.escape(s) for s in sorted(self.specials, key=len, reverse=True))
        self.special_re = regex.compile(f"({alternatives})") if alternatives else None

    @functools.lru_cache(maxsize=1 << 16)
    def _bpe(self, word: str) -> tuple[int, ...]:
        parts = list(word)
        while len(parts) > 1:
            ranked = [(self.merge_rank.get((a, b), 1 << 30), i)
                      for i, (a, b) in enumerate(zip(parts, parts[1:]))]
            rank, i = min(ranked)
            if rank == 1 << 30:
                break
            parts[i:i + 2] = [parts[i] + parts[i + 1]]
        return tuple(self.token_to_id[p] for p in parts)

    def _pieces(self, text: str):
        if not self.split_digits:
            yield from GPT2_SPLIT.findall(text)
            return
        start = 0
        for m in DIGIT.finditer(text):
            if m.start() > start:
                yield from GPT2_SPLIT.findall(text[start:m.start()])
            yield m.group()
            start = m.end()
        if start < len(text):
            yield from GPT2_SPLIT.findall(text[start:])

    def encode(self, text: str) -> list[int]:
        ids: list[int] = []
        chunks = self.special_re.split(text) if self.special_re else [text]
        for chunk in chunks:
            if not chunk:
                continue
            if chunk in self.specials:
                ids.append(self.specials[chunk])
                continue
            for piece in self._pieces(chunk):
                ids.extend(self._bpe("".join(self.byte_encoder[b] for b in piece.encode("utf-8"))))
        return ids

    def decode(self, ids) -> str:
        out = bytearray()
        for i in ids:
            tok = self.tokens[int(i)]
            if tok in self.specials:
                out.extend(tok.encode("utf-8"))
            else:
                out.extend(self.byte_decoder[c] for c in tok)
        return out.decode("utf-8", errors="replace")
