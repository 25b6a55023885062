"""What a received manifest says is checked for what it is: a build flag is a switch of the pinned source with a
value of its kind (never a program), a count is an integer, a swept value or flag is one value or option however it
is spelt, a server's slot count is the concurrency it is measured at, and every round a run may make counts against
the measurement cap. Each crafted input gets its one line, before any engine, host or build is reached."""

from __future__ import annotations

import copy
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from harness import ROOT, KitError, schema
from harness.image import source as sources
from harness.intake import cmake_flags, flags, trust
from harness.intake import manifest as mf
from harness.run import plan as pl
from harness.run.server import server_command
from tests.conftest import DEMO, write_manifest
from tests.crafted import one_line

DEMO_RAW = yaml.safe_load(DEMO.read_text())


def _manifest(folder: Path, edit) -> Path:
    raw = copy.deepcopy(DEMO_RAW)
    edit(raw)
    return write_manifest(folder, yaml.safe_dump(raw, allow_unicode=True, sort_keys=False), "m.yaml")


def _refused(folder: Path, edit, *parts: str) -> str:
    with pytest.raises(KitError) as e:
        mf.load(_manifest(folder, edit))
    return one_line(e, "m.yaml: ", *parts)


def _invoke(*args: str, **env: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "invoke", "-r", str(ROOT), *args], capture_output=True, text=True,
                          timeout=120, cwd=ROOT, env={**os.environ, **env})


def _entry(raw: dict, sid: str) -> dict:
    return next(s for s in raw["strategies"] if s["id"] == sid)


# ---------------------------------------------------------------- build flags: switches with values of their kind


@pytest.mark.parametrize("arg,expected", [
    # on arm64 the pinned source splices this into every compile line: gcc would run `sh -c id` for each file
    ("-DGGML_CPU_ARM_ARCH=armv8-a;-wrapper;sh,-c,id", "holds ';': CMake splits a value at ';'"),
    # a configure of the pinned source adds GGML_CPU_GENERIC as a preprocessor macro
    ("-DGGML_SCHED_MAX_COPIES=4;GGML_CPU_GENERIC", "holds ';'"),
    ("-DGGML_CPU_ARM_ARCH=armv8-a,-wrapper,sh", "GGML_CPU_ARM_ARCH takes an architecture"),
    ("-DGGML_CPU_ARM_ARCH=-wrapper", "GGML_CPU_ARM_ARCH takes an architecture"),
    ("-DGGML_SCHED_MAX_COPIES=4.0", "GGML_SCHED_MAX_COPIES takes a whole number from 1 to 64"),
    ("-DGGML_SCHED_MAX_COPIES=1000000", "from 1 to 64"),
    ("-DGGML_NATIVE=maybe", "GGML_NATIVE takes ON or OFF"),
    ("-DGGML_OPENMP:STRING=OFF", "is not a :STRING switch"),
    ("-DCMAKE_BUILD_TYPE=Release -DCMAKE_C_COMPILER_LAUNCHER=sh", "holds ' '"),
    ("-DGGML_CUDA_COMPRESSION_MODE=$(id)", "holds '$'"),
    ("-DLLAMA_CURL=OFF\n-DX=1", "a control character"),
    ("-DGGML_CUDA=ON", "the kit sets GGML_CUDA itself, from build.backend"),
    ("-DLLAMA_BUILD_COMMIT=deadbeef", "from llama_cpp.identity.commit"),
    ("-DCMAKE_CUDA_ARCHITECTURES=86", "from build.cuda_architectures"),
    ("-D", "expected -DNAME=value"),
])
def test_a_build_flag_that_could_run_a_program_or_add_a_macro_is_one_line(sandbox, arg, expected):
    _refused(sandbox.work, lambda r: r["build"].update(cmake_args=[arg]), "build.cmake_args[0]: ", expected)


