"""Hostile inputs for every surface of the `pipesched` command, and the check of the error
contract on each.

A case is a command line and the input files it reads (each under 1 MB): schedule files in
grid text, PyTorch CSV and JSON, stage-cost CSV, model files (config.json and YAML), cluster
YAML, and numeric flags. The strategies start from valid inputs and break them the way
people and programs do: huge, negative, non-finite and 5,000-digit numbers, wrong types,
missing and repeated fields, truncated text, deep nesting, YAML alias bombs, rows of
megabytes.

The contract (``problems``): the command ends within the time limit and the memory limit
(1 GiB of address space), with exit status 0, 1 or 2, no traceback, and on status 2 one line
``pipesched: error: ...`` on stderr; its input files are untouched; a command that fails
leaves no output file, and no command leaves a temporary file.

Cases run in batches inside one driver process (``fuzz_driver.py``) or one process each
(``run_alone``), both under ``resource.setrlimit``.
"""

from __future__ import annotations

import base64
import json
import os
import re
import resource
import shlex
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from functools import cache
from pathlib import Path

import yaml
from hypothesis import strategies as st

DRIVER = Path(__file__).resolve().parent / "fuzz_driver.py"
MEMORY_LIMIT_BYTES = 2**30  # address space of a case's process: the 1 GiB promise
TIMEOUT_S = 20.0  # seconds a case may take (the inputs are small; real work takes < 5 s)

# --- the values people and programs write ------------------------------------------------------
HOSTILE_NUMBERS = (
    "0", "-1", "-0", "1", "2", "3", "7", "64", "1024", "1025", "8193", "16385", "65536", "100000",
    "2147483648", "99999999999", "99999999999999999999", "1" + "0" * 320, "9" * 4301, "9" * 5000,
    "1e9", "1e400", "-1e400", "1e-400", "1.5", "-2.5", "0.0", "nan", "NaN", "inf", "-inf", "Infinity",
    "-Infinity", "0x10", "1_000", "1e", "--1", "", " ", "abc", "null", "true", "[1]", "{}", "1,2",
)
HOSTILE_VALUES = (
    None, True, False, 0, -1, 1, 2, 10**20, 10**320, -(10**30), 1e300, -1e-300, float("nan"), float("inf"),
    "", "abc", "1e400", "9" * 500, "x" * 5000, [], [1], [1, 2], {}, {"a": 1}, [[[[]]]], "h100", "tiny",
)
PRESET_DEVICES = ("h100-sxm", "a100-80gb", "h200", "cpu", "cpu", "h100")
FAMILY_NAMES = ("gpipe", "1f1b", "interleaved-1f1b", "zb-h1", "zb-v", "chimera", "hanayo", "dualpipev")
_NUMBER = re.compile(r"-?\d+(?:\.\d+)?(?:[eE][+-]?\d+)?")


@dataclass(frozen=True)
class Case:
    """A command line and the files it reads (name -> bytes) in its working folder."""

    argv: tuple[str, ...]
    files: dict[str, bytes] = field(default_factory=dict, hash=False)
    surface: str = "flags"  # the input surface the case attacks

    def describe(self) -> str:
        sizes = ", ".join(f"{name} ({len(data):,} bytes)" for name, data in self.files.items())
        return f"pipesched {shlex.join(self.argv)}" + (f"  [{sizes}]" if sizes else "")

    def to_json(self) -> dict:
        return {"argv": list(self.argv), "files": {n: base64.b64encode(d).decode("ascii") for n, d in self.files.items()}}


# --- text mutations -----------------------------------------------------------------------------
def hostile_numbers() -> st.SearchStrategy[str]:
    return st.one_of(st.sampled_from(HOSTILE_NUMBERS), st.integers(-(10**6), 10**9).map(str))


def hostile_values() -> st.SearchStrategy[object]:
    return st.one_of(st.sampled_from(HOSTILE_VALUES), st.integers(), st.floats(), st.text(max_size=20),
                     st.lists(st.integers(-3, 3), max_size=3))


