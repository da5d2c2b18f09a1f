"""Prompt preparation: image bytes/path -> Qwen3.5 pixel patches and the chat-formatted prompt ids.

Pixels follow transformers' Qwen2-VL/Qwen3.5 image processor (the PIL variant) exactly: its resize rule
(``smart_resize``), PIL resample filter, patch layout and rescale/normalize arithmetic, read from the engine's
``preprocessor_config.json``. The processor itself is the tests' reference, not imported here: its module pulls in
transformers' modeling stack (and SciPy), which the Triton Python stub's NumPy < 2 environment cannot import on
images whose SciPy needs NumPy 2.

As in Qwen2-VL, an image of any size is resized (aspect kept, sides multiples of 32) to between the processor's
min_pixels and the engine's pixel budget. Only what cannot be a page is refused, from its header: an image
declaring more pixels than a page scan has (a decompression bomb), or an aspect ratio over 200.
"""

import io
import json
import math
import warnings
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path

import numpy as np
import torch
from PIL import Image, UnidentifiedImageError
from transformers import PreTrainedTokenizerFast

from ocria.errors import OcriaError, RequestError

DEFAULT_PROMPT = "Read this document and transcribe it as Markdown."
DEFAULT_MAX_PIXELS = 1024 * 1024
MAX_ASPECT_RATIO = 200  # the image processor's own limit
# Pixels no page scan has: an A3 sheet at 600 dpi is 70 million (PIL itself warns from 89.5 million).
MAX_PAGE_PIXELS = 80_000_000


@dataclass(frozen=True)
class ImageConfig:
    """The fields of a Qwen2-VL ``preprocessor_config.json`` that decide the patches."""

    patch_size: int
    temporal_patch_size: int
    merge_size: int
    min_pixels: int  # size.shortest_edge
    max_pixels: int  # size.longest_edge
    resample: int  # PIL filter
    rescale_factor: float
    image_mean: tuple[float, ...]
    image_std: tuple[float, ...]

    @classmethod
    def load(cls, path: Path) -> "ImageConfig":
        """Read ``path`` (a ``preprocessor_config.json``); OcriaError naming it if it is not one."""
        try:
            c = json.loads(path.read_text())
            return cls(c["patch_size"], c["temporal_patch_size"], c["merge_size"], c["size"]["shortest_edge"],
                       c["size"]["longest_edge"], c.get("resample", 3), c["rescale_factor"],
                       tuple(c["image_mean"]), tuple(c["image_std"]))
        except (OSError, ValueError, KeyError, TypeError) as e:
            raise OcriaError(f"{path}: not a Qwen2-VL image processor config ({type(e).__name__}: {e})") from None


def smart_resize(height: int, width: int, factor: int, min_pixels: int, max_pixels: int) -> tuple[int, int]:
    """Qwen2-VL's resize rule: both sides multiples of ``factor``, the area within [min_pixels, max_pixels], the
    aspect ratio kept as nearly as rounding allows; ValueError for an aspect ratio over ``MAX_ASPECT_RATIO``.

    Args:
        height, width: the image's size in pixels.
        factor: what both sides become multiples of (patch size x merge size).
        min_pixels, max_pixels: the bounds on the resized area.

    Returns:
        (height, width) resized.
    """
    if max(height, width) / min(height, width) > MAX_ASPECT_RATIO:
        raise ValueError(f"absolute aspect ratio must be smaller than {MAX_ASPECT_RATIO}, got "
                         f"{max(height, width) / min(height, width)}")
    h_bar = round(height / factor) * factor
    w_bar = round(width / factor) * factor
    if h_bar * w_bar > max_pixels:
        beta = math.sqrt((height * width) / max_pixels)
        h_bar = max(factor, math.floor(height / beta / factor) * factor)
        w_bar = max(factor, math.floor(width / beta / factor) * factor)
    elif h_bar * w_bar < min_pixels:
        beta = math.sqrt(min_pixels / (height * width))
        h_bar = math.ceil(height * beta / factor) * factor
        w_bar = math.ceil(width * beta / factor) * factor
    return h_bar, w_bar


@dataclass(frozen=True)
class Resize:
    """An image's (width, height) as given and as the model sees it."""

    original: tuple[int, int]
    resized: tuple[int, int]


@dataclass
class PreparedPrompt:
    """One request's model inputs, on the CPU (``Processor.on_device`` moves the pixels)."""

    input_ids: torch.Tensor  # [L] long
    pixel_values: torch.Tensor  # [P, C*Tp*p*p] float32 (uint8 from ``prepare(as_bytes=True)``)
    image_grid_thw: torch.Tensor  # [1, 3] long
    resize: Resize | None = None  # the image's size before and after the processor's resize


