"""``python -m minirl train --model ...`` (issue 36, item 3e): the command line trains a saved checkpoint end to end
on the offline chat stand-in (``standins``) with minirl's GSM8K-style file, saves the policy and checkpoints, and
resumes; without --model the main job's command is untouched."""

import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from standins import save_chat_standin

from minirl import __main__ as cli
from minirl import models

ROOT = Path(__file__).resolve().parent.parent
TIMINGS = ("time", "time_generate", "time_optimise")


@pytest.fixture(scope="module")
def standin_dir(tmp_path_factory):
    return save_chat_standin(tmp_path_factory.mktemp("qwen3chat"))


def rows(path):
    return [{k: v for k, v in json.loads(line).items() if k not in TIMINGS} for line in open(path)]


def test_the_cli_trains_a_saved_chat_model_end_to_end_in_under_a_minute_and_resumes(standin_dir, tmp_path):
    out = tmp_path / "run"
    command = [sys.executable, "-m", "minirl", "train", "--model", str(standin_dir), "--reward", "answer,format",
               "--reward-weights", "1,0.5", "--steps", "2", "--prompts-per-step", "2", "--group-size", "4",
               "--max-new-tokens", "16", "--lr", "1e-5", "--checkpoint-every", "1", "--gradient-checkpointing",
               "--system-prompt", "Solve it and end with #### N.", "--out", str(out)]
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
    t0 = time.time()
    done = subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True, timeout=120)
    seconds = time.time() - t0
    assert done.returncode == 0, done.stderr[-3000:]
    assert seconds < 60, seconds  # measured about 5 s on 2 shared cores, most of it imports
    assert "mean reward" in done.stdout and f"{out}/policy/" in done.stdout
    assert sorted(p.name for p in out.iterdir()) == ["checkpoint-1", "checkpoint-2", "metrics.jsonl", "policy",
                                                     "summary.json"]
    whole = rows(out / "metrics.jsonl")
    assert [r["step"] for r in whole] == [1, 2]
    summary = json.loads((out / "summary.json").read_text())
    assert summary["reward"] == ["answer", "format"] and summary["steps"] == 2
    # the saved policy is the model after the last step, the weights of that step's checkpoint (a random stand-in
    # earns no reward, so here they equal the start's; a moving update: test_chat.py; exact logits: test_resume.py)
    policy, last = (models.load(str(p)).state_dict() for p in (out / "policy", out / "checkpoint-2" / "policy"))
    assert policy.keys() == last.keys() and all(torch.equal(policy[k], last[k]) for k in policy)
    # resume the run from its newest checkpoint (step 2) for one more step
    argv = command[3:] + ["--resume", "latest"]
    argv[argv.index("--steps") + 1] = "3"
    assert cli.main(argv) == 0
    resumed = rows(out / "metrics.jsonl")
    assert [r["step"] for r in resumed] == [1, 2, 3] and resumed[:2] == whole
    assert json.loads((out / "summary.json").read_text())["resumed_from"].endswith("checkpoint-2")


def test_cli_errors_name_the_flag(standin_dir, tmp_path):
    with pytest.raises(ValueError, match="--reward"):
        cli.main(["train", "--model", str(standin_dir), "--reward", "length", "--out", str(tmp_path)])
    with pytest.raises(ValueError, match="--reward-weights"):
        cli.main(["train", "--model", str(standin_dir), "--reward", "answer", "--reward-weights", "1,2",
                  "--out", str(tmp_path)])
    with pytest.raises(ValueError, match="no checkpoint"):
        cli.main(["train", "--model", str(standin_dir), "--resume", "latest", "--out", str(tmp_path)])


def test_a_new_run_into_an_out_with_checkpoints_needs_resume_or_overwrite(standin_dir, tmp_path):
    """Issue 47 item 9, the command line's side: a new run into an --out with checkpoints is refused (it would leave
    the old run's later checkpoints for --resume latest); --overwrite removes them first."""
    argv = ["train", "--model", str(standin_dir), "--steps", "1", "--prompts-per-step", "2", "--group-size", "2",
            "--max-new-tokens", "4", "--checkpoint-every", "1", "--out", str(tmp_path)]
    assert cli.main(argv) == 0
    with pytest.raises(ValueError, match="already holds checkpoints of an earlier run"):
        cli.main(argv + ["--reward", "format"])
    with pytest.raises(ValueError, match="--overwrite"):
        cli.main(argv + ["--overwrite", "--resume", "latest"])
    assert cli.main(argv + ["--reward", "format", "--overwrite"]) == 0
    manifest = json.loads((tmp_path / "checkpoint-1" / "checkpoint.json").read_text())
    assert manifest["run"]["rewards"] == ["minirl.gsm8k.format_reward"]


