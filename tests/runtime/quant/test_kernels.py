"""The C kernels of quantized decode attention: the same sums as the torch path, built once, refused cleanly."""

import hashlib
import os
import subprocess
import sys
import tempfile
import time
import warnings
from pathlib import Path

import pytest
import torch

from duocal_runtime.quant import attention as QA
from duocal_runtime.quant import codes as Q
from duocal_runtime.quant import kernels as CK

needs_kernels = pytest.mark.skipif(CK.library() is None, reason="no C compiler here (the torch path is tested)")


def quantized_history(b, g, n, d, bits, group, dtype=torch.float32, seed=0):
    torch.manual_seed(seed)
    k, v = torch.randn(b, g, n, d, dtype=dtype) * 2, torch.randn(b, g, n, d, dtype=dtype)
    return Q.quantize_keys(k, bits, group), Q.quantize_values(v, bits, group)


def reference(q, history, rk, rv, visible, scaling, bits, group):
    """Attention over the dequantized history and the residual, in float64 (visible [B, N] or None)."""
    keys = torch.cat((Q.dequantize_keys(history[0], bits, group, torch.float64), rk.double()), 2)
    values = torch.cat((Q.dequantize_values(history[1], bits, group, torch.float64), rv.double()), 2)
    rep = q.shape[1] // keys.shape[1]
    scores = q.double() @ keys.repeat_interleave(rep, 1).transpose(-1, -2) * scaling
    if visible is not None:
        seen = torch.cat((visible, torch.ones(visible.shape[0], rk.shape[2], dtype=torch.bool)), -1)
        scores = scores.masked_fill(~seen[:, None, None], float("-inf"))
    return (torch.softmax(scores, -1) @ values.repeat_interleave(rep, 1)).float()


@needs_kernels
@pytest.mark.parametrize(
    "d, bits, group",
    [(64, 4, 32), (64, 8, 32), (128, 4, 32), (64, 4, 64), (16, 8, 16)],
    ids=["d64-4bit", "d64-8bit", "d128-4bit", "group64", "d16-8bit"],
)
def test_the_kernel_equals_attention_over_the_dequantized_history(d, bits, group):
    b, g, r, n, m = 2, 2, 4, 8 * group, 24
    history = quantized_history(b, g, n, d, bits, group)
    rk, rv, q = torch.randn(b, g, m, d), torch.randn(b, g, m, d), torch.randn(b, g * r, 1, d) * 3
    visible = torch.ones(b, n, dtype=torch.bool)
    visible[1, : group + 5] = False  # row 1 left padded, into its second group
    mask = visible[:, None, None]
    qg = q.reshape(b, g, r, d) * d**-0.5
    assert CK.attend(qg, *history, visible, bits, group) is not None  # the kernel takes this shape
    out = QA.quantized_attention(q, history, rk, rv, (mask, None), d**-0.5, bits, group)
    want = reference(q, history, rk, rv, visible, d**-0.5, bits, group)
    torch.testing.assert_close(out, want, rtol=0, atol=1e-5)
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv(CK.SWITCH_ENV, "off")
        assert CK.attend(qg, *history, visible, bits, group) is None
        torch.testing.assert_close(QA.quantized_attention(q, history, rk, rv, (mask, None), d**-0.5, bits, group), out)


@needs_kernels
def test_the_kernel_reads_strided_slices_bf16_scales_and_a_row_with_no_visible_history():
    b, g, r, d, n, m = 2, 3, 2, 64, 256, 8
    full = quantized_history(b, g, 2 * n, d, 4, 32, dtype=torch.bfloat16, seed=1)
    history = (Q.token_slice(full[0], 64, 64 + n, 32, True), Q.token_slice(full[1], 64, 64 + n, 32, False))
    assert not history[0].codes.is_contiguous()
    rk, rv = torch.randn(b, g, m, d, dtype=torch.bfloat16), torch.randn(b, g, m, d, dtype=torch.bfloat16)
    q = torch.randn(b, g * r, 1, d, dtype=torch.bfloat16)
    visible = torch.ones(b, n, dtype=torch.bool)
    visible[0] = False  # row 0 sees its residual only
    out = QA.quantized_attention(q, history, rk, rv, (visible[:, None, None], None), 0.125, 4, 32)
    want = reference(q.float(), history, rk.float(), rv.float(), visible, 0.125, 4, 32)
    assert out.dtype == torch.bfloat16
    torch.testing.assert_close(out.float(), want, rtol=1e-2, atol=1e-2)  # the result rounded to bf16
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv(CK.SWITCH_ENV, "off")
        torch.testing.assert_close(
            QA.quantized_attention(q, history, rk, rv, (visible[:, None, None], None), 0.125, 4, 32), out
        )


