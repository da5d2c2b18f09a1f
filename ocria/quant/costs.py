"""Format cost tables: what one decode GEMM of each of an engine's weight shapes costs in each format on a GPU.

A table is measured on the device (``ocria bench formats``: each format's GEMM kernel, CUDA-event timed after
warm-up, at M = 1..64 rows) or, without a measurement, made from the documented default model of the GPU's
architecture (``DEFAULT_MODELS``), and says which (``source``). ``ocria-build engine`` records the table it used in
the engine's manifest, and the ``auto`` recipe's search takes a layer's candidate formats from it
(``CostTable.candidates``): a format is a candidate only if its GEMM is not slower than in every format with more
bits. On Hopper that keeps NVFP4, which runs weight-only there (a dequantizing GEMM), off every GEMM where FP8
measures faster; on Blackwell, whose tensor cores take NVFP4 natively, the default model lets it through.

Table JSON (``CostTable.to_json``)::

    {"format": "ocria-format-costs/1", "arch": "sm_90", "source": "measured", "device": "NVIDIA H200",
     "rows": [1, 2, 4, 8, 16, 32, 64],
     "gemms": {"mlp.gate_up": {"k": 2048, "n": 12288, "us": {"bf16": [...], "fp8": [...], "nvfp4": [...]}}, ...},
     "note": "..."}
"""

import json
from dataclasses import dataclass, field
from enum import Enum
from pathlib import Path

from ocria.errors import OcriaError
from ocria.models.config import LINEAR, TextConfig
from ocria.models.quantized.formats import FORMAT_BITS, FORMATS

TABLE_FORMAT = "ocria-format-costs/1"
DEFAULT_ROWS = (1, 2, 4, 8, 16, 32, 64)
DEFAULT_ARCH = "sm_90"  # a build on a machine without a GPU plans for the H200 this project runs on


class CostSource(str, Enum):
    MEASURED = "measured"  # timed on the device by ``ocria bench formats``
    DEFAULT = "default"  # the architecture's default model (``DEFAULT_MODELS``), not a measurement


@dataclass(frozen=True)
class Gemm:
    """One GEMM of a decode step: its weight [n, k] and the linear layers it runs (projections that share an input
    run as one GEMM: ``layers`` are module-name suffixes inside a decoder layer, or ``lm_head``)."""

    name: str
    k: int
    n: int
    layers: tuple[str, ...]


def decode_gemms(cfg: TextConfig) -> list[Gemm]:
    """The distinct GEMMs of a decode step of a Qwen3.5 text decoder (every decoder layer of a type has the same
    shapes), the LM head last."""
    h = cfg.hidden_size
    out = []
    if LINEAR in cfg.layer_types:
        key = cfg.linear_num_key_heads * cfg.linear_key_head_dim
        value = cfg.linear_num_value_heads * cfg.linear_value_head_dim
        out += [Gemm("linear_attn.in_proj_qkvz", h, 2 * key + 2 * value,
                     ("linear_attn.in_proj_qkv", "linear_attn.in_proj_z")),
                Gemm("linear_attn.out_proj", value, h, ("linear_attn.out_proj",))]
    if any(t != LINEAR for t in cfg.layer_types):
        q, kv = cfg.num_attention_heads * cfg.head_dim, cfg.num_key_value_heads * cfg.head_dim
        out += [Gemm("self_attn.qkv", h, 2 * q + 2 * kv, ("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj")),
                Gemm("self_attn.o_proj", q, h, ("self_attn.o_proj",))]
    out += [Gemm("mlp.gate_up", h, 2 * cfg.intermediate_size, ("mlp.gate_proj", "mlp.up_proj")),
            Gemm("mlp.down", cfg.intermediate_size, h, ("mlp.down_proj",)),
            Gemm("lm_head", h, cfg.vocab_size, ("lm_head",))]
    return out


def gemm_of(layer: str, gemms: list[Gemm]) -> Gemm | None:
    """The GEMM that runs the linear layer named ``layer`` (a full module name), if any."""
    return next((g for g in gemms for suffix in g.layers if layer == suffix or layer.endswith("." + suffix)), None)


@dataclass(frozen=True)
class CostModel:
    """A default table: ``us = fixed_us + weight bytes / bandwidth`` per format, the same at every row count up to 64
    (decode GEMMs read their weights once whatever the rows)."""

    arch: str
    gpu: str
    fixed_us: dict[str, float]
    tbps: dict[str, float]  # effective bandwidth of the format's weight bytes, TB/s (= MB/us)
    basis: str

    def us(self, fmt: str, k: int, n: int) -> float:
        return self.fixed_us[fmt] + n * k * FORMAT_BITS[fmt] / 8 / 1e6 / self.tbps[fmt]


