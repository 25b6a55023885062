"""CMake switches a manifest may set (`build.cmake_args`): the pinned llama.cpp's own options (b11434's
CMakeLists.txt and ggml/CMakeLists.txt), each with the kind of value it takes.

A value travels far: the Dockerfile splits CMAKE_ARGS at spaces, CMake splits a value at `;` into a list, and some
values are spliced into every compile line (GGML_CPU_ARM_ARCH becomes `-march=<value>`, GGML_SCHED_MAX_COPIES a
`-D` definition). So `-DGGML_CPU_ARM_ARCH=armv8-a;-wrapper;sh,-c,id` would make gcc run `sh -c id` for every file,
and `-DGGML_SCHED_MAX_COPIES=4;GGML_CPU_GENERIC` would add a macro. Every switch therefore takes a value of one
kind: a boolean, a whole number within bounds, an architecture (a name with `+feature`s), or one word of a set.
A character CMake, the shell or a compiler would split on is refused in every argument, whoever vouches for it;
a switch not in the list needs `--trust-source` (harness/intake/trust.py); the switches the kit sets itself are
refused."""

from __future__ import annotations

import re
from dataclasses import dataclass

#: What CMake (`;`), the Dockerfile's shell (spaces, quotes, `$`, globs) or the kit's one-line errors would act on.
_SPLITTERS = re.compile(r"""[;\s'"`$\\*?\[\]{}()<>|&!#~]""")
_ARG = re.compile(r"-D([A-Za-z_][A-Za-z0-9_]*)(?::(BOOL|STRING))?=(.*)", re.DOTALL)
_ARCH = re.compile(r"[a-z0-9][a-z0-9._-]{0,47}(?:\+[a-z0-9][a-z0-9._-]{0,31}){0,16}")
_BOOLS = ("ON", "OFF", "TRUE", "FALSE", "YES", "NO", "1", "0")


@dataclass(frozen=True)
class Kind:
    """The value a switch takes: `bool`, `number` (lo..hi), `arch` (a -march/-mcpu name with +features) or `word`
    (one of `words`)."""

    name: str
    lo: int = 0
    hi: int = 0
    words: tuple[str, ...] = ()

    def accepts(self, value: str) -> bool:
        if self.name == "bool":
            return value.upper() in _BOOLS
        if self.name == "number":
            return value.isascii() and value.isdigit() and len(value) <= 6 and self.lo <= int(value) <= self.hi
        if self.name == "arch":
            return _ARCH.fullmatch(value) is not None
        return value in self.words

    def describe(self) -> str:
        if self.name == "bool":
            return "ON or OFF"
        if self.name == "number":
            return f"a whole number from {self.lo} to {self.hi}"
        if self.name == "arch":
            return "an architecture such as armv8.2-a+dotprod (letters, digits, '.', '-', '+features')"
        return f"one of {list(self.words)}"


