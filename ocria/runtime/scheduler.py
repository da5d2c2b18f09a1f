"""Continuous batching: requests join (prefill) and leave (stop, cancel) between decode steps.

Host-side bookkeeping only: each running request owns a cache slot; every ``step()`` admits waiting
requests into free slots, has the ``ModelRunner`` (caches, graphs, forward passes) prefill them and run one batched
decode step per mode, applies stops token by token and returns the events (new text, finished flags, final
stats). Not thread-safe: drive it from one thread (the Triton engine model runs it in a background loop).
"""

import time
from collections import deque
from dataclasses import dataclass, field

import torch
from torch import Tensor

from ocria.runtime.detok import IncrementalDetokenizer
from ocria.runtime.model_runner import ModelRunner
from ocria.runtime.processor import PreparedPrompt
from ocria.runtime.sampling import SamplingParams


@dataclass
class GenerationStats:
    """One request's counters, final in its last event."""

    num_prompt_tokens: int = 0
    num_generated_tokens: int = 0  # tokens returned (stop tokens and what follows a stop excluded)
    num_steps: int = 0  # decode steps the request took part in (the first token, from prefill, is not one)
    num_draft_tokens: int = 0  # drafts offered for verification
    num_accepted_draft_tokens: int = 0
    acceptance_length: float = 0.0  # tokens kept per decode step (accepted drafts + the target's own token)
    first_token_time_ns: int = 0  # time.time_ns() at the first token
    last_token_time_ns: int = 0
    tokens_per_s: float = 0.0  # generated tokens over the time from submission to the last token
    batch_size_max: int = 0  # the largest batch the request's tokens came from
    mode: str = "spec"  # ``SamplingParams.mode``
    plugins: str = "reference"  # ``Engine.plugins``: "triton" or "reference"
    batch_invariant: bool = True  # decode steps with batch-invariant rows (``ExecutionPolicy.batch_invariant``)


@dataclass
class Event:
    """What one ``Scheduler.step`` produced for one request."""

    request_id: int
    token_ids: list[int]  # the tokens kept this step (possibly none)
    text: str  # new final text; the events' texts concatenate to the request's output
    finished: bool = False
    finish_reason: str | None = None  # "stop", "length" or "cancelled" once finished
    stats: GenerationStats | None = None  # set on the finishing event


@dataclass
class _Request:
    """A request's host state while it waits or runs."""

    rid: int
    prompt: PreparedPrompt
    params: SamplingParams
    detok: IncrementalDetokenizer
    submitted_ns: int
    slot: int = -1  # its cache slot while running
    last_token: int = -1  # the newest kept token, not yet seen by the target: the next step's input
    length: int = 0  # tokens committed in the target cache
    generated: list[int] = field(default_factory=list)
    emitted_chars: int = 0  # characters of the output text already sent in events
    stats: GenerationStats = field(default_factory=GenerationStats)
    decode_tokens: int = 0  # tokens kept from decode steps (the acceptance length's numerator)