@needs_kernels
@pytest.mark.parametrize("n", [96, 61], ids=["whole-tiles", "a-short-tile"])
def test_the_values_kernel_equals_the_torch_sums_on_any_number_of_slots(n):
    torch.manual_seed(2)
    values = Q.quantize_values(torch.randn(2, 2, n, 64), 4, 32)
    p = torch.softmax(torch.randn(2, 2, 3, n), -1)
    fast = CK.weighted_token_values(p, values, 4, 32)
    want = p.double() @ Q.dequantize_values(values, 4, 32, torch.float64)
    torch.testing.assert_close(fast.double(), want, rtol=0, atol=1e-6)
    torch.testing.assert_close(QA.weighted_values(p, values, 4, 32), fast)


@needs_kernels
@pytest.mark.parametrize(
    "n, d, bits, group",
    [(96, 64, 4, 32), (61, 64, 8, 32), (45, 128, 4, 64), (37, 16, 8, 8)],
    ids=["whole-tiles-4bit", "a-short-tile-8bit", "d128-group64", "d16-group8"],
)
def test_the_key_scores_kernel_equals_scores_over_the_dequantized_keys(n, d, bits, group):
    torch.manual_seed(4)
    rows = Q.encode_tokens(torch.randn(2, 3, n + 5, d) * 2, bits, group)[:, :, 5:]  # slots start mid-buffer
    keys = Q.token_rows(rows, bits, group, d, torch.float32)
    assert not keys.codes.is_contiguous()
    qg = torch.randn(2, 3, 4, d)
    fast = CK.token_scores(qg, keys, bits, group)
    assert fast is not None and fast.shape == (2, 3, 4, n)
    want = qg.double() @ Q.dequantize_values(keys, bits, group, torch.float64).transpose(-1, -2)
    torch.testing.assert_close(fast.double(), want, rtol=0, atol=1e-4)
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv(CK.SWITCH_ENV, "off")
        assert CK.token_scores(qg, keys, bits, group) is None
        torch.testing.assert_close(QA.token_key_scores(qg, keys, bits, group), fast, rtol=0, atol=1e-4)


@needs_kernels
def test_threads_split_heads_and_give_the_same_result(monkeypatch):
    monkeypatch.setattr(CK, "TOKENS_PER_THREAD", 64)
    history = quantized_history(1, 4, 512, 64, 4, 32, seed=3)
    qg = torch.randn(1, 4, 4, 64)
    one = CK.attend(qg, *history, None, 4, 32)
    threads = torch.get_num_threads()
    torch.set_num_threads(3)
    try:
        assert CK._threads(4, 512) == 3
        for mine, theirs in zip(CK.attend(qg, *history, None, 4, 32), one, strict=True):
            torch.testing.assert_close(mine, theirs, rtol=0, atol=0)
    finally:
        torch.set_num_threads(threads)


def test_shapes_outside_the_kernel_use_torch():
    history = quantized_history(1, 1, 64, 24, 8, 8)  # head_dim 24 is not a multiple of 16
    assert CK.attend(torch.randn(1, 1, 2, 24), *history, None, 8, 8) is None
    history = quantized_history(1, 1, 64, 64, 4, 32)
    assert CK.attend(torch.randn(1, 1, CK.MAX_ROWS + 1, 64), *history, None, 4, 32) is None  # a prefill block
    assert CK.attend(torch.randn(1, 1, 2, 64, requires_grad=True), *history, None, 4, 32) is None  # no backward


STUB = """
#include <stdint.h>
void duocal_quantized_attention(void) {}
void duocal_weighted_values(void) {}
void duocal_token_scores(void) {}
"""


@pytest.fixture
def fresh_library(monkeypatch, tmp_path):
    """library() built from a stub source (milliseconds) into an empty cache; the real one restored after."""
    source = tmp_path / "stub.c"
    source.write_text(STUB)
    monkeypatch.setattr(CK, "SOURCE", source)
    monkeypatch.setenv("DUOCAL_CACHE_DIR", str(tmp_path / "cache"))
    CK.library.cache_clear()
    yield tmp_path / "cache" / "kernels"
    CK.library.cache_clear()


def test_the_build_lands_in_the_cache_once_and_whole(fresh_library):
    assert CK.library() is not None
    built = list(fresh_library.glob("*.so"))
    assert len(built) == 1 and sorted(p.suffix for p in fresh_library.iterdir()) == [".sha256", ".so"]  # no partial
    stamp = built[0].stat().st_mtime_ns
    CK.library.cache_clear()
    assert CK.library() is not None and built[0].stat().st_mtime_ns == stamp  # loaded, not built again


def test_a_damaged_cached_build_is_built_again(fresh_library):
    """In fresh processes: this one has the first build loaded, and a loader returns it by name."""
    load = (
        f"from duocal_runtime.quant import kernels as CK; CK.SOURCE = CK.Path({str(CK.SOURCE)!r}); assert CK.library()"
    )
    env = {**os.environ, "PYTHONWARNINGS": "error"}
    subprocess.run([sys.executable, "-c", load], check=True, env=env)
    (built,) = fresh_library.glob("*.so")
    built.write_bytes(b"not a shared object")
    subprocess.run([sys.executable, "-c", load], check=True, env=env)
    assert built.read_bytes()[:4] == b"\x7fELF"


