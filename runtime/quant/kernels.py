"""The C kernels of quantized decode attention (csrc/quantized_attention.c, vectors.h), built on first use.

Decode over KIVI codes in torch converts every block of codes to fp32 and runs small matmuls on
it; the C kernels read the codes as they are, a row at a time, and keep the sums in registers.
They are compiled once per machine with the system's C compiler (`$CC`, else `cc`; `-O3
-march=native`) into duocal's cache folder (`kernels/`, keyed by the source, the compiler and the
CPU), written under a temporary name, its sha256 recorded beside it, then renamed, so processes
that build at once never load half a file; a cached file that does not hash to its record (truncated:
mapping it would crash with SIGBUS) or lacks the kernels' symbols is built again, once, and a build
still unusable falls back to torch with a warning. A compiler that hangs is killed with its children
after COMPILE_TIMEOUT_S. Without a compiler, or with `DUOCAL_KERNELS=off`, or where a shape is outside what the
kernels take (CUDA tensors, a traced graph, queries that need gradients, prefill-sized query
blocks, head_dim not a multiple of 16), `attend` / `weighted_token_values` / `token_scores` return None and the
caller computes the same sums in torch. A failed build warns once with the compiler's message.
"""

from __future__ import annotations

import ctypes
import functools
import hashlib
import os
import platform
import shutil
import signal
import subprocess
import tempfile
import warnings
from pathlib import Path

import torch

from ..files.atomic import write_atomic
from . import codes as Q

SOURCE = Path(__file__).with_name("csrc") / "quantized_attention.c"
SWITCH_ENV = "DUOCAL_KERNELS"
MAX_ROWS, MAX_HEAD_DIM = 64, 256  # MAXR and MAXV * 8 in the C source
TOKENS_PER_THREAD = 32768
COMMON = ("-O3", "-shared", "-fPIC", "-pthread")
FLAGS = (("-march=native", *COMMON), COMMON)
SYMBOLS = ("duocal_quantized_attention", "duocal_weighted_values", "duocal_token_scores")
COMPILE_TIMEOUT_S, VERSION_TIMEOUT_S = 120.0, 20.0  # a build takes ~7 s here


def enabled() -> bool:
    return os.environ.get(SWITCH_ENV, "on").strip().lower() not in ("0", "off", "false", "no")


def attend(
    qg: torch.Tensor, keys: Q.QuantizedKV, values: Q.QuantizedKV, visible: torch.Tensor | None, bits: int, group: int
):
    """Softmax of qg [B, G, RT, D] (scaled) over n quantized tokens (`visible` [B, n] bool or None), as
    (running max, sum of exp(score − max), unnormalized weighted values): [B, G, RT, 1] twice and
    [B, G, RT, D], fp32; None where the kernel does not apply."""
    n = keys.codes.shape[2]
    if n % group or not _applies(qg, keys, bits, group):
        return None
    b, g, rows, d = qg.shape
    qg = qg.float().contiguous()
    parts = [_rows(t) for t in (keys.codes, keys.scale.float(), keys.zero.float())]
    parts += [_rows(t) for t in (values.codes, values.scale.float(), values.zero.float())]
    mask = None if visible is None else visible.to(torch.uint8).contiguous()
    out = torch.empty(b, g, rows, d, dtype=torch.float32)
    top, total = (torch.empty(b, g, rows, 1, dtype=torch.float32) for _ in range(2))
    library().duocal_quantized_attention(
        qg.data_ptr(), *(t.data_ptr() for t in parts), _strides(parts),
        None if mask is None else mask.data_ptr(), 0 if mask is None else mask.stride(0),
        out.data_ptr(), top.data_ptr(), total.data_ptr(),
        b, g, rows, d, n, bits, group, _threads(b * g, n),
    )  # fmt: skip
    return top, total, out