def _flag(draw, good: tuple[str, ...]) -> str:
    """A flag's value: one of ``good`` three times in four, else a hostile number."""
    return draw(hostile_numbers()) if draw(st.integers(0, 3)) == 0 else draw(st.sampled_from(good))


@st.composite
def mutated(draw, text: str) -> str:
    """``text`` with a few of the usual breakages (or none)."""
    for _ in range(draw(st.sampled_from((0, 0, 1, 1, 2, 3)))):
        kind = draw(st.sampled_from(("number", "number", "number", "truncate", "delete_line", "repeat_line",
                                     "junk", "long_word", "swap_lines")))
        lines = text.splitlines(keepends=True)
        if kind == "number":
            spots = list(_NUMBER.finditer(text))
            if spots:
                spot = draw(st.sampled_from(spots))
                text = text[: spot.start()] + draw(hostile_numbers()) + text[spot.end():]
        elif kind == "truncate" and text:
            text = text[: draw(st.integers(0, len(text) - 1))]
        elif kind == "delete_line" and lines:
            del lines[draw(st.integers(0, len(lines) - 1))]
            text = "".join(lines)
        elif kind == "repeat_line" and lines:
            at = draw(st.integers(0, len(lines) - 1))
            text = "".join(lines[: at + 1] + [lines[at] if lines[at].endswith("\n") else lines[at] + "\n"]
                           * draw(st.sampled_from((1, 2, 1500, 20000))) + lines[at + 1:])
        elif kind == "junk":
            at = draw(st.integers(0, len(text)))
            text = text[:at] + draw(st.text(max_size=12)) + text[at:]
        elif kind == "long_word":
            at = draw(st.integers(0, len(text)))
            text = text[:at] + draw(st.sampled_from(("x", "9", "[", "0F", "{", ",", "&a ", "*a"))) * draw(
                st.sampled_from((100, 5000, 200_000))) + text[at:]
        elif kind == "swap_lines" and len(lines) >= 2:
            a, b = draw(st.integers(0, len(lines) - 1)), draw(st.integers(0, len(lines) - 1))
            lines[a], lines[b] = lines[b], lines[a]
            text = "".join(lines)
    return text[:900_000]  # every input stays under 1 MB


def _nested_brackets(depth: int) -> str:
    return "[" * depth + "]" * depth


ALIAS_BOMB = "a: &a [1,1,1,1,1,1,1,1,1]\n" + "".join(
    f"{chr(98 + i)}: &{chr(98 + i)} [{', '.join([f'*{chr(97 + i)}'] * 9)}]\n" for i in range(9))


# --- schedule files -------------------------------------------------------------------------------
@cache
def _schedule_texts() -> dict[str, tuple[str, ...]]:
    """Valid schedule files of a few families and sizes, per format."""
    from pipesched import io
    from pipesched.generators import generate

    texts: dict[str, list[str]] = {"grid": [], "csv": [], "json": []}
    for name, p, m in (("1f1b", 2, 3), ("zb-h1", 3, 4), ("interleaved-1f1b", 2, 4), ("zb-v", 2, 3),
                       ("chimera", 2, 2), ("gpipe", 4, 2), ("dualpipev", 2, 4)):
        schedule = generate(name, p, m)
        for fmt in texts:
            if fmt == "csv" and schedule.placement.num_replicas > 1:
                continue
            texts[fmt].append(io.dumps(schedule, fmt))
    return {fmt: tuple(found) for fmt, found in texts.items()}


@st.composite
def schedule_text(draw, fmt: str) -> str:
    base = draw(st.sampled_from(_schedule_texts()[fmt]))
    extra = draw(st.sampled_from(("", "", "", "header", "op", "nest", "random")))
    if extra == "header" and fmt == "grid":
        key = draw(st.sampled_from(("stages", "microbatches", "placement", "route", "params", "name")))
        base = f"# {key}: {draw(hostile_numbers())}\n" + base
    elif extra == "op":
        token = f"{draw(hostile_numbers())}{draw(st.sampled_from('FIWBX'))}{draw(hostile_numbers())}"
        base = base.replace("0F0", token, 1) if fmt != "json" else base.replace('"0F0"', json.dumps(token), 1)
    elif extra == "nest" and fmt == "json":
        base = base.replace('"params": {', f'"params": {{"x": {_nested_brackets(draw(st.sampled_from((40, 5000, 200_000))))}, ', 1)
    elif extra == "random":
        return draw(st.text(max_size=200))
    return draw(mutated(base))


