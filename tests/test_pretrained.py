"""``pretrained=`` checked before anything loads (:mod:`lm_eval_probes.harness.pretrained`): a missing folder, a folder
without ``config.json``, a GGUF folder, an uncached hub id offline — each says what is missing."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from lm_eval_probes.harness.pretrained import ModelNotFound, check_pretrained, hub_offline, looks_like_path


def test_a_missing_folder_is_named(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "models").mkdir()
    for given, shown in ((str(tmp_path / "no" / "such" / "model"), tmp_path / "no" / "such" / "model"),
                         ("./nowhere", tmp_path / "nowhere"),
                         ("models/smol", tmp_path / "models" / "smol"),  # an existing parent folder: a path
                         ("a/b/c", tmp_path / "a" / "b" / "c")):  # two slashes: no hub id
        for offline in (False, True):
            with pytest.raises(ModelNotFound) as error:
                check_pretrained(given, offline=offline)
            assert str(error.value) == f"no model folder at {shown}", given
    home = Path("~").expanduser()
    with pytest.raises(ModelNotFound, match=f"no model folder at {home}/"):
        check_pretrained("~/surely-no-model-folder-here-35", offline=False)


def test_a_folder_without_config_says_so_and_lists_what_it_holds(tmp_path):
    folder = tmp_path / "weights"
    folder.mkdir()
    with pytest.raises(ModelNotFound) as error:
        check_pretrained(str(folder), offline=True)
    assert str(error.value) == f"the model folder {folder} has no config.json (not a saved Hugging Face model): it is empty"
    for name in ("model.safetensors", "tokenizer.json", "notes.txt"):
        (folder / name).write_text("x")
    (folder / "sub").mkdir()
    with pytest.raises(ModelNotFound) as error:
        check_pretrained(str(folder), offline=False)
    assert str(error.value).endswith("it holds model.safetensors, notes.txt, sub/, tokenizer.json")
    for i in range(10):
        (folder / f"shard-{i}.bin").write_text("x")
    with pytest.raises(ModelNotFound, match="and 6 more$"):
        check_pretrained(str(folder), offline=False)
    (folder / "config.json").write_text("{}")
    check_pretrained(str(folder), offline=True)  # a model folder: fine
    check_pretrained(folder, offline=True)  # a Path too


def test_a_gguf_folder_needs_its_file_not_a_config(tmp_path):
    folder = tmp_path / "gguf"
    folder.mkdir()
    (folder / "model.Q4_1.gguf").write_bytes(b"GGUF")
    check_pretrained(str(folder), offline=True, gguf_file="model.Q4_1.gguf")
    with pytest.raises(ModelNotFound) as error:
        check_pretrained(str(folder), offline=True)
    assert str(error.value) == f"the model folder {folder} has no config.json but GGUF files: pass gguf_file=model.Q4_1.gguf"
    with pytest.raises(ModelNotFound) as error:
        check_pretrained(str(folder), offline=True, gguf_file="model.Q8.gguf")
    assert str(error.value) == f"no GGUF file 'model.Q8.gguf' in the model folder {folder}: it holds model.Q4_1.gguf"
    with pytest.raises(ModelNotFound) as error:  # the file itself given as the folder
        check_pretrained(str(folder / "model.Q4_1.gguf"), offline=True)
    assert str(error.value) == (f"no model folder at {folder / 'model.Q4_1.gguf'}: it is a file (a GGUF file: pass "
                                f"pretrained={folder},gguf_file=model.Q4_1.gguf)")


def test_a_subfolder_is_where_the_config_is(tmp_path):
    (tmp_path / "repo" / "inner").mkdir(parents=True)
    (tmp_path / "repo" / "inner" / "config.json").write_text("{}")
    check_pretrained(str(tmp_path / "repo"), offline=True, subfolder="inner")
    with pytest.raises(ModelNotFound, match="no model folder at .*other \\(subfolder='other' of"):
        check_pretrained(str(tmp_path / "repo"), offline=True, subfolder="other")


def test_offline_hub_ids_must_be_cached(tmp_path, monkeypatch):
    import huggingface_hub.constants

    cache = tmp_path / "hub"
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_CACHE", str(cache))
    monkeypatch.chdir(tmp_path)
    check_pretrained("HuggingFaceTB/SmolLM2-135M", offline=False)  # online: the hub answers for it
    with pytest.raises(ModelNotFound) as error:
        check_pretrained("HuggingFaceTB/SmolLM2-135M", offline=True)
    message = str(error.value)
    assert message.startswith(f"the model 'HuggingFaceTB/SmolLM2-135M' is not in the Hugging Face cache ({cache}) "
                              "and the run is offline")
    snapshot = cache / "models--HuggingFaceTB--SmolLM2-135M" / "snapshots" / "abc123"
    snapshot.mkdir(parents=True)
    with pytest.raises(ModelNotFound):  # a snapshot without its config (an interrupted download)
        check_pretrained("HuggingFaceTB/SmolLM2-135M", offline=True)
    (snapshot / "config.json").write_text("{}")
    check_pretrained("HuggingFaceTB/SmolLM2-135M", offline=True)
    check_pretrained("gpt2", offline=False)


def test_what_counts_as_a_path(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "here").mkdir()
    assert all(looks_like_path(v) for v in ("/abs", "./rel", "../up", "~/home", "here/model", "a/b/c", "C:\\m"))
    assert not any(looks_like_path(v) for v in ("gpt2", "HuggingFaceTB/SmolLM2-135M", "org/name"))
    assert hub_offline({"HF_HUB_OFFLINE": "1"}) and hub_offline({"TRANSFORMERS_OFFLINE": "yes"})
    assert not hub_offline({"HF_HUB_OFFLINE": "0"}) and not hub_offline({})
    check_pretrained(object(), offline=True)  # a built model (lm_eval's Python API): not checked
    with pytest.raises(ModelNotFound, match="pretrained= is empty"):
        check_pretrained(" ", offline=True)
    assert issubclass(ModelNotFound, OSError)


def test_the_check_imports_neither_torch_nor_lm_eval():
    code = ("import sys\nfrom lm_eval_probes.harness.pretrained import ModelNotFound, check_pretrained\n"
            "for value in ('/no/such/folder/x', 'surely-not/cached-35'):\n"
            "    try:\n        check_pretrained(value, offline=True)\n    except ModelNotFound:\n        pass\n"
            "print(sorted(m for m in ('torch', 'lm_eval', 'transformers') if m in sys.modules))")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "[]"
