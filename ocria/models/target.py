"""The OCRia target: Qwen3.5 VLM (``Qwen3_5ForConditionalGeneration`` layout) and its text-only form.

Parameter names match HF checkpoints exactly: ``model.visual.*``, ``model.language_model.*`` and
``lm_head.weight`` (VLM); ``model.*`` and ``lm_head.weight`` (``Qwen3_5ForCausalLM``).
"""

from pathlib import Path

import torch
from torch import Tensor, nn

from ocria.errors import ConfigError, RequestError
from ocria.models.cache import TargetCache
from ocria.models.checkpoint import load_module
from ocria.models.config import OCRiaConfig, TextConfig, read_config_json
from ocria.models.text import TextModel
from ocria.models.vision import VisionModel
from ocria.plugins.decode_gemm import decode_gemm
from ocria.plugins.policy import AUTO, ExecutionPolicy

IGNORED_TENSORS = (r"^mtp\.", r"^model\.mtp\.")


def mrope_positions(input_ids: Tensor, image_grid_thw: Tensor | None, image_token_id: int,
                    spatial_merge: int) -> tuple[Tensor, int]:
    """Qwen3.5 multimodal RoPE ids for one sequence.

    Text tokens advance all three axes together; an image block gets (t, row, col) ids starting at
    the current position and advances it by ``max(rows, cols)``. After the prompt, token index i
    has position ``i + delta`` on all three axes.

    Args:
        input_ids: [L] long.
        image_grid_thw: [N, 3] long (t, h, w) in patches of the sequence's N images, in order; None without images.
        image_token_id: the image-pad token.
        spatial_merge: patches merged per image token along each side.

    Returns:
        (positions [3, L] long on input_ids' device, delta).
    """
    ids = input_ids.tolist()
    grids = iter(image_grid_thw.tolist() if image_grid_thw is not None else [])
    chunks, cur, i = [], 0, 0
    while i < len(ids):
        if ids[i] == image_token_id:
            t, h, w = next(grids)
            gh, gw = h // spatial_merge, w // spatial_merge
            tt = torch.arange(t).view(-1, 1, 1).expand(t, gh, gw).flatten()
            hh = torch.arange(gh).view(1, -1, 1).expand(t, gh, gw).flatten()
            ww = torch.arange(gw).view(1, 1, -1).expand(t, gh, gw).flatten()
            chunks.append(torch.stack([tt, hh, ww]) + cur)
            cur += max(gh, gw)
            i += t * gh * gw
        else:
            j = i
            while j < len(ids) and ids[j] != image_token_id:
                j += 1
            chunks.append(torch.arange(cur, cur + j - i).expand(3, -1))
            cur += j - i
            i = j
    pos = torch.cat(chunks, dim=1) if chunks else torch.zeros(3, 0, dtype=torch.long)
    delta = (int(pos.max()) + 1 - len(ids)) if len(ids) else 0
    return pos.to(input_ids.device), delta


class OCRiaModel(nn.Module):
    def __init__(self, cfg: OCRiaConfig):
        super().__init__()
        self.visual = VisionModel(cfg.vision)
        self.language_model = TextModel(cfg.text)