@st.composite
def schedule_cases(draw) -> Case:
    fmt = draw(st.sampled_from(("grid", "csv", "json")))
    name = {"grid": "sched.txt", "csv": "sched.csv", "json": "sched.json"}[fmt]
    files = {name: draw(schedule_text(fmt)).encode("utf-8", "surrogatepass")}
    command = draw(st.sampled_from(("validate", "validate-json", "validate-memory", "show", "show-out", "simulate")))
    if command == "validate":
        argv = ("validate", name)
    elif command == "validate-json":
        argv = ("validate", name, "--json")
    elif command == "validate-memory":
        argv = ("validate", name, "--activation-limit", draw(hostile_numbers()))
    elif command == "show":
        argv = ("show", name)
    elif command == "show-out":
        out = draw(st.sampled_from(("out.txt", "out.csv", "out.json")))
        argv = ("show", name, "-o", out, "--format", draw(st.sampled_from(("grid", "csv", "json"))))
    else:
        files["costs.csv"] = b"stage,forward,backward_input,backward_weight,activation_bytes,output_bytes\n0,1,1,1,1,1\n"
        argv = ("simulate", name, "--stage-costs", "costs.csv", "--no-timeline", "--json")
    return Case(argv, files, f"schedule file ({fmt})")


# --- stage costs ----------------------------------------------------------------------------------
@st.composite
def stage_cost_cases(draw) -> Case:
    stages = draw(st.sampled_from((1, 2, 2, 3)))
    header = "stage,forward,backward_input,backward_weight,activation_bytes,output_bytes"
    extra = draw(st.sampled_from(("", "", "", ",backward", ",static_bytes,grad_bytes", ",unknown", ",forward")))
    values = {"backward": "0.02", "static_bytes": "1e9", "grad_bytes": "5e8", "unknown": "1", "forward": "0.01"}
    extras = [values[name] for name in extra.split(",")[1:]]
    rows = [",".join([str(s), *(["0.01"] * 3), "2e9", "1.6e7", *extras]) for s in range(stages)]
    text = draw(mutated("\n".join([header + extra, *rows]) + "\n"))
    p, m = _flag(draw, ("2", "4")), _flag(draw, ("4", "8", "16"))
    family = draw(st.sampled_from(FAMILY_NAMES))
    flags: list[str] = []
    for flag, good in (("--latency", ("0", "1e-5")), ("--bandwidth", ("inf", "1e10")), ("-b", ("1", "2")),
                       ("-s", ("128", "4096"))):
        if draw(st.booleans()):
            flags += [flag, _flag(draw, good)]
    if draw(st.integers(0, 4)) == 0:
        argv = ("compare", "--schedules", f"1f1b,{family}", "-p", p, "-m", m, "--stage-costs", "sc.csv", *flags)
    else:
        argv = ("simulate", family, "-p", p, "-m", m, "--stage-costs", "sc.csv", "--no-timeline", *flags)
    return Case(argv, {"sc.csv": text.encode("utf-8", "surrogatepass")}, "stage-cost CSV")