BOOL = Kind("bool")
_BOOL_SWITCHES = (
    # ggml: build, CPU features and variants
    "GGML_NATIVE", "GGML_LTO", "GGML_CCACHE", "GGML_STATIC", "GGML_BACKEND_DL", "GGML_CPU", "GGML_CPU_ALL_VARIANTS",
    "GGML_CPU_REPACK", "GGML_CPU_HBM", "GGML_SSE42", "GGML_AVX", "GGML_AVX_VNNI", "GGML_AVX2", "GGML_BMI2",
    "GGML_AVX512", "GGML_AVX512_VBMI", "GGML_AVX512_VNNI", "GGML_AVX512_BF16", "GGML_FMA", "GGML_F16C",
    "GGML_AMX_TILE", "GGML_AMX_INT8", "GGML_AMX_BF16", "GGML_LASX", "GGML_LSX", "GGML_RVV", "GGML_RV_ZFH",
    "GGML_RV_ZVFH", "GGML_RV_ZICBOP", "GGML_RV_ZIHINTPAUSE", "GGML_RV_ZVFBFWMA", "GGML_XTHEADVECTOR", "GGML_VXE",
    "GGML_SCHED_NO_REALLOC", "GGML_BLAS", "GGML_LLAMAFILE", "GGML_OPENMP", "GGML_ACCELERATE",
    "GGML_ALL_WARNINGS", "GGML_ALL_WARNINGS_3RD_PARTY", "GGML_FATAL_WARNINGS", "GGML_GPROF",
    "GGML_SANITIZE_THREAD", "GGML_SANITIZE_ADDRESS", "GGML_SANITIZE_UNDEFINED", "GGML_BUILD_TESTS",
    "GGML_BUILD_EXAMPLES",
    # ggml: CUDA and Vulkan
    "GGML_CUDA_FORCE_MMQ", "GGML_CUDA_FORCE_CUBLAS", "GGML_CUDA_NO_PEER_COPY", "GGML_CUDA_NO_VMM", "GGML_CUDA_FA",
    "GGML_CUDA_FA_ALL_QUANTS", "GGML_CUDA_GRAPHS", "GGML_CUDA_NCCL", "GGML_VULKAN_CHECK_RESULTS",
    "GGML_VULKAN_DEBUG", "GGML_VULKAN_MEMORY_DEBUG", "GGML_VULKAN_SHADER_DEBUG_INFO", "GGML_VULKAN_VALIDATE",
    "GGML_VULKAN_RUN_TESTS",
    # llama.cpp (LLAMA_CURL is deprecated in b11434 but still read: the README's manifests set it)
    "LLAMA_CURL", "LLAMA_OPENSSL", "LLAMA_BUILD_TESTS", "LLAMA_BUILD_EXAMPLES", "LLAMA_BUILD_TOOLS",
    "LLAMA_BUILD_SERVER", "LLAMA_BUILD_COMMON", "LLAMA_BUILD_APP", "LLAMA_BUILD_MTMD", "LLAMA_BUILD_UI",
    "LLAMA_USE_PREBUILT_UI", "LLAMA_ALL_WARNINGS", "LLAMA_ALL_WARNINGS_3RD_PARTY", "LLAMA_FATAL_WARNINGS",
    "LLAMA_SANITIZE_THREAD", "LLAMA_SANITIZE_ADDRESS", "LLAMA_SANITIZE_UNDEFINED", "LLAMA_SUBPROCESS",
    "LLAMA_BUILD_IS_DEV", "LLAMA_TOOLS_INSTALL", "LLAMA_TESTS_INSTALL",
)
#: Switch -> the kind of value it takes. Not here on purpose: switches that fetch code or name a URL or a path
#: (GGML_OPENMP_FETCH, GGML_CUDA_CCCL_VERSION, GGML_CPU_KLEIDIAI, LLAMA_LLGUIDANCE, LLAMA_USE_SYSTEM_GGML,
#: ZENDNN_ROOT), lists (GGML_CUDA_FA_QUANTS), and backends the kit builds no image for.
SWITCHES: dict[str, Kind] = {
    **{name: BOOL for name in _BOOL_SWITCHES},
    "GGML_SCHED_MAX_COPIES": Kind("number", 1, 64),
    "GGML_CPU_ARM_ARCH": Kind("arch"),
    "GGML_CPU_POWERPC_CPUTYPE": Kind("arch"),
    "GGML_BLAS_VENDOR": Kind("word", words=("Generic", "OpenBLAS", "FLAME", "ATLAS", "FlexiBLAS", "Intel10_64lp",
                                            "Intel10_64lp_seq", "NVHPC", "Apple")),
    "GGML_CUDA_COMPRESSION_MODE": Kind("word", words=("none", "speed", "balance", "size")),
    "CMAKE_BUILD_TYPE": Kind("word", words=("Release", "RelWithDebInfo", "MinSizeRel", "Debug")),
}
#: Switches the kit sets itself, from the manifest field named.
RESERVED: dict[str, str] = {
    "GGML_CUDA": "build.backend", "GGML_VULKAN": "build.backend",
    "CMAKE_CUDA_ARCHITECTURES": "build.cuda_architectures",
    "LLAMA_BUILD_NUMBER": "llama_cpp.identity.build_number", "LLAMA_BUILD_COMMIT": "llama_cpp.identity.commit",
}


def _shown(arg: str) -> str:
    return repr(arg if len(arg) <= 80 else arg[:77] + "...")


def refusal(arg: str) -> str | None:
    """Why an argument is refused whoever vouches for it (a character something splits on, not `-DNAME=value`, a
    switch the kit sets, a value not of its switch's kind), or None."""
    if any(ord(ch) < 32 or ord(ch) == 127 for ch in arg):
        return f"{_shown(arg)} holds a control character; give one switch with one plain value"
    bad = _SPLITTERS.search(arg)
    if bad is not None:
        return (f"{_shown(arg)} holds {bad.group(0)!r}: CMake splits a value at ';' and the build's shell at spaces, "
                "so one switch would become several arguments of the compiler; give one switch with one plain value")
    m = _ARG.fullmatch(arg)
    if m is None:
        return f"{_shown(arg)}: expected -DNAME=value (a CMake cache switch)"
    name, typed, value = m.groups()
    if name in RESERVED:
        return f"{_shown(arg)}: the kit sets {name} itself, from {RESERVED[name]}"
    kind = SWITCHES.get(name)
    if kind is None:
        return None  # another switch: the trust rule decides (harness/intake/trust.py)
    if (typed == "BOOL") != (kind is BOOL) and typed is not None:
        return f"{_shown(arg)}: {name} is not a :{typed} switch"
    if not kind.accepts(value):
        return f"{_shown(arg)}: {name} takes {kind.describe()}"
    return None


def allowed(arg: str) -> bool:
    """Whether a manifest may set this argument without --trust-source: a switch of the list, its value of the
    switch's kind."""
    m = _ARG.fullmatch(arg)
    return m is not None and m.group(1) in SWITCHES and refusal(arg) is None