class Scheduler:
    """Continuous batching over one engine's models.

    Args:
        engine: the ``Engine`` whose target, drafter, processor and profile it uses.
        max_batch_size: sequences running at once; default ``engine.max_batch_size``.

    Attributes:
        runner: the ``ModelRunner`` that owns the caches and graphs and runs prefill and decode steps.
        stage_seconds: wall seconds spent in ``step()``'s "prefill" and "decode" stages, results back on the host.
    """

    def __init__(self, engine, max_batch_size: int | None = None):
        self.engine = engine
        self.max_batch_size = max_batch_size or engine.max_batch_size
        self.runner = ModelRunner(engine, self.max_batch_size)
        self.free = list(range(self.max_batch_size))
        self.waiting: deque[_Request] = deque()
        self.running: dict[int, _Request] = {}
        self.cancelled: set[int] = set()
        self.next_id = 0
        # wall seconds spent in each stage of step(), results back on the host: where a server's time goes
        self.stage_seconds = {"prefill": 0.0, "decode": 0.0}

    @property
    def num_running(self) -> int:
        """Requests holding a cache slot."""
        return len(self.running)

    def has_work(self) -> bool:
        """Whether ``step()`` has anything to do: waiting, running or cancelled requests."""
        return bool(self.waiting or self.running or self.cancelled)

    def add(self, prompt: PreparedPrompt, params: SamplingParams) -> int:
        """Queue a request; it is prefilled at the first ``step()`` with a free slot.

        Args:
            prompt: the prepared prompt (``input_ids`` [L] long, pixel values, image grid).
            params: its sampling parameters, checked against the engine (RequestError if out of range).

        Returns:
            The request id its events carry.
        """
        self.engine.check(prompt, params)
        rid = self.next_id
        self.next_id += 1
        req = _Request(rid, prompt, params, IncrementalDetokenizer(self.engine.processor.tokenizer), time.time_ns())
        req.stats.num_prompt_tokens = prompt.input_ids.numel()
        req.stats.mode = params.mode
        req.stats.plugins = self.engine.plugins
        req.stats.batch_invariant = self.engine.policy.batch_invariant
        self.waiting.append(req)
        return rid

    def cancel(self, rid: int) -> None:
        """The request ends at the next step with finish_reason 'cancelled' and frees its slot."""
        if any(r.rid == rid for r in self.waiting) or rid in self.running:
            self.cancelled.add(rid)

    def step(self) -> list[Event]:
        """Drop cancelled requests, prefill waiting ones into free slots, then run one batched decode step per
        mode (``spec`` rows, then ``ar`` rows).

        Returns:
            The events of this step, at most one per request admitted or decoded, plus one per cancellation.
        """
        events = self._drop_cancelled()
        start = time.perf_counter()
        admitted = []
        while self.waiting and self.free:
            admitted.append(self._admit(self.waiting.popleft()))
        if admitted:  # one host sync for every first token: a prefill's host work overlaps earlier prefills
            firsts = torch.cat([token for _, token in admitted]).tolist()
            events += [self._emit(req, [token], len(self.running)) for (req, _), token in zip(admitted, firsts)]
            now = time.perf_counter()
            self.stage_seconds["prefill"] += now - start
            start = now
        decoded = False
        for mode in ("spec", "ar"):
            rows = [r for r in self.running.values() if r.params.mode == mode]
            if rows:
                events += self._decode(rows, spec=mode == "spec")
                decoded = True
        if decoded:
            self.stage_seconds["decode"] += time.perf_counter() - start
        return events

    def _drop_cancelled(self) -> list[Event]:
        events = []
        for rid in sorted(self.cancelled):
            req = self.running.get(rid) or next((r for r in self.waiting if r.rid == rid), None)
            if req is None:
                continue
            if rid in self.running:
                self._release(req)
            else:
                self.waiting.remove(req)
            events.append(Event(rid, [], "", True, "cancelled", self._final_stats(req)))
        self.cancelled.clear()
        return events

    def _release(self, req: _Request) -> None:
        del self.running[req.rid]
        self.free.append(req.slot)

    def _admit(self, req: _Request) -> tuple[_Request, Tensor]:
        """Prefill a waiting request into a free slot; returns it with its first token [1] long, still on the
        device."""
        req.slot = self.free.pop()
        self.running[req.rid] = req
        first = self.runner.prefill(req.slot, req.prompt, req.params)
        req.length = req.prompt.input_ids.numel()
        return req, first

    def _decode(self, rows: list[_Request], spec: bool) -> list[Event]:
        """One decode step (``spec`` or ``ar``) for ``rows``; an event per row."""
        tokens, accepted, proposed = self.runner.decode(
            [r.slot for r in rows], [r.last_token for r in rows], [r.params for r in rows], spec,
            max(r.length for r in rows), tuple(r.rid for r in rows))
        events = []
        for i, req in enumerate(rows):
            kept = tokens[i][: accepted[i] + 1]
            req.length += accepted[i] + 1
            req.stats.num_steps += 1
            req.stats.num_draft_tokens += proposed[i]
            req.stats.num_accepted_draft_tokens += accepted[i]
            events.append(self._emit(req, kept, len(rows), decode=True))
        return events

    def _emit(self, req: _Request, new_tokens: list[int], batch_size: int, decode: bool = False) -> Event:
        """Append tokens one by one, applying EOS / stop tokens / max_tokens / stop strings in order;
        ``decode``: they come from a decode step (counted, with the final step's, in the acceptance length)."""
        params, now = req.params, time.time_ns()
        stats = req.stats
        stats.batch_size_max = max(stats.batch_size_max, batch_size)
        stats.first_token_time_ns = stats.first_token_time_ns or now
        stats.last_token_time_ns = now
        reason, taken = None, []
        eos = () if params.ignore_eos else (self.engine.processor.eos_token_id,)
        for tok in new_tokens:
            if tok in eos or tok in params.stop_token_ids:
                reason = "stop"
                break
            taken.append(tok)
            if params.stop:  # a stop string ends the output at the token that completes it
                req.detok.push([tok])
                if any(s in req.detok.text for s in params.stop):
                    reason = "stop"
                    break
            if len(req.generated) + len(taken) >= params.max_tokens:
                reason = "length"
                break
        req.generated += taken
        if not params.stop:
            req.detok.push(taken)
        if decode:
            req.decode_tokens += len(taken)
        if reason is None:
            req.last_token = new_tokens[-1]
        text = req.detok.text + (req.detok.flush() if reason else "")
        if params.stop:
            cut = min((text.find(s) for s in params.stop if s in text), default=-1)
            if cut >= 0:
                text = text[:cut]
            elif reason is None:  # hold back what could be the start of a stop string
                text = text[: max(req.emitted_chars, len(text) - max(len(s) for s in params.stop) + 1)]
        delta = text[req.emitted_chars:]
        req.emitted_chars = len(text)
        if reason is None:
            return Event(req.rid, taken, delta)
        self._release(req)
        return Event(req.rid, taken, delta, True, reason, self._final_stats(req))

    @staticmethod
    def _final_stats(req: _Request) -> GenerationStats:
        """Complete the request's stats (totals, acceptance length, throughput) and return them."""
        s = req.stats
        s.num_generated_tokens = len(req.generated)
        s.acceptance_length = req.decode_tokens / s.num_steps if s.num_steps else 0.0
        elapsed = (s.last_token_time_ns - req.submitted_ns) / 1e9
        s.tokens_per_s = s.num_generated_tokens / elapsed if elapsed > 0 else 0.0
        return s