def test_the_switches_a_manifest_may_set_need_no_word_and_others_need_trust_source(sandbox):
    allowed = ["-DGGML_CPU_ARM_ARCH=armv8.2-a+dotprod+i8mm", "-DGGML_SCHED_MAX_COPIES=1", "-DGGML_OPENMP:BOOL=OFF",
               "-DLLAMA_CURL=OFF", "-DGGML_BLAS_VENDOR=OpenBLAS", "-DCMAKE_BUILD_TYPE=RelWithDebInfo"]
    m = mf.load(_manifest(sandbox.work / "ok", lambda r: r["build"].update(cmake_args=allowed)))
    assert trust.untrusted_fields(m) == []
    # a switch outside the list (a compiler launcher runs a program): the user's word, not the manifest's
    m = mf.load(_manifest(sandbox.work / "other", lambda r: r["build"].update(cmake_args=["-DGGML_OPENMP_FETCH=ON"])))
    with pytest.raises(KitError) as e:
        trust.decide(m, trust_source=False)
    one_line(e, "build.cmake_args[0]: '-DGGML_OPENMP_FETCH=ON' is not one of the pinned llama.cpp's switches",
             "pass --trust-source")
    # the switches the README and the committed manifests use are on the list
    readme = re.findall(r"-D[A-Z_]+=[A-Za-z0-9_.+-]+", (ROOT / "README.md").read_text())
    used = [a for p in (ROOT / "manifests").glob("*.yaml") for a in mf.load(p).build.cmake_args]
    assert readme and all(cmake_flags.allowed(a) or a.split("=")[0][2:] in cmake_flags.RESERVED
                          for a in readme + used), readme + used


def test_the_crafted_flag_is_refused_by_the_task_even_with_trust_source(sandbox):
    path = _manifest(sandbox.work, lambda r: r["build"].update(cmake_args=["-DGGML_CPU_ARM_ARCH=armv8-a;-wrapper;"
                                                                            "sh,-c,id"]))
    res = _invoke("build", "--plan", "--trust-source", "--manifest", str(path))
    lines = res.stderr.strip().splitlines()
    assert res.returncode == 1 and len(lines) == 1 and "build.cmake_args[0]" in lines[0], res.stderr
    assert "Traceback" not in res.stderr and '"CMAKE_ARGS"' not in res.stdout


def test_every_allowed_switch_is_an_option_of_the_pinned_source(demo_image, demo_manifest):
    """The list is the pinned source's own: each switch is an option() or a cache variable of its CMake files
    (LLAMA_CURL a deprecated one it still reads)."""
    tree = sources.cached_tree(demo_manifest)
    assert tree is not None, "the demo image's build fetched the pinned sdist into the kit's cache"
    text = "".join(p.read_text(errors="replace") for p in [tree / "CMakeLists.txt", tree / "ggml" / "CMakeLists.txt"])
    declared = set(re.findall(r"option\(\s*([A-Z0-9_]+)", text)) | set(re.findall(r"set\s*\(\s*([A-Z0-9_]+)\s+"
                                                                                  r"[^)]*CACHE", text))
    declared |= set(re.findall(r"llama_option_depr\(\s*\w+\s+([A-Z0-9_]+)", text))
    assert set(cmake_flags.SWITCHES) - declared == set()


# ---------------------------------------------------------------- llama-server flags: arity and spellings


def test_cpu_strict_takes_zero_or_one_as_the_pinned_build_says(sandbox):
    """`--cpu-strict <0|1>` in b11434's help: the value was refused as "'1' is not a flag"."""
    for flag in ("--cpu-strict", "--cpu-strict-batch", "--spec-draft-cpu-strict", "--cpu-strict-draft",
                 "--spec-draft-cpu-strict-batch", "--cpu-strict-batch-draft"):
        m = mf.load(_manifest(sandbox.work / flag.strip("-"),
                              lambda r, f=flag: r.update(server_args=r["server_args"] + [f, "1"])))
        cmd = server_command(m, m.strategy("ngram-mod"), {k: Path(f"{k}.gguf") for k in m.models}, 8080)
        assert cmd[cmd.index(flag) + 1] == "1"
    _refused(sandbox.work / "two", lambda r: r.update(server_args=r["server_args"] + ["--cpu-strict", "2"]),
             "server_args[8]: '--cpu-strict' takes 0 or 1, got '2'")
    _refused(sandbox.work / "none", lambda r: r.update(server_args=["--cpu-strict"] + r["server_args"]),
             "server_args[0]: '--cpu-strict' expects a value, got the flag '-c'")


def test_arity_of_every_allowed_flag_as_the_pinned_build_states_it(demo_image, demo_manifest):
    """Each allowed flag takes a value exactly where common/arg.cpp's handler takes one."""
    tree = sources.cached_tree(demo_manifest)
    assert tree is not None
    text = (tree / "common" / "arg.cpp").read_text(errors="replace")
    arity: dict[str, int] = {}
    for m in re.finditer(r"common_arg\(\s*\{([^}]*)\}(\s*,\s*\{([^}]*)\})?", text):
        handler = re.search(r"\[\]\s*\(([^)]*)\)", text[m.end():m.end() + 3000])
        takes = 0 if m.group(3) or (handler and "," not in handler.group(1)) else 1
        for name in re.findall(r'"([^"]+)"', m.group(1) + (m.group(3) or "")):
            arity.setdefault(name, 0 if name in re.findall(r'"([^"]+)"', m.group(3) or "") else takes)
    wrong = {f: (n, arity.get(f)) for f, n in flags.ALLOWED.items() if arity.get(f) != n}
    assert wrong == {}


