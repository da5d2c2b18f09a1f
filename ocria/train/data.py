"""Training batches: synthetic documents encoded exactly as at inference, rendered by worker processes.

The documents are the reading mixture (``ocria.data.READING``: broad text, many typefaces, every layout family
but the held-out one, scan artifacts, pages over the pixel budget, which the processor resizes as at inference).
Sample ``i`` of the train split is document ``split_seeds("train", 1, start=i)``; batch ``b`` holds
samples ``o + b*B .. o + b*B+B-1`` (``o``: the run's ``data_offset``, 0 unless a further run asks for documents
earlier runs did not read). The data cursor of a checkpoint is therefore just the next batch index, and a resumed
run sees the same documents in the same order. Rendering + preprocessing costs a few ms per document, so
``loader`` spreads it over DataLoader worker processes.
"""

import dataclasses
from dataclasses import dataclass, fields
from pathlib import Path

import torch
from torch import Tensor
from torch.utils.data import DataLoader, Dataset

from ocria.data import READING, Document, SynthConfig, generate, split_seeds
from ocria.models import mrope_positions
from ocria.runtime.processor import Processor, pixels_from_bytes

IGNORE = -100


@dataclass
class Sample:
    """One document as the model sees it: prompt + answer ids, mRoPE positions, patches."""

    input_ids: Tensor  # [N] prompt ids followed by the answer (Markdown ids + eos)
    positions: Tensor  # [3, N]
    pixel_bytes: Tensor  # [P, C*Tp*p*p] uint8 (``Processor.prepare(as_bytes=True)``)
    pixel_table: Tensor  # [C, 256] float32: ``Processor.byte_table``
    image_grid_thw: Tensor  # [1, 3]
    prompt_len: int


@dataclass
class Batch:
    input_ids: Tensor  # [B, N] right-padded with the pad id
    positions: Tensor  # [3, B, N]
    labels: Tensor  # [B, N]: next token at answer positions, IGNORE elsewhere
    pixel_bytes: Tensor  # [sum P, C*Tp*p*p] uint8 in batch order: a quarter of the float32 bytes to move
    pixel_table: Tensor  # [C, 256] float32
    image_grid_thw: Tensor  # [B, 3]
    prompt_len: Tensor  # [B]
    seq_len: Tensor  # [B] unpadded lengths

    @property
    def pixel_values(self) -> Tensor:
        """[sum P, C*Tp*p*p] float32, exactly the processor's pixel values, computed where the bytes are."""
        return pixels_from_bytes(self.pixel_bytes, self.pixel_table)

    def to(self, device: torch.device | str) -> "Batch":
        return self._map(lambda t: t.to(device, non_blocking=True))

    def pin_memory(self) -> "Batch":
        """Called by the DataLoader's pin-memory thread, which leaves objects without this method in pageable
        memory (and their copy to the GPU synchronous)."""
        return self._map(Tensor.pin_memory)

    def _map(self, fn) -> "Batch":
        return Batch(**{f.name: fn(getattr(self, f.name)) for f in fields(self)})


def encode(processor: Processor, doc: Document) -> Sample:
    """The exact inference prompt (``Processor.prepare`` on the rendered page, the pixels its lossless PNG
    would decode to, kept as bytes) plus the answer."""
    prompt = processor.prepare(doc.image, as_bytes=True)
    answer = processor.tokenizer.encode(doc.markdown, add_special_tokens=False) + [processor.eos_token_id]
    ids = torch.cat([prompt.input_ids, torch.tensor(answer, dtype=torch.long)])
    positions, _ = mrope_positions(ids, prompt.image_grid_thw, processor.image_token_id, processor.merge)
    return Sample(ids, positions, prompt.pixel_values, processor.byte_table, prompt.image_grid_thw,
                  prompt.input_ids.numel())