# --- model files ----------------------------------------------------------------------------------
HF_CONFIGS = (
    {"model_type": "llama", "num_hidden_layers": 4, "hidden_size": 256, "num_attention_heads": 8,
     "num_key_value_heads": 2, "intermediate_size": 688, "vocab_size": 1000, "hidden_act": "silu",
     "max_position_embeddings": 2048, "tie_word_embeddings": False, "_name_or_path": "org/small-llama"},
    {"model_type": "gpt2", "n_layer": 4, "n_embd": 128, "n_head": 4, "vocab_size": 500, "n_positions": 256,
     "activation_function": "gelu_new"},
    {"model_type": "mixtral", "num_hidden_layers": 2, "hidden_size": 128, "num_attention_heads": 4,
     "num_key_value_heads": 4, "intermediate_size": 256, "vocab_size": 300, "num_local_experts": 4,
     "num_experts_per_tok": 2, "hidden_act": "silu", "head_dim": 32},
)
MODEL_SHAPE = {"name": "fuzz", "num_layers": 4, "hidden_size": 128, "num_heads": 4, "num_kv_heads": 2,
               "ffn_hidden_size": 344, "vocab_size": 1000, "gated_mlp": True, "head_dim": 0,
               "position_embeddings": 0, "tied_embeddings": False}
LAYER_ROW = {"name": "layer.0", "kind": "t", "forward_s": 0.001, "backward_input_s": 0.001, "backward_weight_s": 0.001,
             "activation_bytes": 1.0e6, "params": 1.0e5, "output_bytes": 1.0e5}


@st.composite
def _broken(draw, document: dict) -> dict:
    """``document`` with a few fields set to hostile values, removed, or added."""
    document = dict(document)
    for _ in range(draw(st.sampled_from((0, 0, 1, 1, 2, 3)))):
        key = draw(st.sampled_from([*document, "unknown_key"]))
        action = draw(st.sampled_from(("value", "value", "drop")))
        if action == "drop":
            document.pop(key, None)
        else:
            document[key] = draw(hostile_values())
    return document


def _dump_json(document: object) -> str:
    try:
        return json.dumps(document, indent=1)
    except ValueError:  # an integer over Python's 4,300 printable digits
        return json.dumps(str(document))


def _dump_yaml(document: object) -> str:
    try:
        return yaml.safe_dump(document, sort_keys=False)
    except (ValueError, yaml.YAMLError):
        return "x: 1\n"


@st.composite
def model_cases(draw) -> Case:
    kind = draw(st.sampled_from(("json", "yaml-shape", "yaml-layers", "yaml-raw", "csv")))
    if kind == "json":
        name, text = "config.json", _dump_json(draw(_broken(draw(st.sampled_from(HF_CONFIGS)))))
        if draw(st.integers(0, 5)) == 0:
            text = text.replace("{", "{\"deep\": " + _nested_brackets(draw(st.sampled_from((40, 100_000)))) + ", ", 1)
    elif kind == "yaml-shape":
        name, text = "model.yaml", _dump_yaml(draw(_broken(MODEL_SHAPE)))
    elif kind == "yaml-layers":
        rows = [dict(LAYER_ROW, name=f"layer.{i}") for i in range(draw(st.integers(1, 3)))]
        rows[0] = draw(_broken(rows[0]))
        name, text = "model.yaml", _dump_yaml({"name": "measured", "layers": rows})
    elif kind == "yaml-raw":
        name, text = "model.yaml", draw(st.sampled_from((ALIAS_BOMB, "a: &a [*a]\n", _nested_brackets(5000),
                                                         "num_layers: 2024-13-45\n", "hidden_size: 1.0e+400\n")))
    else:
        header = "name,forward_s,backward_input_s,backward_weight_s,activation_bytes,params,output_bytes"
        name, text = "layers.csv", header + "\nembedding,0.001,0,0.001,1e6,1e5,1e5\nlayer.0,0.001,0.001,0.001,1e6,1e5,1e5\n"
    text = draw(mutated(text))
    device = draw(st.sampled_from(PRESET_DEVICES))
    command = draw(st.sampled_from(("costs", "costs-json", "partition", "simulate")))
    if command == "costs":
        argv = ("costs", "--model", name, "--device", device)
    elif command == "costs-json":
        argv = ("costs", "--model", name, "--device", device, "--json", "-s", _flag(draw, ("128", "4096")))
    elif command == "partition":
        argv = ("partition", "--model", name, "--device", device, "-p", _flag(draw, ("2", "3")))
    else:
        argv = ("simulate", "1f1b", "-p", "2", "-m", "2", "--model", name, "--cluster", "1x8-h100", "-t", "1",
                "--no-timeline", "--json")
    surface = {"json": "model config.json", "csv": "model layer CSV"}.get(kind, "model YAML")
    return Case(argv, {name: text.encode("utf-8", "surrogatepass")}, surface)


