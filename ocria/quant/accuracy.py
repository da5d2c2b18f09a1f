"""Accuracy of a quantized target against its BF16 teacher on held-out documents.

Per document the teacher decodes greedily (prefill + N decode passes); the quantized target then
(a) decodes the teacher's tokens (teacher forcing: same inputs, compare its greedy choice and its
logits at every step) and (b) decodes freely from the same prompt (compare token sequences). With
ground truth, both transcriptions get a character error rate: of the decoded prefix only (``decode_steps`` + 1
tokens a page), against the page's whole ground truth, which the report says next to the number.

A quantized LM head also gets a measure of its own (``head_report``): on the quantized target's teacher-forced
steps, the head's logits against the BF16 head's on the very same hidden states.
"""

from dataclasses import dataclass

import torch
from torch import Tensor

from ocria.data.metrics import cer
from ocria.models import OCRiaForConditionalGeneration
from ocria.quant.calibrate import Sample, run_document


@dataclass
class Reference:
    tokens: list[int]
    logits: torch.Tensor  # [N + 1, V] fp32


def teacher_pass(model: OCRiaForConditionalGeneration, samples: list[Sample], decode_steps: int) -> list[Reference]:
    return [Reference(*run_document(model, s.prompt, decode_steps)) for s in samples]


def _until_eos(tokens: list[int], eos: int | None) -> list[int]:
    return tokens[: tokens.index(eos)] if eos is not None and eos in tokens else tokens


def accuracy_report(student: OCRiaForConditionalGeneration, samples: list[Sample], teacher: list[Reference],
                    tokenizer, decode_steps: int) -> dict:
    """The ``accuracy.json`` content: agreement, logit error and CER (per document and overall)."""
    eos = tokenizer.eos_token_id
    docs, forced_hits, free_hits, prefix, total = [], 0, 0, 0.0, 0
    errors = []
    for sample, ref in zip(samples, teacher, strict=True):
        forced_tokens, forced_logits = run_document(student, sample.prompt, decode_steps, forced=ref.tokens)
        free_tokens, _ = run_document(student, sample.prompt, decode_steps)
        n = len(ref.tokens)
        f_hits = sum(a == b for a, b in zip(forced_tokens, ref.tokens, strict=True))
        r_hits = sum(a == b for a, b in zip(free_tokens, ref.tokens, strict=True))
        common = next((i for i, (a, b) in enumerate(zip(free_tokens, ref.tokens, strict=True)) if a != b), n)
        err = (forced_logits - ref.logits).abs()
        errors.append(err)
        forced_hits, free_hits, prefix, total = forced_hits + f_hits, free_hits + r_hits, prefix + common / n, total + n
        doc = {"name": sample.name, "tokens": n, "teacher_forced_agreement": f_hits / n,
               "free_running_agreement": r_hits / n, "free_running_common_prefix": common,
               "mean_abs_logit_error": float(err.mean()), "max_abs_logit_error": float(err.max())}
        if sample.truth is not None:
            doc["cer_bf16"] = cer(tokenizer.decode(_until_eos(ref.tokens, eos), skip_special_tokens=True), sample.truth)
            doc["cer_quantized"] = cer(tokenizer.decode(_until_eos(free_tokens, eos), skip_special_tokens=True),
                                       sample.truth)
        docs.append(doc)
    all_err = torch.cat([e.flatten() for e in errors])
    with_truth = [d for d in docs if "cer_bf16" in d]
    summary = {
        "documents": len(docs),
        "tokens": total,
        "teacher_forced_agreement": forced_hits / total,
        "free_running_agreement": free_hits / total,
        "free_running_common_prefix_fraction": prefix / len(docs),
        "mean_abs_logit_error": float(all_err.mean()),
        "max_abs_logit_error": float(all_err.max()),
    }
    if with_truth:
        summary["cer_bf16"] = sum(d["cer_bf16"] for d in with_truth) / len(with_truth)
        summary["cer_quantized"] = sum(d["cer_quantized"] for d in with_truth) / len(with_truth)
        summary["cer_scope"] = cer_scope(decode_steps)
    return {"summary": summary, "documents": docs}


def cer_scope(decode_steps: int) -> str:
    """What the report's CER measures: each page's first decoded tokens against its whole ground truth."""
    return (f"pages cut after {decode_steps + 1} decoded tokens (prefill + {decode_steps} decode steps), scored "
            "against the whole page's ground truth: a CER of a prefix, comparable between bf16 and quantized only")


@torch.no_grad()
def head_report(student: OCRiaForConditionalGeneration, samples: list[Sample], teacher: list[Reference],
                reference_weight: Tensor, decode_steps: int) -> dict:
    """The quantized LM head alone: on every teacher-forced step of ``student``, its logits against the fp32
    product of the same hidden state with the BF16 head ``reference_weight`` [V, H].

    Returns:
        ``{"steps", "top1_agreement", "mean_abs_logit_error", "max_abs_logit_error"}`` over all documents.
    """
    calls: list[tuple[Tensor, Tensor]] = []
    handle = student.lm_head.register_forward_hook(lambda m, args, out: calls.append((args[0], out)))
    try:
        for sample, ref in zip(samples, teacher, strict=True):
            run_document(student, sample.prompt, decode_steps, forced=ref.tokens)
    finally:
        handle.remove()
    weight = reference_weight.float()
    hits, steps, errors = 0, 0, []
    for hidden, logits in calls:
        want = hidden.float().reshape(-1, weight.shape[1]) @ weight.T
        got = logits.float().reshape(want.shape)
        hits += int((got.argmax(-1) == want.argmax(-1)).sum())
        steps += want.shape[0]
        errors.append((got - want).abs().flatten())
    err = torch.cat(errors)
    return {"steps": steps, "top1_agreement": hits / steps, "mean_abs_logit_error": float(err.mean()),
            "max_abs_logit_error": float(err.max())}


def format_report(report: dict) -> str:
    """A few lines for the terminal."""
    s = report["summary"]
    lines = [f"accuracy vs BF16 on {s['documents']} held-out documents ({s['tokens']} tokens):",
             f"  greedy agreement: teacher-forced {s['teacher_forced_agreement']:.3f}, "
             f"free-running {s['free_running_agreement']:.3f} "
             f"(common prefix {s['free_running_common_prefix_fraction']:.3f})",
             f"  logit error: mean {s['mean_abs_logit_error']:.4g}, max {s['max_abs_logit_error']:.4g}"]
    if "cer_bf16" in s:
        lines.append(f"  CER vs ground truth of the first {report['heldout']['decode_steps'] + 1} decoded tokens "
                     f"of each page: bf16 {s['cer_bf16']:.3f}, quantized {s['cer_quantized']:.3f}")
    head = report.get("lm_head", {}).get("alone")
    if head is not None:
        lines.append(f"  LM head alone ({report['lm_head']['format']} {report['lm_head']['scale']}): top-1 agreement "
                     f"{head['top1_agreement']:.3f}, logit error mean {head['mean_abs_logit_error']:.4g}, "
                     f"max {head['max_abs_logit_error']:.4g}")
    return "\n".join(lines)