@pytest.mark.parametrize("edit,field,expected", [
    (lambda r: _entry(r, "ngram-simple").update(sweep={"-td": [1, 2], "--threads-draft": [3]}),
     "sweep.--threads-draft", "'--threads-draft' and '-td' are one llama-server option"),
    (lambda r: _entry(r, "ngram-simple").update(sweep={"--threads": [1, 2]}),
     "sweep.--threads", "also given in server_args (as '-t', the same option)"),
    (lambda r: _entry(r, "ngram-simple").update(sweep={"--spec-ngram-simple-size-n": [2, "2.0"]}),
     "sweep.--spec-ngram-simple-size-n", "values '2' and '2.0' are one value"),
    (lambda r: _entry(r, "draft-simple").update(args=[], sweep={"--spec-draft-p-min": [0.5, "0.50"]}),
     "sweep.--spec-draft-p-min", "values '0.5' and '0.50' are one value"),
    (lambda r: _entry(r, "draft-simple").update(args=[], sweep={"--spec-draft-p-min": ["nan", 0.5]}),
     "sweep.--spec-draft-p-min", "'nan' is not a finite number"),
    (lambda r: _entry(r, "draft-simple").update(args=[], sweep={"--spec-draft-p-min": ["inf"]}),
     "sweep.--spec-draft-p-min", "'inf' is not a finite number"),
    (lambda r: _entry(r, "draft-simple").update(args=["--spec-draft-p-min", "-Infinity"]),
     "args[0]", "not a finite number"),
])
def test_a_sweep_names_each_option_and_value_once_however_spelt(sandbox, edit, field, expected):
    _refused(sandbox.work, edit, field, expected)


# ---------------------------------------------------------------- slots are the concurrency level


def test_slots_given_in_args_or_server_args_are_the_level_measured(sandbox):
    def edit(r):
        r["server_args"] = ["-c", "12288", "-np", "4", "-t", "2"]  # every entry without `parallel` runs 4 slots
        r["strategies"] = [{"id": "baseline", "spec_type": "none", "parallel": [1, 2]},
                           {"id": "ngram-mod", "spec_type": "ngram-mod"},
                           {"id": "ngram-cache", "spec_type": "ngram-cache", "args": ["--parallel", "2"]}]
    m = mf.load(_manifest(sandbox.work / "m", edit))
    assert {s.id: s.parallel for s in m.strategies} == {"baseline": 1, "baseline[parallel=2]": 2, "ngram-mod": 4,
                                                        "ngram-cache": 2}
    paths = {k: Path(f"{k}.gguf") for k in m.models}
    for sid, slots, ctx in (("baseline", "1", "12288"), ("baseline[parallel=2]", "2", "24576"),
                            ("ngram-mod", "4", "49152"), ("ngram-cache", "2", "24576")):
        cmd = server_command(m, m.strategy(sid), paths, 8080)
        given = [cmd[i + 1] for i, a in enumerate(cmd) if a in ("-np", "--parallel")]
        assert given == [slots] and cmd[cmd.index("-c") + 1] == ctx, (sid, cmd)
    assert m.baseline_for(m.strategy("ngram-mod")).id == "baseline"  # no baseline at 4: its first level


@pytest.mark.parametrize("edit,field,expected", [
    (lambda r: _entry(r, "baseline").update(args=["-np", "4"]), "strategies[0].args",
     "give the number of slots with parallel, not --parallel in args"),
    (lambda r: _entry(r, "ngram-mod").update(args=["--parallel", "4.0"]), "strategies[8].args",
     "--parallel '4.0': expected a whole number of slots from 1 to 64"),
    (lambda r: r.update(server_args=["-np", "0"]), "server_args", "expected a whole number of slots"),
    (lambda r: r.update(server_args=["--parallel=999"]), "server_args", "from 1 to 64"),
])
def test_slots_that_are_no_level_are_one_line(sandbox, edit, field, expected):
    _refused(sandbox.work, edit, field, expected)


# ---------------------------------------------------------------- integers


