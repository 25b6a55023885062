"""The run folder, the kit's file format: results/<run-id>/run.json + measurements.jsonl (one JSON object a line).

Every measurement is validated against schemas/result.schema.json, appended, flushed and fsynced before the
next one starts, so an interrupted run loses nothing it finished. A run folder may come from someone else (a
bundle): reading it is bounded and every problem is one line."""

from __future__ import annotations

import copy
import json
import os
import re
import shutil
import stat
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from harness import KitError, schema
from harness import formatter as fm
from harness.files import atomic_write_text
from harness.store import batch_shape, plan_check, result
from harness.store.runmeta import MAX_MEASUREMENTS, RunMeta

RUN_FILE = "run.json"
MEASUREMENTS_FILE = "measurements.jsonl"
#: The sampling study's batches (harness/run/sampling.py), one JSON object a line, beside the measurements.
SAMPLES_FILE = "samples.jsonl"
#: A run writes a few kB per measurement; refuse to start where even this much is not free.
MIN_FREE_BYTES = 16 << 20
MAX_RUN_FILE_BYTES = 16 << 20
MAX_MEASUREMENTS_BYTES = 1 << 30
RUN_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,127}")


def _bound_extra_rounds(obj: object, where: str) -> None:
    """Before the schema reads every cell: a run.json whose added rounds list more cells than a run may measure
    is refused at once (200,000 forged cells would otherwise take seconds at every read)."""
    plan = obj.get("plan") if isinstance(obj, dict) else None
    extra = plan.get("extra_rounds") if isinstance(plan, dict) else None
    if isinstance(extra, list):
        cells = sum(len(x["cells"]) for x in extra if isinstance(x, dict) and isinstance(x.get("cells"), list))
        if cells > MAX_MEASUREMENTS:
            raise KitError(f"{where}: plan.extra_rounds: {fm.count(cells)} cells; a run measures at most "
                           f"{fm.count(MAX_MEASUREMENTS)} times in all")


def read_run_json(path: Path) -> Any:
    """A run.json's object, read as every reader of run folders reads it: a regular file of at most
    MAX_RUN_FILE_BYTES, UTF-8 JSON not nested too deeply; anything else is one line naming the file."""
    where = str(path)
    try:
        st = os.stat(path)
        if not stat.S_ISREG(st.st_mode):
            raise KitError(f"{where}: not a regular file")
        if st.st_size > MAX_RUN_FILE_BYTES:
            raise KitError(f"{where}: larger than {MAX_RUN_FILE_BYTES >> 20} MB; not a run.json")
        return json.loads(Path(path).read_text(encoding="utf-8"))
    except json.JSONDecodeError as e:
        raise KitError(f"{where}: not valid JSON (line {e.lineno}: {e.msg})") from None
    except UnicodeDecodeError:
        raise KitError(f"{where}: not UTF-8 text") from None
    except OSError as e:
        raise KitError(f"{where}: cannot read: {e.strerror or e}") from None
    except RecursionError:
        raise KitError(f"{where}: nested too deeply") from None


def _read_record(kind: str, rec: Any, where: str) -> dict[str, Any]:
    """One line's record in the current format of schema `kind`; a sampling batch whose samples already fit the
    schema (harness/store/batch_shape.py) has the rest of it checked by the schema, at a fraction of the cost."""
    if (kind == "samples" and isinstance(rec, dict) and rec.get("format_version") == schema.FORMAT_VERSIONS[kind]
            and batch_shape.samples_fit(rec.get("samples"))):
        schema.check(kind, {**rec, "samples": []}, where)
        return rec
    return schema.read(kind, rec, where)


def new_run_id(manifest_name: str) -> str:
    return f"{manifest_name}-{datetime.now(UTC).strftime('%Y%m%d-%H%M%S')}"