def weighted_token_values(p: torch.Tensor, values: Q.QuantizedKV, bits: int, group: int) -> torch.Tensor | None:
    """The C kernel's [B, G, RT, D] sums of p [B, G, RT, n] times values quantized per token, or None."""
    return _per_token("duocal_weighted_values", p, values, values.codes.shape[3] * 8 // bits, bits, group)


def token_scores(qg: torch.Tensor, keys: Q.QuantizedKV, bits: int, group: int) -> torch.Tensor | None:
    """The C kernel's [B, G, RT, n] scores of qg [B, G, RT, D] against keys quantized per token, or None."""
    return _per_token("duocal_token_scores", qg, keys, keys.codes.shape[2], bits, group)


def _per_token(kernel: str, x: torch.Tensor, quantized: Q.QuantizedKV, width: int, bits: int, group: int):
    """x [B, G, RT, *] against tokens quantized per token -> [B, G, RT, width] (fp32), or None."""
    if not _applies(x, quantized, bits, group):
        return None
    b, g, rows, _ = x.shape
    x = x.float().contiguous()
    parts = [_rows(t) for t in (quantized.codes, quantized.scale.float(), quantized.zero.float())]
    out = torch.empty(b, g, rows, width, dtype=torch.float32)
    d, n = quantized.codes.shape[3] * 8 // bits, quantized.codes.shape[2]
    getattr(library(), kernel)(
        x.data_ptr(), *(t.data_ptr() for t in parts), _strides(parts),
        out.data_ptr(), b, g, rows, d, n, bits, group, _threads(b * g, n),
    )  # fmt: skip
    return out


def _applies(x: torch.Tensor, quantized: Q.QuantizedKV, bits: int, group: int) -> bool:
    d = quantized.codes.shape[3] * 8 // bits
    return (
        x.device.type == "cpu"
        and quantized.codes.device.type == "cpu"
        and not torch.compiler.is_compiling()
        and not (torch.is_grad_enabled() and x.requires_grad)  # the kernel has no backward
        and x.shape[2] <= MAX_ROWS
        and d % 16 == 0
        and d <= MAX_HEAD_DIM
        and group % 8 == 0
        and enabled()
        and library() is not None
    )


def _threads(heads: int, n: int) -> int:
    """torch's thread count, at most one per head and per TOKENS_PER_THREAD head-tokens (starting a
    thread costs tens of microseconds; a short history is faster on one)."""
    return max(1, min(torch.get_num_threads(), heads, heads * n // TOKENS_PER_THREAD))


def _rows(t: torch.Tensor) -> torch.Tensor:
    return t if t.stride(-1) == 1 else t.contiguous()


def _strides(parts: list[torch.Tensor]):
    """(b, g, token) strides of each part, in elements, as one int64 array."""
    return (ctypes.c_int64 * (3 * len(parts)))(*(s for t in parts for s in t.stride()[:3]))


@functools.cache
def library() -> ctypes.CDLL | None:
    """The built kernels, or None (warned once) when they cannot be built here."""
    try:
        lib = _load()
    except (OSError, subprocess.SubprocessError) as err:
        warnings.warn(
            f"duocal: quantized attention runs in torch (slower), the C kernels did not build: {err}", stacklevel=2
        )
        return None
    i64, ptr, i64s = ctypes.c_int64, ctypes.c_void_p, ctypes.POINTER(ctypes.c_int64)
    lib.duocal_quantized_attention.argtypes = [ptr] * 7 + [i64s, ptr, i64] + [ptr] * 3 + [i64] * 7
    for per_token in (lib.duocal_weighted_values, lib.duocal_token_scores):
        per_token.argtypes, per_token.restype = [ptr] * 4 + [i64s, ptr] + [i64] * 7, None
    lib.duocal_quantized_attention.restype = None
    return lib


def _load() -> ctypes.CDLL:
    """Load the cached build if it is whole (its recorded sha256) and ours (its symbols), else build it
    once more; a cache this user cannot use gets a build for this process, removed once loaded."""
    compiler = os.environ.get("CC") or "cc"
    if shutil.which(compiler) is None:
        raise OSError(f"no C compiler {compiler!r} on PATH (install one, or set CC)")
    version = _run([compiler, "--version"], VERSION_TIMEOUT_S).stdout
    sources = [p.read_text() for p in sorted(SOURCE.parent.glob("*.[ch]"))]  # the kernel and its header
    key = hashlib.sha256("\0".join((*sources, compiler, version, repr(FLAGS), _cpu())).encode()).hexdigest()
    name = f"quantized_attention-{key[:16]}.so"
    folder = _cache_folder()
    if folder is None:
        with tempfile.TemporaryDirectory(prefix="duocal-kernels-") as tmp:
            return _checked(_build(compiler, Path(tmp) / name))  # a loaded object outlives its file
    target = folder / name
    if _whole(target):
        try:
            return _checked(target)
        except OSError:  # not our kernels after all: built again below, renamed over it
            pass
    return _checked(_build(compiler, target))


def _whole(target: Path) -> bool:
    """The file is there and hashes to what its build recorded (a truncated object would crash the
    process that maps it, with SIGBUS: it is never loaded)."""
    try:
        recorded = _digest_file(target).read_text().strip()
        return hashlib.sha256(target.read_bytes()).hexdigest() == recorded
    except OSError:
        return False


def _digest_file(target: Path) -> Path:
    return target.with_suffix(".sha256")


def _checked(path: Path) -> ctypes.CDLL:
    lib = ctypes.CDLL(str(path))
    missing = [symbol for symbol in SYMBOLS if not hasattr(lib, symbol)]
    if missing:
        raise OSError(f"{path} is not duocal's kernel build (no {', '.join(missing)})")
    return lib


def _build(compiler: str, target: Path) -> Path:
    """Compile to a temporary name, record its sha256, then rename it over `target`."""
    fd, partial = tempfile.mkstemp(dir=target.parent, prefix=target.stem, suffix=".partial")
    os.close(fd)
    try:
        errors = []
        for flags in FLAGS:  # -march=native first; a compiler that refuses it gets portable code
            done = _run([compiler, *flags, "-o", partial, str(SOURCE)], COMPILE_TIMEOUT_S)
            if done.returncode == 0:
                digest = hashlib.sha256(Path(partial).read_bytes()).hexdigest()
                write_atomic(_digest_file(target), digest + "\n")
                os.replace(partial, target)
                return target
            errors.append(done.stderr.strip()[-1000:])
        raise OSError(f"{compiler} failed: {errors[-1]}")
    finally:
        Path(partial).unlink(missing_ok=True)


def _run(command: list[str], timeout_s: float) -> subprocess.CompletedProcess:
    """`command` in a session of its own: past `timeout_s` the compiler and every child it started
    (cc1, as, ld) are killed, and an OSError says so."""
    process = subprocess.Popen(
        command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True
    )
    try:
        out, err = process.communicate(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, signal.SIGKILL)
        process.communicate()
        raise OSError(f"{command[0]} did not finish in {timeout_s:g} s (killed)") from None
    return subprocess.CompletedProcess(command, process.returncode, out, err)


def _cache_folder() -> Path | None:
    """duocal's cache folder for kernels, made if needed; None when this user cannot write there."""
    from ..files.cache_root import default_cache_dir

    try:
        folder = default_cache_dir() / "kernels"
        folder.mkdir(parents=True, exist_ok=True)
    except (ValueError, OSError):  # the cache path is a file, or not ours to write
        return None
    return folder if os.access(folder, os.W_OK | os.X_OK) else None


def _cpu() -> str:
    """What -march=native depends on: the CPU's model and flags."""
    try:
        lines = Path("/proc/cpuinfo").read_text().splitlines()
    except OSError:
        return platform.machine() + platform.processor()
    return "\n".join(sorted({line for line in lines if line.startswith(("model name", "flags", "Features"))}))