# --- cluster files --------------------------------------------------------------------------------
CLUSTER = {
    "name": "fuzz",
    "nodes": [{"count": 2, "devices_per_node": 4, "device": "h100-sxm"},
              {"devices": ["a100-80gb", {"preset": "h100-sxm", "matmul_efficiency": 0.8},
                           {"name": "my-gpu", "peak_flops": "500 TFLOP/s", "memory": "96 GiB", "memory_bandwidth": "4 TB/s"}]}],
    "intra_node": {"bandwidth": "450 GB/s", "latency": "3 us"},
    "inter_node": {"bandwidth": "400 Gb/s", "latency": "5 us"},
    "nic_per_device": True,
}


@st.composite
def cluster_cases(draw) -> Case:
    document = json.loads(json.dumps(CLUSTER))
    where = draw(st.sampled_from(("top", "group", "device", "link")))
    if where == "top":
        document = draw(_broken(document))
    elif where == "group":
        document["nodes"][0] = draw(_broken(document["nodes"][0]))
    elif where == "device":
        document["nodes"][1]["devices"][2] = draw(_broken(document["nodes"][1]["devices"][2]))
    else:
        document["intra_node"] = draw(_broken(document["intra_node"]))
    text = draw(mutated(_dump_yaml(document)))
    if draw(st.integers(0, 6)) == 0:
        text = ALIAS_BOMB + text
    p = _flag(draw, ("2", "4", "11"))
    if draw(st.booleans()):
        argv = ("simulate", "1f1b", "-p", p, "-m", "4", "--model", "tiny", "--cluster", "c.yaml", "-t", "1",
                "--no-timeline", "--json")
    else:
        argv = ("partition", "--model", "tiny", "--cluster", "c.yaml", "-p", p)
    return Case(argv, {"c.yaml": text.encode("utf-8", "surrogatepass")}, "cluster YAML")


# --- numeric flags --------------------------------------------------------------------------------
# values every real-run command refuses before it starts a rank (so no case runs for real)
_REFUSED_BEFORE_LAUNCH = ("0", "-1", "99999999999", "1e9", "abc", "nan", "9" * 5000)