class _LMBase(nn.Module):
    """Shared LM-head and cached forward of both target forms."""

    text: TextModel
    lm_head: nn.Linear

    @property
    def text_config(self) -> TextConfig:
        return self.text.cfg

    def logits(self, hidden: Tensor, policy: ExecutionPolicy = AUTO) -> Tensor:
        """fp32 logits. On CUDA a bf16/fp16 head accumulates straight into fp32 (the decode GEMM with fp32
        output for up to 16 rows, else ``mm`` with ``out_dtype``): rounding logits to bf16 would create ties
        that flip greedy tokens. A quantized head (``fp32_logits``: an FP8 ``QuantLinear``) returns its fp32 sums
        the same way."""
        head = self.lm_head
        if hidden.is_cuda and hidden.dtype != torch.float32 and type(head) is nn.Linear:
            return decode_gemm(hidden, head.weight, policy=policy, out_fp32=True)
        if getattr(head, "fp32_logits", False):
            return head(hidden, policy, out_fp32=True)
        return head(hidden).float()

    def forward_cached(self, embeds: Tensor, positions: Tensor, cache: TargetCache, slots: Tensor, mode: str,
                       capture: tuple[int, ...] = (), attn_len: int | None = None, policy: ExecutionPolicy = AUTO):
        """Run T tokens per slot against the cache (``prefill`` or ``verify``); see ``TextModel``.

        Args:
            embeds: [B, T, H] input embeddings.
            positions: [3, B, T] long mRoPE ids.
            cache: the target cache.
            slots: [B] long, each row's cache slot.
            mode: ``prefill`` or ``verify``.
            capture: decoder layer indices whose outputs are returned too.
            attn_len: keys attention reads per row at most (None: the cache's length).
            policy: the execution policy of every plugin op (a decode or verify step's: ``policy.for_steps()``).

        Returns:
            (normed hidden [B, T, H], [captured [B, T, H] per ``capture`` index]).
        """
        return self.text(embeds, positions, mode, cache, slots, capture, attn_len, policy)

    def tie_weights(self) -> None:
        if self.text_config.tie_word_embeddings:
            self.lm_head.weight = self.text.embed_tokens.weight


class OCRiaForConditionalGeneration(_LMBase):
    def __init__(self, cfg: OCRiaConfig):
        super().__init__()
        self.config = cfg
        self.model = OCRiaModel(cfg)
        self.lm_head = nn.Linear(cfg.text.hidden_size, cfg.text.vocab_size, bias=False)
        self.tie_weights()

    @property
    def text(self) -> TextModel:
        return self.model.language_model

    def embed(self, input_ids: Tensor, pixel_values: Tensor | None = None,
              image_grid_thw: Tensor | None = None, check: bool = True) -> Tensor:
        """Token embeddings with the vision encoder's outputs placed at the image-pad positions. ``check=False``:
        the caller has matched image tokens and patches already (no host sync: the call can be graph-captured,
        with ``image_grid_thw`` on the CPU).

        Args:
            input_ids: [B, T] long.
            pixel_values: [P, C*Tp*p*p] float patches of every image, or None.
            image_grid_thw: [N, 3] long (t, h, w) per image, in patches.
            check: RequestError when image tokens and image embeddings do not match.

        Returns:
            [B, T, H] embeddings in the embedding dtype.
        """
        embeds = self.text.embed_tokens(input_ids)
        is_image = input_ids == self.config.image_token_id
        if pixel_values is None:
            if check and bool(is_image.any()):
                raise RequestError("prompt has image tokens but no pixel_values")
            return embeds
        feats = self.model.visual(pixel_values, image_grid_thw).to(embeds.dtype)
        if check and int(is_image.sum()) != feats.shape[0]:
            raise RequestError(
                f"prompt has {int(is_image.sum())} image tokens but the image gives {feats.shape[0]} embeddings")
        return embeds.masked_scatter(is_image[..., None], feats)

    def positions(self, input_ids: Tensor, image_grid_thw: Tensor | None) -> tuple[Tensor, Tensor]:
        """mRoPE ids for a batch of full prompts (host work: one ``mrope_positions`` per row).

        Args:
            input_ids: [B, T] long.
            image_grid_thw: [N, 3] long (t, h, w) of the batch's images in batch order, or None.

        Returns:
            (positions [3, B, T] long, deltas [B] long), on input_ids' device.
        """
        merge = self.config.vision.spatial_merge_size
        grids = list(image_grid_thw) if image_grid_thw is not None else []
        rows, deltas = [], []
        for ids in input_ids:
            count = int((ids == self.config.image_token_id).sum())
            per = []
            while count > 0:
                t, h, w = (int(x) for x in grids[0])
                per.append(grids.pop(0))
                count -= t * h * w // merge**2
            grid = torch.stack(per) if per else None
            pos, delta = mrope_positions(ids, grid, self.config.image_token_id, merge)
            rows.append(pos)
            deltas.append(delta)
        return torch.stack(rows, dim=1), torch.tensor(deltas, device=input_ids.device)

    def forward(self, input_ids: Tensor, pixel_values: Tensor | None = None,
                image_grid_thw: Tensor | None = None, policy: ExecutionPolicy = AUTO) -> Tensor:
        """No-cache parity forward.

        Args:
            input_ids: [B, T] long.
            pixel_values: [P, C*Tp*p*p] float patches, or None.
            image_grid_thw: [N, 3] long, or None.
            policy: the execution policy of every plugin op (training: ``REFERENCE``, which has a backward).

        Returns:
            Logits [B, T, V] float32.
        """
        embeds = self.embed(input_ids, pixel_values, image_grid_thw)
        positions, _ = self.positions(input_ids, image_grid_thw)
        hidden, _ = self.text(embeds, positions, policy=policy)
        return self.logits(hidden, policy)

    @classmethod
    def from_pretrained(cls, directory: str | Path, dtype: torch.dtype = torch.float32,
                        device: torch.device | str = "cpu") -> "OCRiaForConditionalGeneration":
        """Load an HF ``Qwen3_5ForConditionalGeneration`` directory (config.json + safetensors) in eval mode."""
        directory = Path(directory)
        cfg = OCRiaConfig.from_dict(read_config_json(directory / "config.json"))
        with torch.device("meta"):
            model = cls(cfg)
        tied = (r"^lm_head\.",) if cfg.text.tie_word_embeddings else ()
        load_module(model, directory, {"": ""}, dtype, device, ignore=IGNORED_TENSORS + tied, optional=tied)
        model.tie_weights()
        return model.eval()


