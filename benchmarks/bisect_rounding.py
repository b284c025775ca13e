"""What float32 reordering alone does to a bisect record: the bound under which two records are the same.

    .venv/bin/python benchmarks/bisect_rounding.py [--out x.json]

A record's loss and gradient norm come from float32 sums whose order a release may change without changing
what is computed: the order of the micro-batches in the accumulation window, the attention kernel (sdpa or
eager, the same softmax), the threads a matmul splits over. This script takes ``first_step.py``'s tiny Llama,
tokenizer and texts on today's stack, collates lesson 02's window (batch 1 x 4 micro-batches) and computes the
window's loss (summed token losses over the window's label count) and gradient norm for every order of the four
micro-batches, under both kernels and one and two threads, on the same weights. It prints the largest relative
spread of each over all those runs: ``trl_clinic.bisect.search.LOSS_BOUND`` must sit above it (docs/bisect.md).
"""

from __future__ import annotations

import argparse
import itertools
import json
import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import torch  # noqa: E402
from transformers import DataCollatorForLanguageModeling  # noqa: E402

from trl_clinic.bisect import first_step  # noqa: E402
from trl_clinic.bisect.search import LOSS_BOUND  # noqa: E402

MICRO_BATCHES = 4


def window_numbers(model, batches) -> tuple[float, float]:
    """The window's token-mean loss and gradient norm, accumulated in the order ``batches`` come."""
    model.zero_grad(set_to_none=True)
    count = sum(int((b["labels"][:, 1:] != -100).sum()) for b in batches)
    total = torch.zeros(())
    for batch in batches:
        logits = model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"]).logits[:, :-1]
        loss = torch.nn.functional.cross_entropy(
            logits.reshape(-1, logits.shape[-1]), batch["labels"][:, 1:].reshape(-1), reduction="sum"
        )
        (loss / count).backward()
        total += loss.detach() / count
    norm = torch.linalg.vector_norm(torch.stack([p.grad.norm() for p in model.parameters() if p.grad is not None]))
    return float(total), float(norm)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", default=None)
    args = parser.parse_args()
    tokenizer = first_step.tokenizer()
    collate = DataCollatorForLanguageModeling(tokenizer, mlm=False)
    rows = [tokenizer(text)["input_ids"] for text in first_step.texts(0)[:MICRO_BATCHES]]
    batches = [collate([{"input_ids": row}]) for row in rows]
    results = []
    for kernel, threads in itertools.product(("sdpa", "eager"), (1, 2)):
        torch.set_num_threads(threads)
        model = first_step.tiny_llama(0, len(tokenizer), kernel)
        for order in itertools.permutations(range(MICRO_BATCHES)):
            loss, norm = window_numbers(model, [batches[i] for i in order])
            results.append({"kernel": kernel, "threads": threads, "order": order, "loss": loss, "grad_norm": norm})
    spread = {}
    for key in ("loss", "grad_norm"):
        values = [r[key] for r in results]
        spread[key] = (max(values) - min(values)) / max(abs(v) for v in values)
    summary = {"runs": len(results), "relative_spread": spread, "bound": LOSS_BOUND, "torch": torch.__version__}
    print(json.dumps(summary, indent=1))
    if args.out:
        with open(args.out, "w") as handle:
            json.dump({"summary": summary, "runs": results}, handle, indent=1)


if __name__ == "__main__":
    main()
