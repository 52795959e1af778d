"""Where ``speclane init`` finds the served model's default temperature: the
``generation_config.json`` where ``/v1/models``' root leads, a directory or a Hugging Face id
in the local cache."""

from __future__ import annotations

from pathlib import Path

from gateway.setup.sampling import VLLM_DEFAULT, from_files


def test_a_hub_id_is_read_from_the_newest_snapshot_in_the_cache(tmp_path: Path) -> None:
    snapshot = tmp_path / "models--Qwen--Qwen3-8B" / "snapshots" / "abc123"
    snapshot.mkdir(parents=True)
    (snapshot / "generation_config.json").write_text('{"temperature": 0.6, "top_k": 20}')
    found = from_files("Qwen/Qwen3-8B", tmp_path)
    assert found is not None and (found.temperature, found.top_p) == (0.6, None)
    assert found.source == str(snapshot / "generation_config.json") and not found.decide
    assert from_files("Qwen/Qwen3-32B", tmp_path) is None
    assert from_files("", tmp_path) is None


def test_a_file_without_a_temperature_means_vllms_own(tmp_path: Path) -> None:
    (tmp_path / "generation_config.json").write_text('{"eos_token_id": 2}')
    found = from_files(str(tmp_path), tmp_path / "cache")
    assert found is not None and found.temperature == VLLM_DEFAULT
    assert found.source.endswith("sets none: vLLM's own default")
