"""Incremental detokenization: emit text only once it is final, so streamed pieces concatenate to
exactly ``tokenizer.decode(all_ids)`` (no broken multi-byte characters, no lost spaces).

A push decodes only the tokens since the last clean boundary, not the whole output: with a byte-level BPE
decoder (Qwen's) and no clean-up of spaces, the text of ``ids`` is the UTF-8 decoding of their bytes, so where the
text so far ends on a whole character, ``decode(a + b) == decode(a) + decode(b)``. Other decoders (which may
strip or merge across tokens) decode the whole output on every push, as the definition says.
"""

from collections.abc import Callable


def _decoder(tokenizer, skip_special_tokens: bool) -> tuple[Callable[[list[int]], str], bool]:
    """(ids -> text, whether text splits exactly at clean boundaries) for a transformers tokenizer."""
    backend = getattr(tokenizer, "backend_tokenizer", None)
    if backend is None or getattr(tokenizer, "clean_up_tokenization_spaces", True):
        return (lambda ids: tokenizer.decode(ids, skip_special_tokens=skip_special_tokens)), False
    splits = type(backend.decoder).__name__ == "ByteLevel"
    return (lambda ids: backend.decode(ids, skip_special_tokens=skip_special_tokens)), splits


class IncrementalDetokenizer:
    """One request's output text, token ids in, final text out.

    Args:
        tokenizer: a transformers tokenizer (fast tokenizers with a byte-level decoder decode incrementally).
        skip_special_tokens: leave special tokens out of the text.
    """

    def __init__(self, tokenizer, skip_special_tokens: bool = True):
        self._decode, self._splits = _decoder(tokenizer, skip_special_tokens)
        self.ids: list[int] = []
        self._done = 0  # ids[:_done] decode to _done_text for good (a clean boundary)
        self._done_text = ""
        self.emitted = ""

    def _text(self) -> str:
        return self._done_text + self._decode(self.ids[self._done:])

    def push(self, token_ids: list[int]) -> str:
        """Add tokens.

        Args:
            token_ids: the new token ids.

        Returns:
            The new final text: empty while the text ends in an incomplete character.
        """
        self.ids.extend(token_ids)
        text = self._text()
        if text.endswith("\ufffd"):
            return ""
        if self._splits:
            self._done, self._done_text = len(self.ids), text
        return self._advance(text)

    def flush(self) -> str:
        """End of stream: return whatever is left, replacement characters included."""
        return self._advance(self._text())

    def _advance(self, text: str) -> str:
        new = text[len(self.emitted):] if text.startswith(self.emitted) else ""
        self.emitted = text if text.startswith(self.emitted) else self.emitted
        return new

    @property
    def text(self) -> str:
        """All the text returned so far by ``push`` and ``flush``."""
        return self.emitted