@st.composite
def flag_cases(draw) -> Case:
    command = draw(st.sampled_from(("show", "simulate", "compare", "costs", "partition", "list", "run", "profile",
                                    "check", "show-set")))
    family = draw(st.sampled_from(FAMILY_NAMES))
    p, m, v = _flag(draw, ("2", "4", "8")), _flag(draw, ("2", "4", "8", "16")), _flag(draw, ("2", "3"))
    if command == "show":
        argv = ["show", family, "-p", p, "-m", m] + (["-v", v] if draw(st.booleans()) else [])
    elif command == "show-set":
        argv = ["show", draw(st.sampled_from(("zb-h1", "zb-v", "zb-h2", "hanayo"))), "-p", p, "-m", m, "--set",
                f"{draw(st.sampled_from(('activation_limit', 'costs', 'waves', 'x')))}={draw(hostile_numbers())}"]
    elif command == "simulate":
        argv = ["simulate", family, "-p", p, "-m", m, "--no-timeline", "--json", "-b", _flag(draw, ("1", "2")),
                "-s", _flag(draw, ("512", "4096")), "-t", _flag(draw, ("1", "2", "4"))]
    elif command == "compare":
        argv = ["compare", "--schedules", f"1f1b,{family}", "-p", p, "-m", m, "--levels",
                draw(st.sampled_from(("formula,table", "formula,table,sim", "sim", "x")))]
    elif command == "costs":
        argv = ["costs", "--model", draw(st.sampled_from(("tiny", "llama3-8b", "gpt3-1.3b"))), "--device", "h100-sxm",
                "-b", _flag(draw, ("1", "2")), "-s", _flag(draw, ("128", "2048")), "-t", _flag(draw, ("1", "2")),
                "--matmul-efficiency", _flag(draw, ("0.5", "1"))]
    elif command == "partition":
        argv = ["partition", "--model", "llama3-8b", "--device", "h100-sxm", "-p", p,
                "-v", v, "--memory-limit", _flag(draw, ("40GiB", "80GiB"))]
        if draw(st.booleans()):
            argv += ["--partition", draw(st.sampled_from(("Et*15|t*17L", "t*99999999999", "(t|)*99999999999",
                                                            "(tt|)*" + "9" * 5000, "E|" * 9000, "Et*3|(tt|)*29,m|L")))]
    elif command == "list":
        argv = ["list", draw(st.sampled_from(("families", "models", "devices", "clusters", "model", "x" * 300))),
                *(["--json"] if draw(st.booleans()) else [])]
    else:
        flag = draw(st.sampled_from({"run": ("-b", "-s", "--steps", "--warmup", "--timeout"),
                                     "profile": ("-b", "-s", "--repeats", "--ranks"),
                                     "check": ("-b", "-s", "--steps", "--timeout")}[command]))
        # 0 warm-up steps is a fine value: every other one is refused
        refused = draw(st.sampled_from([value for value in _REFUSED_BEFORE_LAUNCH if value != "0" or flag != "--warmup"]))
        if command == "run":
            argv = ["run", "1f1b", "-p", "2", "-m", "2", "--model", "tiny", flag, refused]
        elif command == "profile":
            argv = ["profile", "--model", "tiny", "-o", "prof.csv", "--no-link", flag, refused]
        else:
            argv = ["check", "--schedules", "1f1b", "-p", "2", "-m", "2", "--model", "tiny", flag, refused]
    return Case(tuple(argv), {}, f"flags ({command.split('-')[0]})")


def cases() -> st.SearchStrategy[Case]:
    """A case of any surface."""
    return st.one_of(schedule_cases(), stage_cost_cases(), model_cases(), cluster_cases(), flag_cases())


# --- the contract ---------------------------------------------------------------------------------
def problems(case: Case, outcome: dict) -> list[str]:
    """How ``outcome`` (of ``case``) breaks the error contract; empty when it holds."""
    found = []
    if outcome.get("timeout"):
        found.append("no answer within the time limit")
    if outcome.get("memory"):
        found.append("ran out of its 1 GiB of memory")
    if outcome.get("crashed"):
        found.append(f"the process died ({outcome['crashed']})")
    if outcome.get("raised"):
        found.append("raised: " + outcome["raised"].strip().splitlines()[-1])
    code = outcome.get("code")
    if code not in (0, 1, 2) and not found:
        found.append(f"exit status {code}")
    err = outcome.get("err", "")
    if "Traceback" in err or "Traceback" in outcome.get("out", ""):
        found.append("printed a traceback")
    if code == 2 and (outcome.get("err_lines") != 1 or not err.startswith("pipesched: error: ")):
        found.append(f"status 2 without exactly one error line: {err[:200]!r}")
    if not outcome.get("inputs_intact", True):
        found.append("changed its input files")
    made = sorted(set(outcome.get("files", ())) - set(case.files))
    if code not in (0, None) and made:
        found.append(f"failed but left files: {made}")
    if any(name.endswith(".tmp") or "/." in f"/{name}" for name in made):
        found.append(f"left temporary files: {made}")
    return found


def _limit_memory() -> None:
    resource.setrlimit(resource.RLIMIT_AS, (MEMORY_LIMIT_BYTES, MEMORY_LIMIT_BYTES))


