"""ocria runtime: load an engine and generate with lossless DFlash2 speculative decoding."""

from ocria.runtime.detok import IncrementalDetokenizer
from ocria.runtime.engine import Engine, load_engine
from ocria.runtime.model_runner import ModelRunner
from ocria.runtime.processor import DEFAULT_PROMPT, PreparedPrompt, Processor
from ocria.runtime.sampling import SamplingParams
from ocria.runtime.scheduler import Event, GenerationStats, Scheduler

__all__ = [
    "DEFAULT_PROMPT",
    "Engine",
    "Event",
    "GenerationStats",
    "IncrementalDetokenizer",
    "ModelRunner",
    "PreparedPrompt",
    "Processor",
    "SamplingParams",
    "Scheduler",
    "load_engine",
]