# sm_90: fitted to H200 timings of the decode GEMMs (the MLP, GDN and attention GEMMs of ocria-1-sim at M = 16, the
# LM head at M = 1), the kernels of a batch-invariant decode step, with one latency floor of
# 3 µs for every format: bf16 and the FP8 decode GEMM reach 3.7 and 4.2 TB/s of their weight bytes (gate/up 16.0 and
# 9.2 µs, the LM head 280 and 119 µs), NVFP4 weight-only in 16-row tiles is dequantization-bound at ~0.8 TB/s of its
# packed bytes (gate/up 21.3 µs). sm_100: a bytes model on paper, not measured here: B200-class HBM (8 TB/s, 80%
# reached) and native FP8 and NVFP4 tensor cores, every format bandwidth-bound.
DEFAULT_MODELS = {
    "sm_90": CostModel("sm_90", "H100/H200 (Hopper: FP8 tensor cores, NVFP4 weight-only)",
                       {"bf16": 3.0, "fp8": 3.0, "nvfp4": 3.0}, {"bf16": 3.7, "fp8": 4.2, "nvfp4": 0.8},
                       "fitted to H200 timings of the decode GEMMs"),
    "sm_100": CostModel("sm_100", "B200 (Blackwell: native FP8 and NVFP4 tensor cores)",
                        {"bf16": 3.0, "fp8": 3.0, "nvfp4": 3.0}, {"bf16": 6.4, "fp8": 6.4, "nvfp4": 6.4},
                        "on paper: bytes at 80% of 8 TB/s, not measured here"),
}


@dataclass
class CostTable:
    """µs of each GEMM in each format at each row count (``rows``), with where the numbers come from."""

    arch: str
    source: CostSource
    device: str
    rows: tuple[int, ...]
    shapes: dict[str, tuple[int, int]]  # GEMM name -> (k, n)
    us: dict[str, dict[str, list[float]]]  # GEMM name -> format -> µs per row count
    note: str = ""
    extra: dict = field(default_factory=dict)  # what a measurement adds (its command, bandwidth, ...)

    @classmethod
    def default(cls, arch: str, gemms: list[Gemm], rows: tuple[int, ...] = DEFAULT_ROWS) -> "CostTable":
        """The default model of ``arch`` over ``gemms``."""
        model = DEFAULT_MODELS.get(arch)
        if model is None:
            raise OcriaError(f"no default format cost model for GPU architecture {arch!r} (known: "
                             f"{', '.join(DEFAULT_MODELS)}); measure one with ocria bench formats")
        us = {g.name: {f: [round(model.us(f, g.k, g.n), 3)] * len(rows) for f in FORMATS} for g in gemms}
        return cls(arch, CostSource.DEFAULT, model.gpu, tuple(rows), {g.name: (g.k, g.n) for g in gemms}, us,
                   f"default model for {arch}, {model.basis}; no measurement on the device")

    def cost(self, gemm: str, fmt: str) -> float:
        """µs summed over the table's row counts (each decode batch size weighs the same)."""
        return sum(self.us[gemm][fmt])

    def candidates(self, gemm: str, formats: tuple[str, ...]) -> tuple[str, ...]:
        """The quantized ``formats`` worth searching for ``gemm``: those not slower than bf16 nor than any other
        measured format with more bits. A GEMM the table lacks keeps every format."""
        if gemm not in self.us:
            return formats
        timed = self.us[gemm]
        return tuple(f for f in formats if f in timed and all(
            self.cost(gemm, f) <= self.cost(gemm, g) for g in timed if FORMAT_BITS[g] > FORMAT_BITS[f]))

    def check_covers(self, gemms: list[Gemm]) -> None:
        """Refuse a table measured for other shapes than the engine's (one line)."""
        for g in gemms:
            if g.name in self.shapes and tuple(self.shapes[g.name]) != (g.k, g.n):
                raise OcriaError(f"format cost table {g.name} is [{self.shapes[g.name][1]}, {self.shapes[g.name][0]}], "
                                 f"the engine's is [{g.n}, {g.k}]: measure it for this model")

    def to_json(self) -> dict:
        return {"format": TABLE_FORMAT, "arch": self.arch, "source": self.source.value, "device": self.device,
                "rows": list(self.rows), "note": self.note, **self.extra,
                "gemms": {name: {"k": k, "n": n, "us": self.us[name]} for name, (k, n) in self.shapes.items()}}

    @classmethod
    def from_json(cls, raw: object, where: str = "format cost table") -> "CostTable":
        """A table from ``to_json``'s dict; a one-line OcriaError for anything else."""
        if not isinstance(raw, dict) or raw.get("format") != TABLE_FORMAT:
            raise OcriaError(f"{where}: not a format cost table (expected \"format\": \"{TABLE_FORMAT}\")")
        try:
            rows = tuple(int(r) for r in raw["rows"])
            shapes = {name: (int(g["k"]), int(g["n"])) for name, g in raw["gemms"].items()}
            us = {name: {str(f): [float(v) for v in t] for f, t in g["us"].items()} for name, g in raw["gemms"].items()}
            source = CostSource(raw["source"])
            arch = str(raw["arch"])
        except (KeyError, TypeError, ValueError, AttributeError) as e:
            raise OcriaError(f"{where}: malformed ({type(e).__name__}: {e})") from None
        bad = [f"{name}/{f}" for name, t in us.items() for f, v in t.items() if f not in FORMATS or len(v) != len(rows)]
        if bad:
            raise OcriaError(f"{where}: {bad[0]}: formats are {', '.join(FORMATS)}, one µs per row count")
        known = {"format", "arch", "source", "device", "rows", "note", "gemms"}
        return cls(arch, source, str(raw.get("device", "")), rows, shapes, us, str(raw.get("note", "")),
                   {k: v for k, v in raw.items() if k not in known})

    @classmethod
    def load(cls, path: str | Path) -> "CostTable":
        path = Path(path)
        if not path.is_file():
            raise OcriaError(f"format cost table {path}: no such file")
        try:
            raw = json.loads(path.read_text())
        except (json.JSONDecodeError, UnicodeDecodeError) as e:
            raise OcriaError(f"format cost table {path}: not JSON ({e})") from None
        return cls.from_json(raw, str(path))
