"""Prompt preparation: image bytes/path -> Qwen3.5 pixel patches and the chat-formatted prompt ids.

Image preprocessing is transformers' own Qwen2-VL/Qwen3.5 image processor (the PIL variant, which
needs no torchvision), so pixels match what the reference processor feeds the model.
"""

import io
from dataclasses import dataclass
from pathlib import Path

import torch
from PIL import Image, UnidentifiedImageError
from transformers import AutoTokenizer, Qwen2VLImageProcessorPil

from ocria.errors import RequestError

DEFAULT_PROMPT = "Read this document and transcribe it as Markdown."
DEFAULT_MAX_PIXELS = 1024 * 1024


@dataclass
class PreparedPrompt:
    input_ids: torch.Tensor  # [L] long
    pixel_values: torch.Tensor  # [P, C*Tp*p*p] float32
    image_grid_thw: torch.Tensor  # [1, 3] long


class Processor:
    """Tokenizer + image processor of an engine (no model weights: cheap to load anywhere)."""

    def __init__(self, directory: str | Path, max_pixels: int = DEFAULT_MAX_PIXELS):
        directory = Path(directory)
        self.tokenizer = AutoTokenizer.from_pretrained(str(directory), local_files_only=True)
        self.image_processor = Qwen2VLImageProcessorPil.from_pretrained(str(directory), local_files_only=True)
        self.max_pixels = max_pixels
        vocab = self.tokenizer.get_vocab()
        self.image_token_id = vocab["<|image_pad|>"]
        self.vision_start_id = vocab["<|vision_start|>"]
        self.vision_end_id = vocab["<|vision_end|>"]
        self.eos_token_id = self.tokenizer.eos_token_id
        self.merge = self.image_processor.merge_size

    @classmethod
    def from_engine_dir(cls, engine_dir: str | Path, max_pixels: int = DEFAULT_MAX_PIXELS) -> "Processor":
        return cls(Path(engine_dir) / "tokenizer", max_pixels)

    def load_image(self, image: bytes | str | Path | Image.Image) -> Image.Image:
        """Decode an image from bytes or a path, or take a decoded one (training's rendered pages skip a
        PNG round trip); one-line RequestError on anything unusable."""
        img, name = (image, "image") if isinstance(image, Image.Image) else _decode(image)
        w, h = img.size
        if w * h == 0:
            raise RequestError(f"{name}: image has no pixels ({w}x{h})")
        if w * h > self.max_pixels:
            raise RequestError(f"{name}: image is {w}x{h} = {w * h} pixels, over the limit of {self.max_pixels}")
        return img.convert("RGB")

    def prepare(self, image: bytes | str | Path | Image.Image, prompt: str | None = None) -> PreparedPrompt:
        img = self.load_image(image)
        out = self.image_processor(images=[img], return_tensors="pt")
        pixel_values, grid = out["pixel_values"].float(), out["image_grid_thw"].long()
        n_image_tokens = int(grid.prod()) // self.merge**2
        text = DEFAULT_PROMPT if prompt is None else prompt
        head = self.tokenizer.encode("<|im_start|>user\n", add_special_tokens=False)
        tail = self.tokenizer.encode(f"{text}<|im_end|>\n<|im_start|>assistant\n", add_special_tokens=False)
        ids = head + [self.vision_start_id] + [self.image_token_id] * n_image_tokens + [self.vision_end_id] + tail
        return PreparedPrompt(torch.tensor(ids, dtype=torch.long), pixel_values, grid)


def _decode(image: bytes | str | Path) -> tuple[Image.Image, str]:
    """(decoded image, name for errors) from encoded bytes or a file path."""
    if isinstance(image, (str, Path)):
        path = Path(image)
        if not path.is_file():
            raise RequestError(f"{path}: image file not found")
        data, name = path.read_bytes(), str(path)
    else:
        data, name = bytes(image), "image"
    if not data:
        raise RequestError(f"{name}: image is empty (0 bytes)")
    try:
        img = Image.open(io.BytesIO(data))
        img.load()
    except (UnidentifiedImageError, OSError, ValueError, Image.DecompressionBombError) as e:
        raise RequestError(f"{name}: not a readable image ({type(e).__name__})") from None
    return img, name
