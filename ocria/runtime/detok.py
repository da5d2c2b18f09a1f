"""Incremental detokenization: emit text only once it is final, so streamed pieces concatenate to
exactly ``tokenizer.decode(all_ids)`` (no broken multi-byte characters, no lost spaces)."""


class IncrementalDetokenizer:
    def __init__(self, tokenizer, skip_special_tokens: bool = True):
        self.tokenizer = tokenizer
        self.skip = skip_special_tokens
        self.ids: list[int] = []
        self.emitted = ""

    def _decode(self) -> str:
        return self.tokenizer.decode(self.ids, skip_special_tokens=self.skip)

    def push(self, token_ids: list[int]) -> str:
        """Add tokens; return the new final text (held back while it ends in an incomplete character)."""
        self.ids.extend(token_ids)
        text = self._decode()
        if text.endswith("\ufffd"):
            return ""
        return self._advance(text)

    def flush(self) -> str:
        """End of stream: return whatever is left, replacement characters included."""
        return self._advance(self._decode())

    def _advance(self, text: str) -> str:
        new = text[len(self.emitted):] if text.startswith(self.emitted) else ""
        self.emitted = text if text.startswith(self.emitted) else self.emitted
        return new

    @property
    def text(self) -> str:
        return self.emitted