class OCRiaForCausalLM(_LMBase):
    """Text-only Qwen3.5 (``Qwen3_5ForCausalLM``): ``model.*`` is the text decoder."""

    def __init__(self, cfg: TextConfig):
        super().__init__()
        self.config = cfg
        self.model = TextModel(cfg)
        self.lm_head = nn.Linear(cfg.hidden_size, cfg.vocab_size, bias=False)
        self.tie_weights()

    @property
    def text(self) -> TextModel:
        return self.model

    def forward(self, input_ids: Tensor, policy: ExecutionPolicy = AUTO) -> Tensor:
        """No-cache forward of text ids [B, T] long under ``policy``; returns logits [B, T, V] float32."""
        B, T = input_ids.shape
        positions = torch.arange(T, device=input_ids.device).expand(3, B, T)
        hidden, _ = self.model(self.model.embed_tokens(input_ids), positions, policy=policy)
        return self.logits(hidden, policy)

    @classmethod
    def from_pretrained(cls, directory: str | Path, dtype: torch.dtype = torch.float32,
                        device: torch.device | str = "cpu") -> "OCRiaForCausalLM":
        """Load an HF ``Qwen3_5ForCausalLM`` directory (``qwen3_5_text``, or the text part of ``qwen3_5``)."""
        directory = Path(directory)
        raw = read_config_json(directory / "config.json")
        if raw.get("model_type") not in ("qwen3_5_text", "qwen3_5"):
            raise ConfigError(f"model_type {raw.get('model_type')!r} is not supported: expected 'qwen3_5_text'")
        text_raw = raw.get("text_config", raw)
        cfg = TextConfig.from_dict(text_raw, tie_default=bool(raw.get("tie_word_embeddings", False)))
        with torch.device("meta"):
            model = cls(cfg)
        prefix = {"model.": "model.language_model."} if raw.get("model_type") == "qwen3_5" else {}
        tied = (r"^lm_head\.",) if cfg.tie_word_embeddings else ()
        load_module(model, directory, prefix, dtype, device, ignore=IGNORED_TENSORS + tied + (r"visual\.",),
                    optional=tied)
        model.tie_weights()
        return model.eval()