def test_a_jsonl_of_prompt_rows_and_a_base_tokenizer(tmp_path):
    from minirl.tokenizer import build_tokenizer

    path = tmp_path / "rows.jsonl"
    path.write_text(json.dumps({"prompt": "1+2=", "answer": "3"}) + "\n")
    data = cli.load_prompts(str(path), build_tokenizer(), system_prompt="add")
    assert data[0] == {"prompt": "add\n\n1+2=", "answer": "3"}
    gsm = cli.load_prompts(str(ROOT / "data" / "gsm8k_style" / "train.jsonl"), build_tokenizer())
    assert isinstance(gsm[0]["prompt"], str)  # no chat template: the question as plain text
    path.write_text(json.dumps({"text": "x"}) + "\n")
    with pytest.raises(ValueError, match="'question' and 'answer'"):
        cli.load_prompts(str(path), build_tokenizer())


def test_without_model_the_main_job_runs_as_before(monkeypatch):
    calls = []

    class Called(Exception):
        pass

    def fake_main_job(*args, **kwargs):
        calls.append((args, kwargs))
        raise Called

    monkeypatch.setattr(cli, "main_job", fake_main_job)
    with pytest.raises(Called):
        cli.main(["train", "--algo", "dapo", "--steps", "3", "--seed", "2"])
    assert calls == [(("dapo", None, 2, 3, "runs/dapo"), {"warm_start_seed": 0})]


# ------------------------------------------------------------------------------------------------ bad input (issue 47)
@pytest.fixture
def offline(monkeypatch):
    """Nothing may wait on the hub (huggingface_hub reads HF_HUB_OFFLINE once, at import)."""
    import huggingface_hub

    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", True)


ROW = json.dumps({"question": "Tom has 3 apples and buys 4. How many?", "answer": "3 + 4 = 7\n#### 7"})
BAD_DATA = [  # (file name, content, the error's message)
    ("empty.jsonl", "", r"empty.jsonl: no rows \(the file is empty\)"),  # was a bare StopIteration
    ("blank.jsonl", "\n  \n", r"blank.jsonl: no rows"),
    ("later.jsonl", ROW + "\n\n" + json.dumps({"question": "5 + 1?"}) + "\n",  # was a TypeError naming no row
     r"later.jsonl, line 3: field 'answer' missing \(the row has 'question'"),
    ("broken.jsonl", ROW + '\n{"question": "x", answer}\n',  # was a JSONDecodeError at "line 1" of the line
     r"broken.jsonl, line 2: not valid JSON \(Expecting property name"),
    ("array.jsonl", f"[{ROW}]\n", r"array.jsonl, line 1: expected a JSON object \(a row of named fields\), got list"),
    ("object.json", "[" + ROW + ',\n  "just text"]', r"object.json, line 2: expected a JSON object"),
    ("syntax.json", "[" + ROW + ",\n\n {]", r"syntax.json, line 3: not valid JSON"),
    ("noquestion.jsonl", ROW + "\n" + json.dumps({"answer": "#### 2"}) + "\n",
     r"noquestion.jsonl, line 2: field 'question' missing"),
    ("nullquestion.jsonl", ROW + "\n" + json.dumps({"question": None, "answer": "#### 2"}) + "\n",
     r"nullquestion.jsonl, line 2: field 'question' is null, not a non-empty string"),
    ("nonumber.jsonl", ROW + "\n" + json.dumps({"question": "q", "answer": "seven"}) + "\n",
     r"nonumber.jsonl, line 2: field 'answer' is \"seven\", not a string with a final number"),
    ("prompts.jsonl", json.dumps({"prompt": "1+2=", "answer": "3"}) + "\n" + json.dumps({"prompt": "2+2="}) + "\n",
     r"prompts.jsonl, line 2: field 'answer' missing"),
    ("mixed.jsonl", json.dumps({"prompt": "1+2=", "answer": "3"}) + "\n"
     + json.dumps({"prompt": [{"role": "user", "content": "2+2="}], "answer": "4"}) + "\n",
     r"mixed.jsonl, line 2: field 'prompt' is not a string, but line 1's is"),
    ("neither.jsonl", json.dumps({"text": "x"}) + "\n", r"neither.jsonl, line 1: a row needs 'question' and 'answer'"),
]