def _environment() -> dict[str, str]:
    # one thread per math library: each thread reserves address space (not memory) that
    # would count against the address-space limit
    env = dict(os.environ, OMP_NUM_THREADS="1", OPENBLAS_NUM_THREADS="1", NUMBA_NUM_THREADS="1",
               MALLOC_ARENA_MAX="2", COLUMNS="120")
    if env.get("PYTHONPATH"):  # the cases run in other folders
        env["PYTHONPATH"] = os.pathsep.join(str(Path(entry).resolve()) for entry in env["PYTHONPATH"].split(os.pathsep))
    return env


def run_cases(batch: list[Case], *, timeout_s: float = TIMEOUT_S) -> list[dict]:
    """The outcome of every case, run in driver processes under the memory limit; a driver
    that dies or stops answering marks its current case and a new one takes the rest."""
    outcomes: list[dict | None] = [None] * len(batch)
    start = 0
    while start < len(batch):
        with tempfile.TemporaryDirectory(prefix="pipesched-fuzz-batch-") as work:
            cases_path, results_path = Path(work) / "cases.json", Path(work) / "results.jsonl"
            cases_path.write_text(json.dumps([case.to_json() for case in batch[start:]]), encoding="utf-8")
            results_path.touch()
            with open(Path(work) / "driver.err", "wb") as driver_err:
                driver = subprocess.Popen([sys.executable, str(DRIVER), str(cases_path), str(results_path),
                                           str(timeout_s)], stdout=subprocess.DEVNULL, stderr=driver_err,
                                          env=_environment(), preexec_fn=_limit_memory)
            current, heard, seen = None, time.monotonic(), 0
            while True:
                exited = driver.poll() is not None  # before reading: then every line it wrote is there
                lines = results_path.read_text(encoding="utf-8").split("\n")[:-1]  # whole lines only
                for line in lines[seen:]:
                    record = json.loads(line)
                    heard = time.monotonic()
                    if "started" in record:
                        current = start + record["started"]
                    else:
                        outcomes[start + record.pop("index")] = record
                        current = None
                seen = len(lines)
                if exited:
                    break
                if time.monotonic() - heard > timeout_s + 30:  # the alarm could not stop it
                    driver.kill()
                    driver.wait()
                    if current is not None:
                        outcomes[current] = {"timeout": True, "code": None}
                    break
                time.sleep(0.05)
            if current is not None and outcomes[current] is None:
                detail = (Path(work) / "driver.err").read_text(encoding="utf-8", errors="replace")[-300:]
                outcomes[current] = {"crashed": f"status {driver.returncode}: {detail}", "code": driver.returncode}
            done = [i for i in range(start, len(batch)) if outcomes[i] is not None]
            start = (max(done) + 1) if done else len(batch)
    return [outcome or {"crashed": "never ran"} for outcome in outcomes]


def run_alone(case: Case, *, timeout_s: float = TIMEOUT_S) -> dict:
    """The outcome of one case as its own `python -m pipesched` process under the limits."""
    with tempfile.TemporaryDirectory(prefix="pipesched-fuzz-") as work:
        folder = Path(work)
        for name, data in case.files.items():
            (folder / name).write_bytes(data)
        outcome: dict = {}
        try:
            proc = subprocess.run([sys.executable, "-m", "pipesched", *case.argv], cwd=folder, capture_output=True,
                                  timeout=timeout_s, env=_environment(), preexec_fn=_limit_memory)
        except subprocess.TimeoutExpired:
            return {"timeout": True, "code": None}
        err = proc.stderr.decode("utf-8", "replace")
        outcome.update(code=proc.returncode, err=err[:3000], err_lines=len(err.splitlines()),
                       out=proc.stdout.decode("utf-8", "replace")[:2000])
        if proc.returncode < 0:
            outcome["crashed"] = f"signal {-proc.returncode}"
        if "MemoryError" in err:
            outcome["memory"] = True
        outcome["files"] = sorted(str(p.relative_to(folder)) for p in folder.rglob("*") if p.is_file())
        outcome["inputs_intact"] = all((folder / name).is_file() and (folder / name).read_bytes() == data
                                       for name, data in case.files.items())
        return outcome
