import pytest
import torch

from trl_clinic.course import data
from trl_clinic.course.models import make_causal_lm
from trl_clinic.probes.padding import (
    AUDIT_COLUMNS,
    ForwardAudit,
    generation_check,
    right_padded,
    scoring_check,
    sequence_logprobs,
)


@pytest.fixture(scope="module")
def qwen(tokenizer):
    return make_causal_lm(tokenizer, "qwen2", seed=1).eval()


def rows(n=4):
    pairs = data.instruction_pairs(n, seed=3, max_people=1)
    return list(pairs["prompt"]), list(pairs["completion"])


def test_right_padded():
    assert right_padded(torch.tensor([[1, 1, 0], [1, 1, 1]]))
    assert not right_padded(torch.tensor([[0, 1, 1], [1, 1, 1]]))


def test_scoring_agrees_across_padding_modes_in_fp32(qwen, tokenizer):
    prompts, completions = rows()
    assert max(scoring_check(qwen, tokenizer, prompts, completions).values()) < 1e-4


def test_unknown_scoring_mode(qwen, tokenizer):
    with pytest.raises(ValueError, match="unknown mode 'middle'"):
        sequence_logprobs(qwen, tokenizer, ["a"], ["b"], "middle")


def test_generation_left_matches_and_restores_padding_side(qwen, tokenizer):
    prompts = ["where does alice live? answer:", "tell me about bruno and chloe and dmitri. answer:"]
    report = generation_check(qwen, tokenizer, prompts, max_new_tokens=4)
    assert report["left"]["changed"] == [False, False]
    assert max(report["left"]["first_token_logit_shift"]) < 1e-4
    assert report["right"]["first_token_logit_shift"][0] > 1e-3  # the short prompt ends in pads
    assert tokenizer.padding_side == "right"


def test_audit_reads_the_cache_from_the_backbone_s_output_not_from_the_kwargs(qwen, tokenizer):
    batch = tokenizer(["alice lives in paris.", "bruno"], return_tensors="pt", padding=True)
    audit = ForwardAudit(policy=qwen)
    qwen(**batch, use_cache=False)
    qwen(**batch, use_cache=True)
    qwen(**batch)  # no argument: the config's use_cache (True) builds one
    audit.remove()
    row = audit.summary()["policy"]["eval"]
    assert {key: row[key] for key in AUDIT_COLUMNS} == {
        "forwards": 3,
        "right_padded": 3,
        "cache_built": 2,
        "right_padded_with_cache": 2,
        "mask_to_attention": 3,
    }
    assert row["asked"]["use_cache=None from None"] == 1  # not called from trl: no TRL function asked
    qwen(**batch)
    assert audit.summary()["policy"]["eval"]["forwards"] == 3  # removed hooks count nothing


def test_audit_names_the_trl_function_that_passed_use_cache(qwen, tokenizer):
    from trl.trainer import utils as trl_utils  # any frame in a file under trl/ is a TRL caller

    batch = tokenizer(["alice lives in paris.", "bruno"], return_tensors="pt", padding=True)
    audit = ForwardAudit(one=qwen, two=make_causal_lm(tokenizer, "qwen2", seed=2).eval())
    caller = compile("model(**batch, use_cache=False)", trl_utils.__file__, "exec")
    exec(caller, {"model": qwen, "batch": batch})
    audit.remove()
    assert audit.summary() == {
        "one": {
            "eval": {
                "forwards": 1,
                "right_padded": 1,
                "cache_built": 0,
                "right_padded_with_cache": 0,
                "mask_to_attention": 1,
                "asked": {
                    "use_cache=False from utils.py:<module>": 1,
                    "backbone_use_cache=False from utils.py:<module>": 1,
                },
            }
        }
    }
    with pytest.raises(ValueError, match="name the models"):
        ForwardAudit()
