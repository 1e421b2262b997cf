"""config.json / model folder / Hugging Face cache / catalogue -> Architecture, and the errors."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from kvwatch.cli import main
from kvwatch.errors import UsageError
from kvwatch.reconcile import catalogue
from kvwatch.reconcile.architecture import hf_cache_config, load_config_file, resolve_model

ROOT = Path(__file__).resolve().parent
SYNTHETIC = ROOT / "fixtures" / "synthetic-configs"
TINY = ROOT / "fixtures" / "vllm-cpu" / "tiny-llama"


@pytest.mark.parametrize(
    ("folder", "field"),
    [
        ("missing-layers", "num_hidden_layers"),
        ("wrong-type-heads", "num_attention_heads"),
        ("unknown-architecture", "architectures"),
        ("bad-dtype", "torch_dtype"),
        ("layer-types-wrong-length", "layer_types"),
    ],
    ids=["missing_field", "wrong_type", "unknown_architecture", "unknown_dtype", "layer_types_length"],
)
def test_bad_config_is_a_one_line_error_naming_the_field(folder: str, field: str) -> None:
    with pytest.raises(UsageError) as info:
        resolve_model(str(SYNTHETIC / folder))
    message = str(info.value)
    assert f"'{field}'" in message
    assert "\n" not in message


def test_invalid_json_names_the_file_and_line() -> None:
    with pytest.raises(UsageError, match=r"not-json/config.json: not valid JSON \(line 2"):
        resolve_model(str(SYNTHETIC / "not-json"))


@pytest.mark.parametrize(
    "folder",
    ["missing-layers", "wrong-type-heads", "unknown-architecture", "not-json"],
    ids=["missing_field", "wrong_type", "unknown_architecture", "invalid_json"],
)
def test_cli_refuses_bad_config_with_exit_2_and_no_traceback(folder: str, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as info:
        main(["capacity", "--model", str(SYNTHETIC / folder), "--kv-cache-gib", "5"])
    assert info.value.code == 2
    err = capsys.readouterr().err
    assert err.startswith("kvwatch: error: ")
    assert err.count("\n") == 1
    assert "Traceback" not in err


def test_unknown_model_id_lists_the_closest_catalogue_names(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as info:
        main(["capacity", "--model", "meta-llama/Llama-3.1-9B-Instruct", "--kv-cache-gib", "5"])
    assert info.value.code == 2
    err = capsys.readouterr().err
    assert "closest catalogue names: meta-llama/Llama-3.1-8B" in err
    assert err.count("\n") == 1


def test_reads_a_real_config_json_from_a_model_folder() -> None:
    arch = resolve_model(str(TINY))
    assert (arch.layers, arch.kv_heads, arch.head_dim, arch.dtype) == (4, 2, 32, "bfloat16")
    assert arch.attention == "gqa"
    assert arch.source.endswith("tiny-llama/config.json")


def test_reads_a_config_json_file_directly() -> None:
    assert resolve_model(str(TINY / "config.json")).layers == 4


@pytest.mark.parametrize(
    ("folder", "expected"),
    [
        ("head-dim-from-hidden", {"head_dim": 128, "kv_heads": 8, "attention": "gqa", "dtype": "float16"}),
        ("mqa-multi-query", {"head_dim": 128, "kv_heads": 1, "attention": "mqa"}),
        ("mla-deepseek-v2-lite", {"head_dim": 576, "kv_heads": 1, "attention": "mla", "mla": True}),
        ("multimodal-text-config", {"layers": 40, "kv_heads": 8, "head_dim": 128, "attention": "gqa"}),
        ("hybrid-mamba2-layer-types", {"layers": 8, "attention_layers": 2, "attention": "hybrid"}),
    ],
    ids=[
        "head_dim_is_hidden_over_heads",
        "multi_query_is_one_kv_head",
        "mla_latent_is_rank_plus_rope",
        "text_config_holds_the_numbers",
        "mamba_layers_hold_no_kv",
    ],
)
def test_reads_architecture_variants(folder: str, expected: dict[str, object]) -> None:
    arch = resolve_model(str(SYNTHETIC / folder))
    for key, value in expected.items():
        assert getattr(arch, key) == value, key


def _fake_cache(root: Path, model_id: str, config: dict[str, object], *, with_ref: bool) -> Path:
    repo = root / "hub" / ("models--" + model_id.replace("/", "--"))
    snap = repo / "snapshots" / "abc123"
    snap.mkdir(parents=True)
    (snap / "config.json").write_text(json.dumps(config))
    if with_ref:
        (repo / "refs").mkdir()
        (repo / "refs" / "main").write_text("abc123\n")
    return snap / "config.json"


@pytest.mark.parametrize("with_ref", [True, False], ids=["refs_main", "newest_snapshot"])
def test_finds_a_model_id_in_the_local_hugging_face_cache(tmp_path: Path, with_ref: bool) -> None:
    cfg = json.loads((TINY / "config.json").read_text())
    cfg["num_hidden_layers"] = 6
    expected = _fake_cache(tmp_path, "acme/tiny-six", cfg, with_ref=with_ref)
    env = {"HF_HOME": str(tmp_path)}
    assert hf_cache_config("acme/tiny-six", env) == expected
    arch = resolve_model("acme/tiny-six", env=env)
    assert (arch.name, arch.layers) == ("acme/tiny-six", 6)


def test_cache_wins_over_the_catalogue_for_the_same_id(tmp_path: Path) -> None:
    cfg = json.loads((TINY / "config.json").read_text())
    _fake_cache(tmp_path, "meta-llama/Llama-3.1-8B", cfg, with_ref=True)
    assert resolve_model("meta-llama/Llama-3.1-8B", env={"HF_HUB_CACHE": str(tmp_path / "hub")}).layers == 4
    assert resolve_model("meta-llama/Llama-3.1-8B", env={"HF_HOME": str(tmp_path / "empty")}).layers == 32


def test_missing_folder_config_is_a_usage_error(tmp_path: Path) -> None:
    with pytest.raises(UsageError, match=r"folder has no config\.json"):
        resolve_model(str(tmp_path))


def test_load_config_file_names_a_missing_file(tmp_path: Path) -> None:
    with pytest.raises(UsageError, match="no such file"):
        load_config_file(tmp_path / "nope.json")


@pytest.mark.parametrize(
    ("name", "model_id"),
    [
        ("meta-llama/Llama-3.1-8B-Instruct", "meta-llama/Llama-3.1-8B"),
        ("/mnt/models/Meta-Llama-3.1-8B-Instruct", "meta-llama/Llama-3.1-8B"),
        ("NousResearch/Hermes-3-Llama-3.1-8B", "meta-llama/Llama-3.1-8B"),
        ("/mnt/tenant-home_speed/Model/Qwen/Qwen2.5-7B-Instruct", "Qwen/Qwen2.5-7B-Instruct"),
        ("/mnt/model/mistralai-Pixtral-12B-2409", "mistral-community/pixtral-12b"),
        ("Qwen3-30B-A3B-FP8", "Qwen/Qwen3-30B-A3B"),
        ("DEEPSEEK-R1", "deepseek-ai/DeepSeek-R1"),
    ],
    ids=[
        "instruct_alias",
        "local_path",
        "fine_tune_alias",
        "path_from_real_log_016",
        "path_from_real_log_017",
        "quantised_suffix_dropped",
        "case_insensitive",
    ],
)
def test_catalogue_finds_names_as_logs_spell_them(name: str, model_id: str) -> None:
    entry = catalogue.find(name)
    assert entry is not None
    assert entry.model_id == model_id


def test_every_catalogue_entry_reads_and_cites_its_source() -> None:
    for entry in catalogue.CATALOGUE:
        arch = catalogue.architecture(entry)
        assert arch.source.startswith("https://huggingface.co/"), entry.model_id
        assert entry.fields, entry.model_id
        assert (arch.weights_bytes or 0) > 0, entry.model_id


@pytest.mark.parametrize(
    ("name", "attention", "layers", "attention_layers", "kv_heads", "head_dim"),
    [
        ("meta-llama/Llama-2-7b-hf", "mha", 32, 32, 32, 128),
        ("meta-llama/Llama-2-70b-hf", "gqa", 80, 80, 8, 128),
        ("meta-llama/Llama-3.1-405B", "gqa", 126, 126, 8, 128),
        ("meta-llama/Llama-3.2-1B", "gqa", 16, 16, 8, 64),
        ("Qwen/Qwen3-235B-A22B", "gqa", 94, 94, 4, 128),
        ("deepseek-ai/DeepSeek-V3", "mla", 61, 61, 1, 576),
        ("google/gemma-2-9b-it", "sliding", 42, 42, 8, 256),
        ("google/gemma-3-27b-it", "sliding", 62, 62, 16, 128),
        ("openai/gpt-oss-120b", "sliding", 36, 36, 8, 64),
        ("microsoft/Phi-3-mini-4k-instruct", "mha", 32, 32, 32, 96),
        ("ai21labs/Jamba-v0.1", "hybrid", 32, 4, 8, 128),
        ("mistral-community/pixtral-12b", "gqa", 40, 40, 8, 128),
    ],
    ids=lambda v: str(v).split("/")[-1] if isinstance(v, str) and "/" in v else None,
)
def test_catalogue_architectures(
    name: str, attention: str, layers: int, attention_layers: int, kv_heads: int, head_dim: int
) -> None:
    arch = resolve_model(name)
    assert (arch.attention, arch.layers, arch.attention_layers, arch.kv_heads, arch.head_dim) == (
        attention,
        layers,
        attention_layers,
        kv_heads,
        head_dim,
    )


def test_gemma3_slides_on_five_of_every_six_layers() -> None:
    kinds = resolve_model("gemma-3-27b").layer_kinds
    assert kinds.count("full") == 10
    assert kinds[5] == "full"
    assert kinds[:5] == ("sliding",) * 5
