"""DeepSpeed is calibration's dependency only: fetching a model (its GGUF conversion) and starting
`duocal serve` never import it (it costs seconds and prints a warning) (issue 38)."""

import subprocess
import sys

from helpers.paths import REPO

DEMO = REPO / "duocal" / "assets" / "demo-model"

# convert_gguf with transformers' GGUF reading swapped for the bundled demo model (a real GGUF cannot be
# made here): everything it writes runs as in a fetch; the folder must reload to the same logits.
CONVERT = f"""
import sys, tempfile, torch
from pathlib import Path
import transformers
from duocal.models.gguf import convert_gguf

Models, Tokenizers = transformers.AutoModelForCausalLM, transformers.AutoTokenizer
plain_model, plain_tokenizer = Models.from_pretrained, Tokenizers.from_pretrained
def as_from_gguf(model):  # a GGUF file's config names no architectures
    model.config.architectures = None
    return model

Models.from_pretrained = lambda folder, gguf_file, dtype: as_from_gguf(plain_model({str(DEMO)!r}, dtype=dtype))
Tokenizers.from_pretrained = lambda folder, gguf_file: plain_tokenizer({str(DEMO)!r})
out = Path(tempfile.mkdtemp()) / "model"
convert_gguf(Path("ignored/demo.gguf"), out)
print("deepspeed" in sys.modules)
Models.from_pretrained, Tokenizers.from_pretrained = plain_model, plain_tokenizer  # as they were
original = plain_model({str(DEMO)!r}, dtype=torch.float32).eval()
converted = plain_model(str(out), dtype=torch.float32).eval()
ids = torch.arange(3, 40)[None]
same = torch.equal(original(ids).logits, converted(ids).logits)
tied = converted.lm_head.weight.data_ptr() == converted.model.embed_tokens.weight.data_ptr()
import json
architectures = json.loads((out / "config.json").read_text())["architectures"]
from safetensors import safe_open
names = set(safe_open(str(out / "model.safetensors"), "pt").keys())  # vLLM skips lm_head.weight of a tied model
stored = "model.embed_tokens.weight" in names and "lm_head.weight" not in names
print(same, tied, architectures == ["LlamaForCausalLM"] and stored, sorted(p.name for p in out.iterdir()))
"""

SERVE = """
from duocal.serving.startup import ServeSettings, prepare_server
from duocal.cli.app import app
served, summary = prepare_server(ServeSettings(sparsity=0.5, num_blocks=64))
served.manager.stop(block=True, hard_stop=True)
print("deepspeed" in sys.modules)
"""


def run(code: str) -> list[str]:
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    return done.stdout.splitlines()


def test_fetching_and_serving_a_model_do_not_import_deepspeed_and_the_fetched_folder_is_the_model():
    imported_by_fetch, checks, imported_by_serve = run(CONVERT + SERVE)[-3:]  # one process: one torch import
    assert imported_by_fetch == "False" and imported_by_serve == "False"
    same, tied, architectures, files = checks.split(" ", 3)
    # vLLM needs `architectures` in config.json and the tied embedding stored under its own name
    assert same == "True" and tied == "True" and architectures == "True", checks
    assert "'config.json'" in files and "'model.safetensors'" in files and "'tokenizer.json'" in files, files