def collate(samples: list[Sample], pad_id: int) -> Batch:
    B, N = len(samples), max(s.input_ids.numel() for s in samples)
    ids = torch.full((B, N), pad_id, dtype=torch.long)
    labels = torch.full((B, N), IGNORE, dtype=torch.long)
    positions = torch.zeros(3, B, N, dtype=torch.long)
    for b, s in enumerate(samples):
        n = s.input_ids.numel()
        ids[b, :n] = s.input_ids
        labels[b, s.prompt_len - 1:n - 1] = s.input_ids[s.prompt_len:]
        positions[:, b, :n] = s.positions
        positions[:, b, n:] = s.positions[:, -1:] + torch.arange(1, N - n + 1)  # pads continue the sequence
    return Batch(
        input_ids=ids, positions=positions, labels=labels,
        pixel_bytes=torch.cat([s.pixel_bytes for s in samples]), pixel_table=samples[0].pixel_table,
        image_grid_thw=torch.cat([s.image_grid_thw for s in samples]),
        prompt_len=torch.tensor([s.prompt_len for s in samples]),
        seq_len=torch.tensor([s.input_ids.numel() for s in samples]),
    )


def image_swap_pair(processor: Processor, docs: list[Document], pad_id: int = 0) -> tuple[Batch, Batch]:
    """The same answers twice: with their own page images, and each with the next document's image.
    The loss difference between the two says how much the model reads the image (0: not at all)."""
    swapped = [dataclasses.replace(d, image=docs[(i + 1) % len(docs)].image) for i, d in enumerate(docs)]
    return (collate([encode(processor, d) for d in docs], pad_id),
            collate([encode(processor, d) for d in swapped], pad_id))


class SplitDocuments(Dataset):
    """Sample i = document i of a split (of one kind when ``kind`` is set), encoded; the processor is
    built lazily in each worker."""

    def __init__(self, assets: Path, split: str = "train", config: SynthConfig = READING,
                 kind: str | None = None):
        self.assets, self.split, self.config, self.kind = Path(assets), split, config, kind
        self._processor: Processor | None = None

    @property
    def processor(self) -> Processor:
        if self._processor is None:
            self._processor = Processor(self.assets)
        return self._processor

    def __len__(self) -> int:
        return 1 << 30

    def __getitem__(self, i: int) -> Sample:
        return encode(self.processor, generate(split_seeds(self.split, 1, start=i)[0], self.kind, self.config))


class _Collate:
    def __init__(self, pad_id: int):
        self.pad_id = pad_id

    def __call__(self, samples: list[Sample]) -> Batch:
        return collate(samples, self.pad_id)


class _Batches:
    """Sample indices of batches ``start, start + 1, ...`` (endless; the caller stops), ``first_doc`` on."""

    def __init__(self, start: int, size: int, first_doc: int = 0):
        self.start, self.size, self.first_doc = start, size, first_doc

    def __iter__(self):
        b = self.start
        while True:
            yield list(range(self.first_doc + b * self.size, self.first_doc + (b + 1) * self.size))
            b += 1


def loader(assets: Path, batch_size: int, start_batch: int, workers: int, split: str = "train",
           pad_id: int = 0, kind: str | None = None, first_doc: int = 0) -> DataLoader:
    """Batches ``start_batch, start_batch + 1, ...`` of ``split`` counted from document ``first_doc``, in order,
    without end. Each worker keeps up to 4 batches ready, fewer for big batches (the patch bytes are about half a
    MB per page: at batch 256, 12 workers x 4 batches would hold GBs of host memory)."""
    batches = _Batches(start_batch, batch_size, first_doc)
    return DataLoader(SplitDocuments(assets, split, kind=kind), batch_sampler=batches,
                      collate_fn=_Collate(pad_id),
                      num_workers=workers, pin_memory=torch.cuda.is_available(),
                      prefetch_factor=max(1, min(4, 512 // batch_size)) if workers else None, persistent_workers=False)
