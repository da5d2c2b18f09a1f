"""Prompt preparation: image bytes/path -> Qwen3.5 pixel patches and the chat-formatted prompt ids.

Image preprocessing is transformers' own Qwen2-VL/Qwen3.5 image processor (the PIL variant, which
needs no torchvision), so pixels match what the reference processor feeds the model.
"""

import io
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path

import numpy as np
import torch
from PIL import Image, UnidentifiedImageError
from transformers import AutoTokenizer, Qwen2VLImageProcessorPil
from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import smart_resize

from ocria.errors import RequestError

DEFAULT_PROMPT = "Read this document and transcribe it as Markdown."
DEFAULT_MAX_PIXELS = 1024 * 1024


@dataclass
class PreparedPrompt:
    input_ids: torch.Tensor  # [L] long
    pixel_values: torch.Tensor  # [P, C*Tp*p*p] float32 (uint8 from ``prepare(as_bytes=True)``)
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
        ip = self.image_processor
        self.patch_dim = 3 * ip.temporal_patch_size * ip.patch_size**2  # one RGB patch's values, flattened
        self._device_tables: dict[torch.device, torch.Tensor] = {}  # byte_table per device (on_device)

    @classmethod
    def from_engine_dir(cls, engine_dir: str | Path, max_pixels: int = DEFAULT_MAX_PIXELS) -> "Processor":
        return cls(Path(engine_dir) / "tokenizer", max_pixels)

    def load_image(self, image: bytes | str | Path | Image.Image) -> Image.Image:
        """Decode an image from bytes or a path, or take a decoded one (training's rendered pages skip a
        PNG round trip); one-line RequestError on anything unusable."""
        img, name = (image, "image") if isinstance(image, Image.Image) else _open(image)
        w, h = img.size
        if w * h == 0:
            raise RequestError(f"{name}: image has no pixels ({w}x{h})")
        if w * h > self.max_pixels:  # refused from the header, before a byte of it is decoded
            raise RequestError(f"{name}: image is {w}x{h} = {w * h} pixels, over the limit of {self.max_pixels}")
        try:
            img.load()
        except (OSError, ValueError, Image.DecompressionBombError) as e:
            raise RequestError(f"{name}: not a readable image ({type(e).__name__})") from None
        return img.convert("RGB")

    def prepare(self, image: bytes | str | Path | Image.Image, prompt: str | None = None,
                as_bytes: bool = False) -> PreparedPrompt:
        """The prompt ids and patches of one image. ``as_bytes``: the patches as the resized image's uint8
        values, a quarter of the bytes to move (training batches); ``pixels_from_bytes`` with
        ``byte_table`` turns them into exactly the pixel values of ``as_bytes=False``."""
        img = self.load_image(image)
        try:
            if as_bytes:
                pixel_values, grid = self.patch_bytes(img)
            else:
                out = self.image_processor(images=[img], return_tensors="pt")
                pixel_values, grid = out["pixel_values"].float(), out["image_grid_thw"].long()
        except ValueError as e:  # the processor's own refusals, e.g. an aspect ratio over 200
            raise RequestError(f"image: a {img.width}x{img.height} image cannot be read as a page ({e})") from None
        n_image_tokens = int(grid.prod()) // self.merge**2
        text = DEFAULT_PROMPT if prompt is None else prompt
        head = self.tokenizer.encode("<|im_start|>user\n", add_special_tokens=False)
        tail = self.tokenizer.encode(f"{text}<|im_end|>\n<|im_start|>assistant\n", add_special_tokens=False)
        ids = head + [self.vision_start_id] + [self.image_token_id] * n_image_tokens + [self.vision_end_id] + tail
        return PreparedPrompt(torch.tensor(ids, dtype=torch.long), pixel_values, grid)

    def patch_bytes(self, img: Image.Image) -> tuple[torch.Tensor, torch.Tensor]:
        """The image processor's patches of an RGB image as the resized image's bytes, computed in uint8: the
        processor's resize (``smart_resize``, then PIL with its resample filter) and its patch layout, without
        its float32 round trip (a quarter of the memory traffic; tests check it equals the processor's own
        ``do_rescale=False, do_normalize=False`` output byte for byte). Returns (patches [P, C*Tp*p*p] uint8,
        grid [1, 3])."""
        ip = self.image_processor
        p, m, tp = ip.patch_size, ip.merge_size, ip.temporal_patch_size
        h, w = smart_resize(img.height, img.width, factor=p * m, min_pixels=ip.size.shortest_edge,
                            max_pixels=ip.size.longest_edge)
        pixels = np.asarray(img.resize((w, h), resample=ip.resample))  # [H, W, C]
        gh, gw = h // p, w // p
        blocks = pixels.reshape(gh // m, m, p, gw // m, m, p, pixels.shape[-1]).transpose(0, 3, 1, 4, 6, 2, 5)
        frames = np.broadcast_to(blocks[:, :, :, :, :, None], (*blocks.shape[:5], tp, p, p))  # the image, Tp times
        patches = np.ascontiguousarray(frames).reshape(gh * gw, -1)
        return torch.from_numpy(patches), torch.tensor([[1, gh, gw]], dtype=torch.long)

    def on_device(self, prompt: PreparedPrompt, device: torch.device) -> PreparedPrompt:
        """The prompt's pixels as float values on ``device``: uint8 patch bytes (``prepare(as_bytes=True)``, a
        quarter of the bytes to move) become exactly the values of ``as_bytes=False`` through ``byte_table``, on the
        device (the table is copied there once per device)."""
        pixels = prompt.pixel_values
        if pixels is not None and pixels.dtype == torch.uint8:
            table = self._device_tables.get(device)
            if table is None:
                table = self._device_tables[device] = self.byte_table.to(device)
            pixels = pixels_from_bytes(pixels.to(device, non_blocking=True), table)
        return PreparedPrompt(prompt.input_ids, pixels, prompt.image_grid_thw)

    @cached_property
    def byte_table(self) -> torch.Tensor:
        """[channels, 256] float32: the pixel value ``prepare`` gives byte v of channel c. Read off the image
        processor itself (rescale and normalize act per element and channel) on a ramp image holding every
        byte in every channel, so it follows whatever arithmetic the processor does."""
        side = self.image_processor.patch_size * self.merge
        ramp = np.repeat(np.arange(256, dtype=np.uint8)[None, :, None], side, 0).repeat(3, 2)  # [side, 256, 3]
        img = Image.fromarray(ramp, "RGB")
        kwargs = {"images": [img], "do_resize": False, "return_tensors": "pt"}
        raw = self.image_processor(do_rescale=False, do_normalize=False, **kwargs)["pixel_values"].long()
        norm = self.image_processor(**kwargs)["pixel_values"].float()
        channels = raw.shape[1] // (self.image_processor.temporal_patch_size * self.image_processor.patch_size ** 2)
        table = torch.full((channels, 256), float("nan"))
        for c, (r, v) in enumerate(zip(raw.chunk(channels, 1), norm.chunk(channels, 1))):
            table[c, r.flatten()] = v.flatten()
        if table.isnan().any() or not torch.equal(pixels_from_bytes(raw.to(torch.uint8), table), norm):
            raise RuntimeError("image processor is not a per-channel map of the bytes: byte_table cannot stand in")
        return table


def pixels_from_bytes(patch_bytes: torch.Tensor, table: torch.Tensor) -> torch.Tensor:
    """uint8 patches [P, C*Tp*p*p] (channel-major rows, as the processor lays them out) -> their float32
    pixel values via ``Processor.byte_table`` [C, 256], on the patches' device."""
    table = table.to(patch_bytes.device)
    return torch.cat([t[b.int()] for t, b in zip(table, patch_bytes.chunk(table.shape[0], 1))], 1)


def _open(image: bytes | str | Path) -> tuple[Image.Image, str]:
    """(opened image, name for errors) from encoded bytes or a file path; only the header is read here."""
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
    except Image.DecompressionBombError:
        raise RequestError(f"{name}: the image declares more pixels than any page has (a decompression bomb)") from None
    except (UnidentifiedImageError, OSError, ValueError) as e:
        raise RequestError(f"{name}: not a readable image ({type(e).__name__})") from None
    return img, name