class RunDir:
    """One run's folder. Long by design: creating, run.json and measurements.jsonl, each a few short methods."""

    def __init__(self, path: Path):
        self.path = Path(path)
        #: Set by measurements() when the last line was cut short (a crash mid-write): that measurement is lost.
        self.torn_last_line = False
        #: Set by samples() when samples.jsonl's last line was cut short: that batch is lost.
        self.torn_samples_line = False
        #: run.json as last read and checked, with the file's identity then (read again only when it changed)
        self._meta: tuple[tuple[int, int, int, int], RunMeta] | None = None

    @property
    def run_file(self) -> Path:
        return self.path / RUN_FILE

    @property
    def measurements_file(self) -> Path:
        return self.path / MEASUREMENTS_FILE

    @property
    def samples_file(self) -> Path:
        return self.path / SAMPLES_FILE

    @property
    def run_id(self) -> str:
        return self.path.name

    # -- creating
    @classmethod
    def create(cls, results_dir: Path, run_id: str) -> RunDir:
        if not RUN_ID.fullmatch(run_id):
            raise KitError(f"run id {run_id!r}: use letters, digits, '.', '_' and '-' (at most 128)")
        results_dir = Path(results_dir)
        try:
            results_dir.mkdir(parents=True, exist_ok=True)
            write_test = results_dir / f".write-test-{os.getpid()}"
            write_test.write_text("ok")
            write_test.unlink()
        except OSError as e:
            raise KitError(f"results folder {results_dir} is not writable: {e.strerror or e}") from None
        free = shutil.disk_usage(results_dir).free
        if free < MIN_FREE_BYTES:
            raise KitError(f"results folder {results_dir} has {fm.num(free / 1024, 0)} kB free; a run needs at least "
                           f"{MIN_FREE_BYTES >> 20} MB: free some space or pass --results elsewhere")
        path = results_dir / run_id
        if path.exists():
            raise KitError(f"{path} exists already; resume it with `invoke run --resume {run_id}` or pick another id")
        path.mkdir()
        return cls(path)

    @classmethod
    def open(cls, path: Path) -> RunDir:
        """An existing run folder, or one line saying why it is not one."""
        path = Path(path)
        if not path.is_dir():
            raise KitError(f"{path}: no such run folder")
        if not (path / RUN_FILE).is_file():
            raise KitError(f"{path}: not a run folder (no {RUN_FILE})")
        return cls(path)

    # -- run.json
    def write_meta(self, meta: RunMeta) -> None:
        obj = meta.to_json()
        schema.check("run", obj, str(self.run_file))
        atomic_write_text(self.run_file, json.dumps(obj, indent=2, ensure_ascii=False) + "\n")

    def read_meta(self) -> RunMeta:
        """run.json, schema-checked and checked against what the kit's plans are (harness/store/plan_check.py).
        Read once: later calls get a copy of what was read, until the file changes."""
        where = str(self.run_file)
        try:
            st = os.stat(self.run_file)
        except OSError as e:
            raise KitError(f"{where}: cannot read: {e.strerror or e}") from None
        key = (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns)
        if self._meta is not None and self._meta[0] == key:
            return copy.deepcopy(self._meta[1])  # callers may change theirs before writing it
        obj = read_run_json(self.run_file)
        _bound_extra_rounds(obj, where)
        meta = RunMeta.from_json(obj, where)
        plan_check.check_plan(meta, where)
        self._meta = (key, meta)
        return copy.deepcopy(meta)

    def update_meta(self, **changes: Any) -> RunMeta:
        meta = self.read_meta()
        for k, v in changes.items():
            setattr(meta, k, v)
        meta.updated_at = datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
        self.write_meta(meta)
        return meta

    # -- measurements.jsonl
    def append(self, record: result.ResultRecord) -> None:
        """Validate one measurement and append it durably."""
        schema.check("result", record, f"{self.measurements_file} (new record {record.get('measurement_id')})")
        self._append(self.measurements_file, record)

    def append_samples(self, record: result.BatchRecord) -> None:
        """Validate one batch of the sampling study and append it durably."""
        schema.check("samples", record, f"{self.samples_file} (new record {record.get('batch_id')})")
        self._append(self.samples_file, record)

    def samples(self) -> list[result.BatchRecord]:
        """The sampling study's batch records (none: []); a torn last line is skipped and noted in
        `torn_samples_line`, any other bad line is an error naming it, as for the measurements."""
        records, numbers, self.torn_samples_line = self._read_lines(self.samples_file, "samples")
        if records:
            self._check_study(records, numbers)
        return records

    def _check_study(self, records: list[result.BatchRecord], line_numbers: list[int]) -> None:
        """Every batch is of the study the run planned (an arm with its strategy and role, a prompt, a host): a
        record of anything else is one line naming it, never counted as samples."""
        meta = self.read_meta()
        study = meta.plan.distribution
        if not study:
            raise KitError(f"{self.samples_file}: the run planned no sampling study (run.json: plan.distribution)")
        arms = {a.id: (a.strategy, a.role) for a in study.arms}
        prompts = set(study.settings.prompts)
        for rec, n in zip(records, line_numbers, strict=False):
            wrong = ("arm", rec["arm"], sorted(arms)) if rec["arm"] not in arms else \
                ("strategy and role", (rec["strategy"], rec["role"]), [arms[rec["arm"]]]) \
                if (rec["strategy"], rec["role"]) != arms[rec["arm"]] else \
                ("prompt", f"{rec['task']}/{rec['prompt']}", sorted("/".join(x) for x in prompts)) \
                if (rec["task"], rec["prompt"]) not in prompts else \
                ("host", rec["host"], meta.plan.hosts) if rec["host"] not in meta.plan.hosts else None
            if wrong:
                raise KitError(f"{self.samples_file}: line {n}: {wrong[0]} {wrong[1]!r} is not one the run planned "
                               f"(run.json: {', '.join(map(str, wrong[2]))[:300]}); this record is not of this run")
        # batch ids, rounds, seeds and settings against the study's plan (harness/store/plan_check.py)
        plan_check.check_samples(meta, zip(line_numbers, records, strict=True), str(self.samples_file))

    def _append(self, path: Path, record: result.ResultRecord | result.BatchRecord) -> None:
        line = json.dumps(record, ensure_ascii=False, separators=(",", ":")) + "\n"
        try:
            # O_NOFOLLOW: a link planted in a run folder from elsewhere is never written through
            fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_NOFOLLOW, 0o644)
        except OSError as e:
            raise KitError(f"{path}: cannot append: {e.strerror or e}") from None
        with os.fdopen(fd, "a", encoding="utf-8") as f:
            f.write(line)
            f.flush()
            os.fsync(f.fileno())

    def _read_lines(self, f: Path, kind: str) -> tuple[list[dict[str, Any]], list[int], bool]:
        """The records of a JSON-lines file of the run folder, each read in the current format of schema `kind`,
        their line numbers, and whether a torn last line (a crash mid-write) was skipped."""
        if not f.exists():
            return [], [], False
        if not f.is_file():  # a FIFO or /dev/zero would be read forever
            raise KitError(f"{f}: not a regular file")
        if f.stat().st_size > MAX_MEASUREMENTS_BYTES:
            raise KitError(f"{f}: larger than {MAX_MEASUREMENTS_BYTES >> 30} GB")
        try:
            lines = f.read_text(encoding="utf-8").split("\n")
        except UnicodeDecodeError as e:
            raise KitError(f"{f}: not UTF-8 text (byte {e.start})") from None
        records, numbers, torn = [], [], False
        last = max((i for i, ln in enumerate(lines) if ln.strip()), default=-1)
        for i, line in enumerate(lines):
            if not line.strip():
                continue
            try:
                rec = json.loads(line)
            except (json.JSONDecodeError, RecursionError) as e:
                if i == last and not lines[i].endswith("}"):
                    torn = True
                    continue
                raise KitError(f"{f}: line {i + 1}: not valid JSON ({getattr(e, 'msg', 'nested too deeply')})") \
                    from None
            records.append(_read_record(kind, rec, f"{f}: line {i + 1}"))
            numbers.append(i + 1)
        return records, numbers, torn

    def measurements(self) -> list[result.ResultRecord]:
        """All records in the current format; a torn last line (a crash mid-write) is skipped and noted in
        `torn_last_line`, any other bad line is an error naming it."""
        records, numbers, self.torn_last_line = self._read_lines(self.measurements_file, "result")
        self._check_planned(records, numbers)
        return records

    def _check_planned(self, records: list[result.ResultRecord], line_numbers: list[int]) -> None:
        """Every record is of a cell the run planned (strategy with its spec type, task, prompt, host): a record of
        anything else (a forged or misplaced line) is one line, never counted as a measurement."""
        if not records or not self.run_file.is_file():
            return
        meta = self.read_meta()
        spec = {s.id: s.spec_type for s in meta.strategies if s.id in meta.plan.strategies}
        prompts = {t.id: {p.id for p in t.prompts} for t in meta.tasks if t.id in meta.plan.tasks}
        for rec, n in zip(records, line_numbers, strict=False):
            where = f"{self.measurements_file}: line {n}"
            wrong = ("strategy", rec["strategy"], sorted(spec)) if rec["strategy"] not in spec else \
                ("task", rec["task"], sorted(prompts)) if rec["task"] not in prompts else \
                ("host", rec["host"], meta.plan.hosts) if rec["host"] not in meta.plan.hosts else \
                ("prompt", rec["prompt"], sorted(prompts[rec["task"]])) \
                if rec.get("prompt") is not None and rec["prompt"] not in prompts[rec["task"]] else None
            if wrong:
                raise KitError(f"{where}: {wrong[0]} {wrong[1]!r} is not one the run planned (run.json: "
                               f"{', '.join(map(str, wrong[2]))[:300]}); this record is not of this run")
            if rec["spec_type"] != spec[rec["strategy"]]:
                raise KitError(f"{where}: strategy {rec['strategy']!r} has spec type {rec['spec_type']!r} here and "
                               f"{spec[rec['strategy']]!r} in run.json; this record is not of this run")
        # rounds, retakes, ids and stream counts against the plan (harness/store/plan_check.py)
        plan_check.check_records(meta, zip(line_numbers, records, strict=True), str(self.measurements_file))

    def done_ids(self) -> set[str]:
        return {r["measurement_id"] for r in self.measurements()}
