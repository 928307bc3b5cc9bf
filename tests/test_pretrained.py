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


LLADA_CONFIG = ('{"model_type": "llada", "auto_map": {"AutoConfig": "configuration_llada.LLaDAConfig", '
                '"AutoModel": "modeling_llada.LLaDAModelLM"}}')


def test_a_config_that_needs_its_repository_code_is_refused_without_the_users_word(tmp_path, monkeypatch):
    """LLaDA and Dream map transformers' auto classes to their own code: the check names the option to add, and only
    the user's ``trust_remote_code`` lets it through (nothing in the plugin sets it)."""
    from lm_eval_probes.harness.pretrained import RemoteCodeNeeded

    folder = tmp_path / "llada"
    folder.mkdir()
    (folder / "config.json").write_text(LLADA_CONFIG)
    for given in (None, False, "False", "0"):
        with pytest.raises(RemoteCodeNeeded) as error:
            check_pretrained(str(folder), offline=True, trust_remote_code=given)
        message = str(error.value)
        assert "\n" not in message and "add trust_remote_code=True" in message and "'llada'" in message
    assert issubclass(RemoteCodeNeeded, ModelNotFound)  # reported in one line wherever a missing model is
    for given in (True, "True", "true", "1"):
        check_pretrained(str(folder), offline=True, trust_remote_code=given)
    known = tmp_path / "known"  # an auto_map beside a model type transformers knows: its own code is not needed
    known.mkdir()
    (known / "config.json").write_text('{"model_type": "llama", "auto_map": {"AutoConfig": "x.Y"}}')
    check_pretrained(str(known), offline=True)
    import huggingface_hub.constants  # a cached hub snapshot is read the same way

    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_CACHE", str(tmp_path / "hub"))
    snapshot = tmp_path / "hub" / "models--GSAI-ML--LLaDA-8B-Instruct" / "snapshots" / "abc"
    snapshot.mkdir(parents=True)
    (snapshot / "config.json").write_text(LLADA_CONFIG)
    with pytest.raises(RemoteCodeNeeded, match="GSAI-ML/LLaDA-8B-Instruct"):
        check_pretrained("GSAI-ML/LLaDA-8B-Instruct", offline=True)
    check_pretrained("GSAI-ML/LLaDA-8B-Instruct", offline=True, trust_remote_code=True)


def test_the_wrappers_and_the_preflight_refuse_remote_code_not_given(tmp_path, capsys):
    from lm_eval_probes.__main__ import main
    from lm_eval_probes.harness.pretrained import RemoteCodeNeeded
    from lm_eval_probes.models.diffusion import DiffusionProbeHFLM

    folder = tmp_path / "llada"
    folder.mkdir()
    (folder / "config.json").write_text(LLADA_CONFIG)
    with pytest.raises(RemoteCodeNeeded, match="add trust_remote_code=True"):
        DiffusionProbeHFLM(pretrained=str(folder), device="cpu")  # before any weight loads
    with pytest.raises(SystemExit) as done:
        main(["run", "--model", "hf-probes-diffusion", "--model_args", f"pretrained={folder}",
              "--tasks", "probes_synth_logic"])
    assert done.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "add trust_remote_code=True" in err[0], err


def test_nothing_in_the_package_turns_remote_code_on():
    """No keyword argument, dict entry or item assignment of the package gives ``trust_remote_code`` a true constant
    (``lm-eval-probes run --trust_remote_code`` passes the user's own flag on; messages may name the option)."""
    import ast

    import lm_eval_probes

    def truthy(node: ast.AST) -> bool:
        return isinstance(node, ast.Constant) and str(node.value).strip().lower() in ("true", "1", "yes", "on")

    def named(node: ast.AST | None) -> bool:
        return isinstance(node, ast.Constant) and node.value == "trust_remote_code"

    package = Path(lm_eval_probes.__file__).parent
    found = []
    for path in package.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.keyword) and node.arg == "trust_remote_code" and truthy(node.value):
                found.append(f"{path.name}:{node.value.lineno}")
            elif isinstance(node, ast.Dict):
                found += [f"{path.name}:{key.lineno}" for key, value in zip(node.keys, node.values)
                          if named(key) and truthy(value)]
            elif isinstance(node, ast.Assign) and truthy(node.value):
                found += [f"{path.name}:{node.lineno}" for target in node.targets
                          if isinstance(target, ast.Subscript) and named(target.slice)]
    assert not found, found
    code = "{'model_defaults': {'hf-probes-diffusion': {'trust_remote_code': 'True'}}}"  # what the test catches
    assert any(named(k) and truthy(v) for n in ast.walk(ast.parse(code)) if isinstance(n, ast.Dict)
               for k, v in zip(n.keys, n.values))
