"""DeepSpeed is calibration's dependency only: fetching a model (its GGUF conversion) and starting
`duocal serve` never import it (it costs seconds and prints a warning) (issue 38)."""

import subprocess
import sys

from conftest import REPO

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
Models.from_pretrained = lambda folder, gguf_file, dtype: plain_model({str(DEMO)!r}, dtype=dtype)
Tokenizers.from_pretrained = lambda folder, gguf_file: plain_tokenizer({str(DEMO)!r})
out = Path(tempfile.mkdtemp()) / "model"
convert_gguf(Path("ignored/demo.gguf"), out)
print("deepspeed" in sys.modules)
original = plain_model({str(DEMO)!r}, dtype=torch.float32).eval()
converted = plain_model(str(out), dtype=torch.float32).eval()
ids = torch.arange(3, 40)[None]
same = torch.equal(original(ids).logits, converted(ids).logits)
tied = converted.lm_head.weight.data_ptr() == converted.model.embed_tokens.weight.data_ptr()
print(same, tied, sorted(p.name for p in out.iterdir()))
"""

SERVE = """
import sys
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


def test_converting_a_fetched_model_does_not_import_deepspeed_and_writes_the_same_model():
    imported, checks = run(CONVERT)[-2:]
    assert imported == "False"
    same, tied, files = checks.split(" ", 2)
    assert same == "True" and tied == "True", checks
    assert "'config.json'" in files and "'model.safetensors'" in files and "'tokenizer.json'" in files, files


def test_starting_a_server_does_not_import_deepspeed():
    assert run(SERVE)[-1] == "False"