def test_without_a_compiler_the_torch_path_answers_and_says_why(fresh_library, monkeypatch):
    monkeypatch.setenv("CC", "no-such-compiler")
    with pytest.warns(UserWarning, match="no C compiler 'no-such-compiler'.*set CC"):
        assert CK.library() is None
    history = quantized_history(1, 2, 64, 64, 4, 32)
    q, rk, rv = torch.randn(1, 4, 1, 64), torch.randn(1, 2, 8, 64), torch.randn(1, 2, 8, 64)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # warned once, not on every call
        out = QA.quantized_attention(q, history, rk, rv, (None, None), 0.125, 4, 32)
    torch.testing.assert_close(out, reference(q, history, rk, rv, None, 0.125, 4, 32), rtol=0, atol=1e-5)


def test_a_compiler_error_is_reported(fresh_library):
    CK.SOURCE.write_text("this is not C")
    with pytest.warns(UserWarning, match="did not build: .*failed"):
        assert CK.library() is None
    assert not [p for p in fresh_library.iterdir() if p.name.endswith(".partial")]


LOAD_IN_A_FRESH_PROCESS = (
    "from duocal_runtime.quant import kernels as CK; CK.SOURCE = CK.Path({source!r}); assert CK.library()"
)


def test_a_truncated_cached_build_is_never_mapped_and_is_built_again(fresh_library):
    """Mapping a truncated shared object kills the process with SIGBUS: its recorded sha256 keeps it out."""
    load = LOAD_IN_A_FRESH_PROCESS.format(source=str(CK.SOURCE))
    env = {**os.environ, "PYTHONWARNINGS": "error"}
    subprocess.run([sys.executable, "-c", load], check=True, env=env)
    (built,) = fresh_library.glob("*.so")
    whole = built.read_bytes()
    built.write_bytes(whole[: len(whole) // 3])
    done = subprocess.run([sys.executable, "-c", load], env=env, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    assert built.read_bytes()[:4] == b"\x7fELF" and len(built.read_bytes()) == len(whole)


def test_a_loadable_object_without_our_symbols_is_built_again(fresh_library):
    assert CK.library() is not None
    (built,) = fresh_library.glob("*.so")
    other = built.parent / "other.c"
    other.write_text("int something_else(void) { return 1; }\n")
    subprocess.run(["cc", "-shared", "-fPIC", "-o", str(built), str(other)], check=True)
    (built.with_suffix(".sha256")).write_text(hashlib.sha256(built.read_bytes()).hexdigest())  # whole, not ours
    CK.library.cache_clear()
    lib = CK.library()
    assert lib is not None and all(hasattr(lib, symbol) for symbol in CK.SYMBOLS)


def running(pid: int) -> bool:
    """Alive and not a zombie (an orphan's exit status may wait for a parent that never reaps it)."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except FileNotFoundError:
        return False
    return state != "Z"


def gone_within(seconds: float, pid: int) -> bool:
    """SIGKILL is delivered at once but a loaded machine may take a moment to end the process."""
    deadline = time.monotonic() + seconds
    while running(pid):
        if time.monotonic() > deadline:
            return False
        time.sleep(0.05)
    return True


def test_a_hanging_compiler_is_killed_with_its_children_and_torch_answers(fresh_library, monkeypatch, tmp_path):
    pids = tmp_path / "pids"
    compiler = tmp_path / "slow-cc"
    compiler.write_text(
        f'#!/bin/sh\ncase "$1" in --version) echo slow 1; exit 0;; esac\nsleep 60 &\necho $$ $! > {pids}\nwait\n'
    )
    compiler.chmod(0o755)
    monkeypatch.setenv("CC", str(compiler))
    monkeypatch.setattr(CK, "COMPILE_TIMEOUT_S", 1.0)
    started = time.monotonic()
    with pytest.warns(UserWarning, match="did not finish in 1 s"):
        assert CK.library() is None
    assert time.monotonic() - started < 10
    for pid in map(int, pids.read_text().split()):
        assert gone_within(5.0, pid), pid
    assert not list(fresh_library.glob("*.partial"))


def test_an_unusable_cache_builds_for_this_process_and_leaves_no_folder_behind(fresh_library, monkeypatch, tmp_path):
    cache_file = tmp_path / "cache-is-a-file"
    cache_file.write_text("")
    monkeypatch.setenv("DUOCAL_CACHE_DIR", str(cache_file))
    temp = tmp_path / "tmp"
    temp.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(temp))
    assert CK.library() is not None
    assert list(temp.iterdir()) == []
