"""Load a built engine directory and generate from it."""

from collections.abc import Iterator
from pathlib import Path

import torch

from ocria.device import resolve_device
from ocria.errors import OcriaError, RequestError
from ocria.manifest import EngineProfile, verify_engine
from ocria.models import DFlash2Drafter, DrafterCache, OCRiaForConditionalGeneration, TargetCache
from ocria.models.cache import cache_bytes
from ocria.models.quantized.formats import QUANT_CONFIG
from ocria.models.quantized.load import load_quantized_target
from ocria.plugins.policy import ExecutionPolicy
from ocria.runtime.processor import PreparedPrompt, Processor
from ocria.runtime.sampling import SamplingParams
from ocria.runtime.scheduler import Event, Scheduler


def check_fraction(fraction: float) -> None:
    """Raise OcriaError unless ``fraction`` (the share of device memory the engine may use) is in (0, 1]."""
    if not 0 < fraction <= 1:
        raise OcriaError(f"gpu_memory_fraction must be in (0, 1], got {fraction}")


def plan_batch_size(free_bytes: int, total_bytes: int, fraction: float, slot_bytes: int, requested: int) -> int:
    """Sequence slots that fit: the caches may use what is free now, minus the part of the device's
    memory kept out of reach (1 - fraction); never more than requested, and at least one or an error.

    Args:
        free_bytes: device memory free now (``torch.cuda.mem_get_info``).
        total_bytes: the device's memory.
        fraction: share of ``total_bytes`` the engine may use, in (0, 1].
        slot_bytes: device bytes one sequence slot needs (``Engine.slot_bytes``).
        requested: the profile's max batch size.

    Returns:
        The batch size, ``1 <= size <= requested``; one slot beyond it is kept spare for CUDA-graph padding.
    """
    check_fraction(fraction)
    budget = free_bytes - (1 - fraction) * total_bytes
    fit = int(budget // slot_bytes) - 1  # one spare slot pads CUDA-graph buckets
    if fit < 1:
        raise OcriaError(f"not enough GPU memory for one sequence: a slot needs {slot_bytes / 2**20:.0f} MiB, "
                         f"{max(budget, 0) / 2**20:.0f} MiB are available at gpu_memory_fraction={fraction}")
    return min(requested, fit)


def load_target(directory: Path, dtype: torch.dtype, device: str,
                recorded: dict[str, str] | None = None) -> OCRiaForConditionalGeneration:
    """The target checkpoint: plain HF weights, or a ModelOpt unified (quantized) checkpoint.

    Args:
        directory: an HF model directory (``config.json``, safetensors, optionally ``hf_quant_config.json``).
        dtype: the dtype of unquantized weights and activations.
        device: where the weights go.
        recorded: the build's per-layer formats from the engine manifest (``quantized_layers``), which the
            quantized loader follows and checks; None for a checkpoint without a manifest.

    Returns:
        The target model on ``device``.
    """
    if (directory / QUANT_CONFIG).is_file():
        return load_quantized_target(directory, dtype=dtype, device=device, recorded=recorded)
    return OCRiaForConditionalGeneration.from_pretrained(directory, dtype=dtype, device=device)


class Engine:
    """Target + drafter + processor of one engine directory, on one device.

    Args:
        root: the engine directory (``manifest.json``, ``target/``, optional ``drafter/``, ``tokenizer/``).
        device: ``"cpu"``, ``"cuda"`` or ``"cuda:N"``.
        dtype: model dtype; default bf16 on CUDA, fp32 on the CPU.
        policy: how the plugin ops run (``ocria.plugins.policy``); default ``ExecutionPolicy.from_env()``, the Triton
            kernels on CUDA and the PyTorch references elsewhere, with what the ``OCRIA_*`` variables change.
        verify: check the files against the manifest's hashes first.
        use_graphs: run decode steps and prefill as CUDA graphs; default on CUDA.
        gpu_memory_fraction: in (0, 1]; the caches may take what is free minus ``1 - gpu_memory_fraction`` of the
            device's memory.

    Attributes:
        max_batch_size: sequence slots, the profile's capped by the device's memory.
        block_size: tokens a ``spec`` step verifies (the drafter's block; 1 without a drafter).
        policy: the execution policy every forward of the engine runs under.
        plugins: ``"triton"`` or ``"reference"``, as the generation stats report it.
    """

    def __init__(self, root: str | Path, device: str = "cpu", dtype: torch.dtype | None = None,
                 policy: ExecutionPolicy | None = None, verify: bool = True, use_graphs: bool | None = None,
                 gpu_memory_fraction: float = 0.9):
        self.root = Path(root)
        self.policy = policy if policy is not None else ExecutionPolicy.from_env()  # a bad OCRIA_* value fails first
        check_fraction(gpu_memory_fraction)
        if not self.root.is_dir():
            raise OcriaError(f"{self.root}: engine directory not found")
        self.manifest = verify_engine(self.root) if verify else {}
        profile = EngineProfile.from_manifest(self.manifest)
        self.device = resolve_device(device)
        self.plugins = "triton" if self.policy.runs_kernels(self.device) else "reference"
        self.dtype = dtype or (torch.bfloat16 if self.device.type == "cuda" else torch.float32)
        self.use_graphs = self.device.type == "cuda" if use_graphs is None else use_graphs
        if self.use_graphs and self.device.type != "cuda":
            raise OcriaError("CUDA graphs need device 'cuda'")
        self.max_batch_size = profile.max_batch_size
        self.max_seq_len = profile.max_seq_len
        self.prefill_chunk = profile.prefill_chunk
        self.processor = Processor.from_engine_dir(self.root, profile.max_image_pixels)
        self.target = load_target(self.root / "target", self.dtype, str(self.device),
                                  self.manifest.get("quantized_layers"))
        self.target.text.fuse_projections()
        drafter_dir = self.root / "drafter"
        self.drafter = (DFlash2Drafter.from_pretrained(drafter_dir, self.target, self.dtype, str(self.device))
                        if drafter_dir.is_dir() else None)
        self.block_size = self.drafter.config.block_size if self.drafter else 1
        if self.device.type == "cuda":
            free, total = torch.cuda.mem_get_info(self.device)
            self.max_batch_size = plan_batch_size(free, total, gpu_memory_fraction, self.slot_bytes(),
                                                  self.max_batch_size)
        if self.drafter is not None:
            self.drafter.fuse_projections()

    def slot_bytes(self) -> int:
        """Device bytes one sequence slot needs: its caches at the engine's max length, plus the
        step's per-row logits (target fp32, drafter in the model dtype) and sampling scratch.

        Returns:
            Bytes, from caches allocated on the ``meta`` device (nothing is allocated).
        """
        length, block = self.max_seq_len + self.block_size, self.block_size
        total = cache_bytes(TargetCache.allocate(self.target.text_config, 1, length, block, self.dtype, "meta"))
        if self.drafter is not None:
            c = self.drafter.config
            total += cache_bytes(DrafterCache.allocate(c.num_hidden_layers, c.num_key_value_heads, c.head_dim, 1,
                                                       length, self.dtype, "meta"))
        return total + block * self.target.text_config.vocab_size * (4 + 2 + 8)

    def check(self, prompt: PreparedPrompt, params: SamplingParams) -> None:
        """Validate a request against this engine; RequestError with a one-line reason.

        Args:
            prompt: the prepared prompt (``input_ids`` [L] long).
            params: its sampling parameters.
        """
        length = prompt.input_ids.numel()
        if length >= self.max_seq_len:
            raise RequestError(f"the prompt is {length} tokens, the engine's max length is {self.max_seq_len}")
        params.check(self.max_seq_len - length)
        vocab = self.target.text_config.vocab_size
        if any(not 0 <= t < vocab for t in params.stop_token_ids):
            raise RequestError(f"end_id / stop token ids {list(params.stop_token_ids)} are outside the vocabulary "
                               f"[0, {vocab})")
        if params.mode == "spec" and self.drafter is None:
            raise RequestError("mode 'spec' needs a drafter, and this engine has none")

    def scheduler(self, max_batch_size: int | None = None) -> Scheduler:
        """A continuous-batching scheduler with its own caches, for at most ``max_batch_size`` sequences
        (default the engine's)."""
        return Scheduler(self, max_batch_size)

    def generate(self, image: bytes | str | Path, prompt: str | None = None,
                 params: SamplingParams | None = None) -> Iterator[Event]:
        """Single-request convenience: yields events until the final one.

        Args:
            image: encoded image bytes or a path.
            prompt: the instruction; default ``DEFAULT_PROMPT``.
            params: sampling parameters; default greedy ``spec``.

        Returns:
            An iterator of the request's events; the last has ``finished`` set and the stats.
        """
        sched = self.scheduler(max_batch_size=1)
        rid = sched.add(self.processor.prepare(image, prompt), params or SamplingParams())
        while True:
            for event in sched.step():
                if event.request_id == rid:
                    yield event
                    if event.finished:
                        return


def load_engine(root: str | Path, device: str = "cpu", **kwargs) -> Engine:
    """``Engine(root, device, **kwargs)``: see ``Engine`` for the arguments."""
    return Engine(root, device=device, **kwargs)