class Processor:
    """Tokenizer + image processor of an engine (no model weights: cheap to load anywhere).

    Args:
        directory: the tokenizer directory (tokenizer files and ``preprocessor_config.json``).
        max_pixels: the engine's pixel budget. Images are resized to at most this many pixels, or to the
            processor config's own max_pixels (``size.longest_edge``, what the model was trained at) if smaller.
    """

    def __init__(self, directory: str | Path, max_pixels: int = DEFAULT_MAX_PIXELS):
        directory = Path(directory)
        self.tokenizer = PreTrainedTokenizerFast.from_pretrained(str(directory), local_files_only=True)
        self.image = ImageConfig.load(directory / "preprocessor_config.json")
        self.max_pixels = min(max_pixels, self.image.max_pixels)
        vocab = self.tokenizer.get_vocab()
        self.image_token_id = vocab["<|image_pad|>"]
        self.vision_start_id = vocab["<|vision_start|>"]
        self.vision_end_id = vocab["<|vision_end|>"]
        self.eos_token_id = self.tokenizer.eos_token_id
        self.merge = self.image.merge_size
        # one RGB patch's values, flattened
        self.patch_dim = 3 * self.image.temporal_patch_size * self.image.patch_size**2
        self._device_tables: dict[torch.device, torch.Tensor] = {}  # byte_table per device (on_device)

    @classmethod
    def from_engine_dir(cls, engine_dir: str | Path, max_pixels: int = DEFAULT_MAX_PIXELS) -> "Processor":
        """The processor of an engine directory (its ``tokenizer/``)."""
        return cls(Path(engine_dir) / "tokenizer", max_pixels)

    def load_image(self, image: bytes | str | Path | Image.Image) -> Image.Image:
        """Decode an image from bytes or a path, or take a decoded one (training's rendered pages skip a
        PNG round trip); one-line RequestError on anything unusable."""
        img, name = (image, "image") if isinstance(image, Image.Image) else _open(image)
        self.resized_size(img.width, img.height, name)  # refused from the header, before a byte of it is decoded
        try:
            img.load()
        except (OSError, ValueError, Image.DecompressionBombError) as e:
            raise RequestError(f"{name}: not a readable image ({type(e).__name__})") from None
        return img.convert("RGB")

    def resized_size(self, width: int, height: int, name: str = "image") -> tuple[int, int]:
        """(width, height) a ``width`` x ``height`` image is resized to: sides multiples of patch x merge, at most
        the pixel budget, at least the processor's min_pixels, aspect kept. One-line RequestError for what cannot
        be a page."""
        if width * height == 0:
            raise RequestError(f"{name}: image has no pixels ({width}x{height})")
        if width * height > MAX_PAGE_PIXELS:
            raise RequestError(f"{name}: the image declares {width}x{height} = {width * height} pixels, more than "
                               f"any page has (a decompression bomb; the limit is {MAX_PAGE_PIXELS})")
        if max(width, height) > MAX_ASPECT_RATIO * min(width, height):
            raise RequestError(f"{name}: a {width}x{height} image cannot be read as a page (its aspect ratio "
                               f"{max(width, height) / min(width, height):.0f} is over {MAX_ASPECT_RATIO})")
        ip = self.image
        h, w = smart_resize(height, width, ip.patch_size * ip.merge_size, ip.min_pixels, self.max_pixels)
        return w, h

    def resize_of(self, image: bytes | str | Path | Image.Image) -> Resize:
        """The sizes ``prepare`` gives an image, before and after its resize, read from the header only."""
        img, name = (image, "image") if isinstance(image, Image.Image) else _open(image)
        return Resize(img.size, self.resized_size(img.width, img.height, name))

    def prepare(self, image: bytes | str | Path | Image.Image, prompt: str | None = None,
                as_bytes: bool = False) -> PreparedPrompt:
        """The chat-formatted prompt ids and the patches of one image.

        Args:
            image: encoded bytes, a path, or a decoded PIL image.
            prompt: the instruction; default ``DEFAULT_PROMPT``.
            as_bytes: the patches as the resized image's uint8 values, a quarter of the bytes to move (training
                batches); ``pixels_from_bytes`` with ``byte_table`` turns them into exactly the pixel values of
                ``as_bytes=False``.

        Returns:
            ``PreparedPrompt``: input_ids [L] long, pixel_values [P, C*Tp*p*p] float32 (uint8 with ``as_bytes``),
            image_grid_thw [1, 3] long, and the resize. RequestError for an unusable image.
        """
        img = self.load_image(image)
        pixel_values, grid = self.patch_bytes(img)
        if not as_bytes:
            pixel_values = pixels_from_bytes(pixel_values, self.byte_table)
        n_image_tokens = int(grid.prod()) // self.merge**2
        text = DEFAULT_PROMPT if prompt is None else prompt
        head = self.tokenizer.encode("<|im_start|>user\n", add_special_tokens=False)
        tail = self.tokenizer.encode(f"{text}<|im_end|>\n<|im_start|>assistant\n", add_special_tokens=False)
        ids = head + [self.vision_start_id] + [self.image_token_id] * n_image_tokens + [self.vision_end_id] + tail
        p = self.image.patch_size
        resize = Resize(img.size, (int(grid[0, 2]) * p, int(grid[0, 1]) * p))
        return PreparedPrompt(torch.tensor(ids, dtype=torch.long), pixel_values, grid, resize)

    def patch_bytes(self, img: Image.Image) -> tuple[torch.Tensor, torch.Tensor]:
        """The image processor's patches of an RGB image as the resized image's bytes, computed in uint8: the
        processor's resize (``smart_resize``, then PIL with its resample filter) and its patch layout, without
        its float32 round trip (a quarter of the memory traffic; tests check it equals the processor's own
        ``do_rescale=False, do_normalize=False`` output byte for byte). Returns (patches [P, C*Tp*p*p] uint8,
        grid [1, 3])."""
        ip = self.image
        p, m, tp = ip.patch_size, ip.merge_size, ip.temporal_patch_size
        w, h = self.resized_size(img.width, img.height)
        pixels = np.asarray(img.resize((w, h), resample=ip.resample))  # [H, W, C]
        gh, gw = h // p, w // p
        blocks = pixels.reshape(gh // m, m, p, gw // m, m, p, pixels.shape[-1]).transpose(0, 3, 1, 4, 6, 2, 5)
        frames = np.broadcast_to(blocks[:, :, :, :, :, None], (*blocks.shape[:5], tp, p, p))  # the image, Tp times
        patches = np.ascontiguousarray(frames).reshape(gh * gw, -1)
        return torch.from_numpy(patches), torch.tensor([[1, gh, gw]], dtype=torch.long)

    def on_device(self, prompt: PreparedPrompt, device: torch.device) -> PreparedPrompt:
        """The prompt's pixels as float values on ``device``: uint8 patch bytes (``prepare(as_bytes=True)``, a
        quarter of the bytes to move) become exactly the values of ``as_bytes=False`` through ``byte_table``, on the
        device (the table is copied there once per device).

        Returns:
            A ``PreparedPrompt`` whose uint8 pixel_values became [P, C*Tp*p*p] float32 on ``device`` (float pixels
            pass through unchanged, where they are); input_ids and the grid stay where they were.
        """
        pixels = prompt.pixel_values
        if pixels is not None and pixels.dtype == torch.uint8:
            table = self._device_tables.get(device)
            if table is None:
                table = self._device_tables[device] = self.byte_table.to(device)
            pixels = pixels_from_bytes(pixels.to(device, non_blocking=True), table)
        return PreparedPrompt(prompt.input_ids, pixels, prompt.image_grid_thw, prompt.resize)

    @cached_property
    def byte_table(self) -> torch.Tensor:
        """[channels, 256] float32: the pixel value ``prepare`` gives byte v of channel c, in the image processor's
        own arithmetic (rescale in float64 then cast to float32, normalize in float32)."""
        ip = self.image
        rescaled = (np.arange(256, dtype=np.float64) * ip.rescale_factor).astype(np.float32)
        mean = np.asarray(ip.image_mean, dtype=np.float32)[:, None]
        std = np.asarray(ip.image_std, dtype=np.float32)[:, None]
        return torch.from_numpy((rescaled[None, :] - mean) / std)


def pixels_from_bytes(patch_bytes: torch.Tensor, table: torch.Tensor) -> torch.Tensor:
    """Patch bytes to pixel values, by table lookup.

    Args:
        patch_bytes: [P, C*Tp*p*p] uint8 patches (channel-major rows, as the processor lays them out).
        table: [C, 256] float32, ``Processor.byte_table``.

    Returns:
        [P, C*Tp*p*p] float32 pixel values on the patches' device.
    """
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
        with warnings.catch_warnings():  # PIL warns from 89.5 MP; resized_size refuses from MAX_PAGE_PIXELS
            warnings.simplefilter("ignore", Image.DecompressionBombWarning)
            img = Image.open(io.BytesIO(data))
    except Image.DecompressionBombError:
        raise RequestError(f"{name}: the image declares more pixels than any page has (a decompression bomb)") from None
    except (UnidentifiedImageError, OSError, ValueError) as e:
        raise RequestError(f"{name}: not a readable image ({type(e).__name__})") from None
    return img, name