@pytest.mark.parametrize("name,content,message", BAD_DATA, ids=[b[0] for b in BAD_DATA])
def test_bad_data_fails_naming_the_file_line_and_field_before_anything_is_written(standin_dir, tmp_path, offline,
                                                                                   name, content, message):
    (tmp_path / name).write_text(content)
    out = tmp_path / "run"
    with pytest.raises(ValueError, match=message):
        cli.main(["train", "--model", str(standin_dir), "--dataset", str(tmp_path / name), "--steps", "1",
                  "--out", str(out)])
    assert not out.exists()


def test_a_json_array_of_rows_loads_as_its_rows(tmp_path):
    """A .json file holding one array of rows (what datasets' json loader reads) was an AttributeError."""
    from minirl.tokenizer import build_tokenizer

    path = tmp_path / "rows.json"
    path.write_text(json.dumps([json.loads(ROW), {"question": "2 + 2?", "answer": "#### 4"}], indent=2))
    data = cli.load_prompts(str(path), build_tokenizer())
    assert data["answer"] == ["7", "4"] and data["prompt"][1] == "2 + 2?"


def test_a_base_model_with_a_system_prompt_never_trains_on_the_text_none(tmp_path):
    """A base tokenizer (no chat template) with --system-prompt turned a row without a question into the prompt
    "Solve it.\\n\\nNone"; now the row is refused by its line."""
    from minirl.tokenizer import build_tokenizer

    path = tmp_path / "rows.jsonl"
    path.write_text(ROW + "\n" + json.dumps({"answer": "#### 2"}) + "\n")
    with pytest.raises(ValueError, match="rows.jsonl, line 2: field 'question' missing"):
        cli.load_prompts(str(path), build_tokenizer(), system_prompt="Solve it.")
    path.write_text(json.dumps({"prompt": "1+2=", "answer": "3"}) + "\n" + json.dumps({"answer": "2"}) + "\n")
    with pytest.raises(ValueError, match="rows.jsonl, line 2: field 'prompt' missing"):
        cli.load_prompts(str(path), build_tokenizer(), system_prompt="Solve it.")


def test_a_mistyped_local_model_path_fails_at_once_naming_the_folder(tmp_path, offline, monkeypatch):
    """It went to the hub (about 60 s of retries online) and its error never said the folder does not exist."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "runs").mkdir()
    for typo in ["runs/qwen3-policy", "./qwen3", str(tmp_path / "qwen3"), "~/no-such-minirl-model"]:
        t0 = time.time()
        with pytest.raises(FileNotFoundError, match=f"no such folder: {re.escape(typo)}"):
            cli.main(["train", "--model", typo, "--steps", "1", "--out", str(tmp_path / "run")])
        assert time.time() - t0 < 5
    assert not (tmp_path / "run").exists()


def test_a_model_folder_without_tokenizer_files_says_which_are_missing(standin_dir, tmp_path, offline):
    """transformers 5 built an empty tokenizer from such a folder (older ones asked to install sentencepiece)."""
    folder = tmp_path / "weights-only"
    folder.mkdir()
    for name in ("config.json", "model.safetensors"):
        (folder / name).write_bytes((standin_dir / name).read_bytes())
    with pytest.raises(ValueError, match=r"has no tokenizer files: none of tokenizer.json, tokenizer.model, vocab.json"
                                         r".*\(it holds config.json, model.safetensors\)"):
        cli.main(["train", "--model", str(folder), "--steps", "1", "--out", str(tmp_path / "run")])
    assert not (tmp_path / "run").exists()


def test_a_reward_named_twice_is_refused(standin_dir, tmp_path):
    """--reward answer,answer counted the answer twice, silently."""
    with pytest.raises(ValueError, match="'answer' is named twice"):
        cli.main(["train", "--model", str(standin_dir), "--reward", "answer,format,answer", "--out", str(tmp_path)])
