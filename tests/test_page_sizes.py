"""Real page sizes: an image over the engine's pixel budget is resized as Qwen2-VL's processor does (byte for byte),
the resize is reported (``ocria run --json``), and only what cannot be a page is refused, in one line."""

import io
import json
import struct
import zlib
from pathlib import Path

import pytest
import torch
from PIL import Image, ImageDraw
from transformers import Qwen2VLImageProcessorPil

from ocria.cli import main
from ocria.errors import RequestError
from ocria.runtime.processor import MAX_PAGE_PIXELS, Processor, pixels_from_bytes

REPO = Path(__file__).resolve().parent.parent
ASSETS = REPO / "ocria" / "assets" / "ocria-mini"
BUDGET = 512 * 512  # ocria-mini's max_image_pixels


def _png(img: Image.Image) -> bytes:
    buf = io.BytesIO()
    img.save(buf, format="PNG")
    return buf.getvalue()


def _png_header(width: int, height: int) -> bytes:
    """A PNG that declares ``width`` x ``height`` pixels and holds none."""

    def chunk(kind: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))

    return b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", struct.pack(">IIBBBBB", width, height, 1, 0, 0, 0, 0)) + \
        chunk(b"IEND", b"")


def _report_2x() -> Image.Image:
    with Image.open(REPO / "examples" / "report.png") as img:
        return img.convert("RGB").resize((img.width * 2, img.height * 2), Image.Resampling.LANCZOS)


def _scan(width: int, height: int) -> Image.Image:
    """A page of text lines at scan resolution."""
    img = Image.new("RGB", (width, height), "white")
    draw = ImageDraw.Draw(img)
    for i, y in enumerate(range(height // 10, height * 9 // 10, height // 12)):
        draw.text((width // 10, y), f"Line {i}: invoice INV-{1000 + i} due 2025-03-{i + 1:02d}", fill="black",
                  font_size=height // 40)
    return img


@pytest.fixture(scope="module")
def proc() -> Processor:
    return Processor(ASSETS, BUDGET)


@pytest.fixture(scope="module")
def hf() -> Qwen2VLImageProcessorPil:
    return Qwen2VLImageProcessorPil.from_pretrained(str(ASSETS), local_files_only=True)


def test_pages_over_the_budget_are_resized_not_refused(proc):
    for img in (_report_2x(), _scan(1500, 2000)):
        prompt = proc.prepare(_png(img))
        (w, h), (rw, rh) = prompt.resize.original, prompt.resize.resized
        assert (w, h) == img.size and (w, h) != (rw, rh)
        assert rw * rh <= BUDGET and rw % 32 == 0 and rh % 32 == 0 and rw * rh > 0.8 * BUDGET
        assert abs(rw / rh - w / h) < 0.06  # aspect kept, up to the 32-pixel grid
        _, gh, gw = prompt.image_grid_thw[0].tolist()
        assert (gw * 16, gh * 16) == (rw, rh) and prompt.pixel_values.shape[0] == gh * gw
        assert proc.resize_of(_png(img)) == prompt.resize
    assert proc.prepare(REPO / "examples" / "report.png").resize.resized == (448, 288)  # on the grid: unchanged


@pytest.mark.parametrize("size", [(896, 576), (1500, 2000), (2481, 1753), (300, 4000)])
def test_patch_bytes_over_the_budget_are_the_image_processors_own(proc, hf, size):
    """Larger than the budget, the uint8 patches still equal transformers' processor byte for byte, and the
    float pixels its normalized values."""
    image = proc.load_image(Image.effect_noise(size, 60).convert("RGB"))
    fast, grid = proc.patch_bytes(image)
    ref = hf(images=[image], do_rescale=False, do_normalize=False, return_tensors="pt")
    assert int(grid[0].prod()) * 256 <= BUDGET
    assert torch.equal(fast, ref["pixel_values"].to(torch.uint8)) and torch.equal(grid, ref["image_grid_thw"].long())
    floats = hf(images=[image], return_tensors="pt")["pixel_values"].float()
    assert torch.equal(pixels_from_bytes(fast, proc.byte_table), floats)


def test_what_cannot_be_a_page_is_refused_in_one_line(proc):
    cases = {
        _png_header(100_000, 100_000): "a decompression bomb",  # PIL's own refusal, at open
        _png_header(9000, 9000): f"9000x9000 = 81000000 pixels, more than any page has (a decompression bomb; "
                                 f"the limit is {MAX_PAGE_PIXELS})",
        _png(Image.new("RGB", (1, 300), "white")): "a 1x300 image cannot be read as a page (its aspect ratio 300 "
                                                   "is over 200)",
        _png(Image.new("RGB", (4000, 19), "white")): "aspect ratio 211 is over 200",
    }
    for data, message in cases.items():
        for call in (proc.prepare, proc.resize_of):
            with pytest.raises(RequestError) as err:
                call(data)
            assert message in str(err.value) and "\n" not in str(err.value)
    assert proc.prepare(_png(Image.new("RGB", (2000, 10), "white"))).resize.resized == (928, 32)  # 200: a page


@pytest.fixture(scope="module")
def engine_dir(mini_engine):
    return mini_engine


def test_run_json_reports_the_resize(engine_dir, tmp_path, capsys):
    page = tmp_path / "report_2x.png"
    _report_2x().save(page)
    args = ["run", "--engine", str(engine_dir), "--image", str(page), "--max-tokens", "2", "--mode", "ar", "--json"]
    assert main(args) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["image"] == {"size": [896, 576], "resized": [608, 384]} and 1 <= len(out["token_ids"]) <= 2
    strip = tmp_path / "strip.png"
    Image.new("RGB", (1, 300), "white").save(strip)
    assert main(["run", "--engine", str(engine_dir), "--image", str(strip), "--json"]) == 2
    err = capsys.readouterr().err.strip()
    assert "aspect ratio 300 is over 200" in err and "\n" not in err and "Traceback" not in err
