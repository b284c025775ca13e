from trl_clinic.course import data
from trl_clinic.course.lessons.lesson_01_padding_free.companion import FAMILY_CONFIGS, family_probe
from trl_clinic.course.models import make_causal_lm
from trl_clinic.probes.packing import pack, packed_vs_separate


def sequences(tokenizer, n=3):
    return [tokenizer(r["prompt"] + r["completion"])["input_ids"] for r in data.mrc_samples(n, seed=0)]


def test_pack_restarts_positions():
    row = pack([[5, 6, 7], [8, 9]])
    assert row["input_ids"].tolist() == [[5, 6, 7, 8, 9]]
    assert row["position_ids"].tolist() == [[0, 1, 2, 0, 1]]


def test_llama_is_isolated_unless_a_mask_is_sent(tokenizer):
    model = make_causal_lm(tokenizer, "llama")
    assert packed_vs_separate(model, sequences(tokenizer))["isolated"]
    assert not packed_vs_separate(model, sequences(tokenizer), all_ones_mask=True)["isolated"]


def test_opt_is_contaminated_through_position_ids(tokenizer):
    result = packed_vs_separate(make_causal_lm(tokenizer, "opt"), sequences(tokenizer))
    assert not result["isolated"] and len(result["packed"]) == 3


def test_probe_restores_training_mode(tokenizer):
    model = make_causal_lm(tokenizer).train()
    packed_vs_separate(model, sequences(tokenizer, 2))
    assert model.training


def test_a_kv_cache_turns_the_boundary_search_off(tokenizer):
    model = make_causal_lm(tokenizer, "llama")
    assert not packed_vs_separate(model, sequences(tokenizer), use_cache=True)["isolated"]


def test_family_probe_flags_families_whose_mask_ignores_position_ids(tokenizer):
    seqs = sequences(tokenizer, 4)
    verdicts = {family: family_probe(tokenizer, family, 0, seqs)["isolated"] for family in FAMILY_CONFIGS}
    assert verdicts == {"llama": True, "qwen2": True, "opt": False, "falcon": False, "bloom": False, "mpt": False}