@pytest.mark.parametrize("edit,expected", [
    (lambda r: _entry(r, "ngram-mod").update(parallel=4.0), "strategies[8].parallel"),
    (lambda r: _entry(r, "ngram-mod").update(parallel=[1, 2.0]), "strategies[8].parallel"),
    (lambda r: r.update(confirm_rounds=2.0), "confirm_rounds: expected integer, got float 2.0"),
    (lambda r: r.update(runs=3.0), "runs: expected integer, got float 3.0"),
    (lambda r: r.update(retakes=1.0), "retakes: expected integer, got float 1.0"),
    (lambda r: r.update(retakes=True), "retakes: expected integer, got bool True"),
    (lambda r: r["tasks"][0].update(n_predict=128.0), "tasks[0].n_predict: expected integer"),
    (lambda r: r["sampling"].update(seed="42"), "sampling.seed: expected integer, got str '42'"),
])
def test_a_count_that_is_not_an_integer_is_one_line_at_validate(sandbox, edit, expected):
    _refused(sandbox.work, edit, expected)


def test_validate_says_parallel_4_0_in_one_line(sandbox):
    path = _manifest(sandbox.work, lambda r: _entry(r, "ngram-mod").update(parallel=4.0))
    res = _invoke("validate", "--manifest", str(path))
    lines = res.stderr.strip().splitlines()
    assert res.returncode == 1 and len(lines) == 1 and "strategies[8].parallel" in lines[0], res.stderr


@pytest.mark.parametrize("flag,value,expected", [
    ("--runs", "1.0", "--runs: expected a whole number, got '1.0'"),
    ("--retakes", "1.0", "--retakes: expected a whole number, got '1.0'"),
    ("--seed", "1e3", "--seed: expected a whole number"),
    ("--until", "nan%", "--until: expected a percentage between 0 and 100%"),
    ("--max-rounds", "0", "--max-rounds: expected 1 or more"),
])
def test_run_flags_are_checked_before_any_engine_or_host(sandbox, flag, value, expected):
    # an engine that does not exist: a flag checked after reaching it would say so instead
    res = _invoke("run", flag, value, "--manifest", str(DEMO), DOCKER_HOST="unix:///nonexistent/docker.sock")
    lines = res.stderr.strip().splitlines()
    assert res.returncode == 1 and len(lines) == 1 and expected in lines[0], res.stderr


def test_run_json_counts_are_integers(sandbox):
    from harness.store.runmeta import RunMeta
    from tests.crafted import DEMO_RUN

    obj = json.loads((DEMO_RUN / "run.json").read_text())
    for path, value in ((("plan", "runs"), 3.0), (("plan", "shuffle_seed"), True),
                        (("strategies", 0, "parallel"), 1.0)):
        bad = copy.deepcopy(obj)
        node = bad
        for k in path[:-1]:
            node = node[k]
        node[path[-1]] = value
        with pytest.raises(KitError) as e:
            RunMeta.from_json(bad, "run.json")
        one_line(e, "run.json: ", ".".join(str(p) for p in path).replace(".0.", "[0]."), "expected integer")
    rec = json.loads((DEMO_RUN / "measurements.jsonl").read_text().splitlines()[0])
    assert schema.errors("result", rec) == []
    assert schema.errors("result", rec | {"round": 1.0}) == ["round: expected integer, got float 1.0"]


# ---------------------------------------------------------------- every round a run may make counts


def test_confirmation_and_until_rounds_count_against_the_cap(sandbox):
    def many_sweeps(r):
        r["runs"], r["confirm_rounds"] = 100, 100
        r["strategies"] = [{"id": "baseline", "spec_type": "none"}] + [
            {"id": f"s{i}", "spec_type": "ngram-simple", "sweep": {"--spec-ngram-simple-size-n": [2, 3]}}
            for i in range(50)]  # 101 strategies x 8 tasks x 100 runs = 80,800 planned
    m = mf.load(_manifest(sandbox.work / "sweeps", many_sweeps))
    with pytest.raises(KitError) as e:
        pl.make_plan(m, ["local"], shuffle_seed=0)
    one_line(e, "the plan has 80,800 measurements + 80,800 in the confirmation rounds; at most 100,000 in all")
    assert "100,000" in _invoke("validate", "--manifest", str(sandbox.work / "sweeps" / "m.yaml")).stderr
    m = mf.load(DEMO)
    with pytest.raises(KitError) as e:
        pl.make_plan(m, ["local"], shuffle_seed=0, max_rounds=1000)  # --until --max-rounds 1000
    one_line(e, "in rounds --until may add up to round 1000")
    plan = pl.make_plan(m, ["local"], shuffle_seed=0, max_rounds=20)
    assert len(plan.items) == len(plan.cells) * 3
