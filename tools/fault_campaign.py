"""Issue 44's fault and bad-input campaign, run again as a user meets it: each case is a `templm` command in a fresh
process (real signals, a real full disk on a small tmpfs, files written in the shapes that broke the verbs), checked
against the contract docs/failures.md states: the exit status, one line naming the cause and no traceback, and what
is on disk afterwards. The suite checks each class in-process (tests/test_fault_matrix.py and the tests it names);
this tool is the user's side of it, a case per defect the campaign found, with variants (other verbs, moments,
values). It prints a Markdown table and writes OUT/campaign.json; exit 1 when any case breaks its contract.

    python tools/fault_campaign.py --out /tmp/campaign [--only resume,signals] \\
        [--txl_runs RUN/seed_S/stream_experiment] [--page docs/failures.md]

--page writes the table into the page between its marker lines (docs/failures.md, "The fault campaign, rerun");
--rendered writes it from OUT/campaign.json without running anything.

--txl_runs: a smoke-preset study's stream_experiment folder (its time_stratified and control runs), for the stream
signal cases at the size where the segmentation fault showed (10 signals during dynamic evaluation, 2 Ctrl-C);
without it those cases are skipped. The full-disk cases mount a tmpfs and need root; without it they are skipped.
"""

from __future__ import annotations

import argparse
import gzip
import hashlib
import json
import os
import pickle
import shutil
import signal
import subprocess
import sys
import time
from typing import Callable, Dict, List, Optional, Sequence

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
WORLD = ("--start_year=2015", "--end_year=2017", "--subjects_per_relation=4", "--docs_per_month=6")
TASKS = ("--vocab_size=200", "--future_years=1", "--gin.WorldConfig.start_year=2015", "--gin.WorldConfig.end_year=2016",
         "--gin.WorldConfig.subjects_per_relation=4", "--gin.WorldConfig.docs_per_month=3")
T5 = ("--gin_file=gin_configs/temporal.gin", "--gin_file=gin_configs/runs/cpu_demo.gin",
      "--gin.TASK_FEATURE_LENGTHS={'inputs': 32, 'targets': 8}", "--gin.BATCH_SIZE=8", "--gin.EVAL_PERIOD=0")
IS_EVAL = ("--seed=1", "--ks=1,4", "--temperatures=0.5", "--repeats=2", "--num_docs=3", "--doc_length=8")
ONE_VARIANT = "--gin.templm.DynamicEvalConfig.variants=[{'name': 'dynamic', 'rule': 'sgd', 'which': 'all', " \
              "'lr': 0.03, 'lrs': [0.01, 0.03]}]"
CRASH = ("Traceback", "Fatal Python error", "Segmentation fault", "core dumped", "terminate called")


class Run:
    """One finished `templm` process: status, output, seconds, its peak memory (MiB)."""

    def __init__(self, returncode, stdout, stderr, seconds, peak_mib=None, signalled=None):
        self.returncode, self.stdout, self.stderr, self.seconds = returncode, stdout, stderr, seconds
        self.peak_mib, self.signalled = peak_mib, signalled

    def line(self) -> str:
        """templm's last line on standard error (progress lines aside)."""
        lines = [x for x in self.stderr.strip().splitlines() if x.strip()]
        return lines[-1].strip() if lines else ""

    def clean(self) -> bool:
        return not any(word in self.stderr for word in CRASH)


def templm(args: Sequence[str], cwd: str = REPO, env: Optional[Dict[str, str]] = None, timeout: float = 600,
           stop: Optional[Callable[[str, float], bool]] = None, sig: int = signal.SIGTERM,
           timer: Optional[float] = None) -> Run:
    """`python -m templm.cli ARGS` in a fresh process; `stop(line, seconds)` is asked at each line of standard error
    and when it says so the process gets `sig` (once); with `timer`, it gets `sig` that many seconds after the
    start instead (a process that prints nothing while it starts)."""
    import threading

    start = time.monotonic()
    proc = subprocess.Popen([sys.executable, "-m", "templm.cli", *args], cwd=cwd, text=True,
                            env={**os.environ, **(env or {})}, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    out: List[str] = []
    reader = threading.Thread(target=lambda: out.append(proc.stdout.read()))
    reader.start()
    err, signalled = [], None

    # The process is reaped below with wait4 alone, for its own peak memory (RUSAGE_CHILDREN is the largest of every
    # child so far): Popen.poll and send_signal would reap it first. Until then its pid stays ours (a zombie keeps
    # it), so it is signalled by pid, under the lock the reaping takes, and only while it has not ended (waitid with
    # WNOWAIT leaves it unreaped).
    lock, reaped = threading.Lock(), []

    def signal_it():
        nonlocal signalled
        with lock:
            if not reaped and os.waitid(os.P_PID, proc.pid, os.WEXITED | os.WNOHANG | os.WNOWAIT) is None:
                os.kill(proc.pid, sig)
                signalled = time.monotonic() - start

    if timer is not None:
        clock = threading.Timer(timer, signal_it)
        clock.start()
    for line in proc.stderr:
        err.append(line)
        if stop is not None and signalled is None and stop(line, time.monotonic() - start):
            signal_it()
    deadline = time.monotonic() + timeout
    while True:
        with lock:
            pid, status, usage = os.wait4(proc.pid, os.WNOHANG)
            if pid:
                reaped.append(pid)
                break
        if time.monotonic() > deadline:
            os.kill(proc.pid, signal.SIGKILL)
            raise TimeoutError(f"templm {' '.join(args)}: still running after {timeout} s")
        time.sleep(0.05)
    proc.returncode = os.waitstatus_to_exitcode(status)
    reader.join()
    if timer is not None:
        clock.cancel()
    return Run(proc.returncode, "".join(out), "".join(err), time.monotonic() - start, usage.ru_maxrss / 1024,
               signalled)


def at(text: str, delay: float = 0.0) -> Callable[[str, float], bool]:
    """A stop rule: `delay` seconds after the first line holding `text`."""
    seen: List[float] = []

    def rule(line, t):
        if not seen and text in line:
            seen.append(t)
            if delay:
                time.sleep(delay)
            return True
        return False

    return rule


def digest(path: str) -> Dict[str, str]:
    """{relative path: sha256} of every file under `path` (or of the file)."""
    if os.path.isfile(path):
        with open(path, "rb") as f:
            return {"": hashlib.sha256(f.read()).hexdigest()}
    found = {}
    for folder, _, names in os.walk(path):
        for name in names:
            full = os.path.join(folder, name)
            with open(full, "rb") as f:
                found[os.path.relpath(full, path)] = hashlib.sha256(f.read()).hexdigest()
    return found


class Campaign:
    """The cases, a method for each of the issue's classes: each case runs in a folder of its own under OUT/cases,
    records its row (the checks, the status, the process's last line) and keeps the process's output in OUT/logs."""

    def __init__(self, out: str, txl_runs: Optional[str]):
        self.out, self.txl_runs = os.path.abspath(out), txl_runs
        self.rows: List[Dict[str, object]] = []
        self.inputs = os.path.join(self.out, "inputs")
        self.n = 0

    def fresh(self, name: str) -> str:
        self.n += 1
        path = os.path.join(self.out, "cases", f"{self.n:02d}_{name}")
        shutil.rmtree(path, ignore_errors=True)
        os.makedirs(path)
        return path

    def record(self, group: str, case: str, defect: str, run: Optional[Run], expected: str, checks: Dict[str, bool],
               note: str = "") -> None:
        ok = all(checks.values())
        if run is not None:  # each case's output, for reading afterwards
            logs = os.path.join(self.out, "logs")
            os.makedirs(logs, exist_ok=True)
            with open(os.path.join(logs, f"{len(self.rows) + 1:03d}.txt"), "w") as f:
                f.write(f"{group}: {case}\n--- stdout\n{run.stdout}\n--- stderr\n{run.stderr}")
        row = {"group": group, "case": case, "defect": defect, "expected": expected, "ok": ok,
               "failed_checks": [k for k, v in checks.items() if not v], "note": note}
        if run is not None:
            row.update(returncode=run.returncode, seconds=round(run.seconds, 1), line=run.line()[:300],
                       peak_mib=round(run.peak_mib or 0), signalled_at=run.signalled)
        self.rows.append(row)
        status = "ok" if ok else "BROKEN " + ", ".join(row["failed_checks"])
        said = f"exit {run.returncode} in {run.seconds:.1f}s: {run.line()[:160]}" if run else note
        print(f"[{group}] {case}: {status} ({said})", flush=True)

    def skip(self, group: str, case: str, defect: str, why: str) -> None:
        self.rows.append({"group": group, "case": case, "defect": defect, "ok": None, "note": why})
        print(f"[{group}] {case}: skipped ({why})", flush=True)

    # -- inputs ---------------------------------------------------------------------------------------------------

    def build_inputs(self) -> None:
        i = self.inputs
        if os.path.exists(os.path.join(i, "done")):
            return
        shutil.rmtree(i, ignore_errors=True)
        os.makedirs(i)
        for args, env in ((("data", "world", f"--out={i}/world", *WORLD), None),
                          (("data", "tasks", f"--out={i}/data", *TASKS), None),
                          (("train", *T5, f"--gin.MODEL_DIR='{i}/model'", "--gin.TRAIN_STEPS=4"),
                           {"TEMPLM_DATA_DIR": f"{i}/data"})):
            run = templm(args, env=env)
            if run.returncode:
                raise SystemExit(f"the campaign's inputs: {' '.join(args)} failed:\n{run.stderr[-3000:]}")
        open(os.path.join(i, "done"), "w").close()

    # -- the cases ------------------------------------------------------------------------------------------------

    def resume(self) -> None:
        """Class 1: a run resumed with other settings (the T5 trainer compared only the seed)."""
        data_env = {"TEMPLM_DATA_DIR": f"{self.inputs}/data"}
        variants = [
            ("uniform.gin over a Temporal checkpoint", ("--gin_file=gin_configs/uniform.gin",),
             "mixture_or_task_name", "trained steps 5-8 on the Uniform task, exit 0, config.gin overwritten"),
            ("another batch size", ("--gin_file=gin_configs/temporal.gin", "--gin.BATCH_SIZE=16"), "batch_size",
             "a 52-line TensorFlow traceback"),
            ("another MLP width", ("--gin_file=gin_configs/temporal.gin", "--gin.templm.T5Config.mlp_dim=256"),
             "does not fit", "both intact steps called damaged"),
            ("another learning-rate schedule only", ("--gin_file=gin_configs/temporal.gin",
                                                     "--gin.templm.learning_rate_schedule.base_learning_rate=0.02"),
             None, "(variant: a setting that shapes neither state nor data resumes)"),
        ]
        for case, extra, said, defect in variants:
            model = os.path.join(self.fresh("resume"), "model")
            shutil.copytree(f"{self.inputs}/model", model)
            before = digest(model)
            run = templm(["train", extra[0], *T5[1:], *extra[1:], f"--gin.MODEL_DIR='{model}'",
                          "--gin.TRAIN_STEPS=6"], env=data_env)
            if said is None:
                self.record("resume", case, defect, run, "exit 0, resumed from step 4 to 6",
                            {"exit 0": run.returncode == 0, "clean": run.clean(),
                             "resumed at 4": _train_steps(model) == [6]})
                continue
            self.record("resume", case, defect, run, f"exit 1, one message naming {said!r}, MODEL_DIR unchanged",
                        {"exit 1": run.returncode == 1, "names it": said in run.stderr, "clean": run.clean(),
                         "not 'damaged'": "damaged" not in run.stderr, "unchanged": digest(model) == before})

    def output_folders(self) -> None:
        """Class 2 and 4: verbs writing into a user's folder, '.', over-long names, a file where a folder goes."""
        user = {"is-eval": "is_eval.json", "calm": "results.json", "appendices": "results.json",
                "stream": "results.json", "reproduce": "results.json", "data world": "world.json"}
        for verb, name in user.items():
            folder = self.fresh("user_folder")
            with open(os.path.join(folder, name), "w") as f:
                f.write('{"mine": true}\n')
            before = digest(folder)
            run = templm(self._writing(verb, folder))
            self.record("output folder", f"{verb} into a user's folder holding {name}",
                        "is-eval, calm and appendices replaced a user's results", run,
                        "refused before any work (exit 1), the file unchanged",
                        {"exit 1": run.returncode == 1, "clean": run.clean(), "unchanged": digest(folder) == before,
                         "quick": run.seconds < 30})
        for verb in ("data world", "data tasks", "is-eval", "appendices", "calm", "stream", "reproduce"):
            cwd = self.fresh("dot")
            with open(os.path.join(cwd, "notes.txt"), "w") as f:
                f.write("a user's file\n")
            run = templm(self._writing(verb, "."), cwd=cwd)
            self.record("output folder", f"{verb} --out .", "data world --out .: the whole world built, the rename "
                        "failed, a .partial left that blocked every rerun", run, "refused before any work, nothing "
                        "left", {"refused": run.returncode in (1, 2), "clean": run.clean(),
                                 "nothing left": sorted(os.listdir(cwd)) == ["notes.txt"],
                                 "quick": run.seconds < 30})
        for verb in ("data world", "is-eval", "calm"):
            cwd = self.fresh("long")
            run = templm(self._writing(verb, "w" * 240), cwd=cwd)
            self.record("output folder", f"{verb} --out of 240 characters", "a 240-character name: the same "
                        "leftover", run, "refused before any work, nothing left",
                        {"refused": run.returncode in (1, 2), "clean": run.clean(), "nothing left": not os.listdir(cwd),
                         "quick": run.seconds < 30})
        for verb in ("is-eval", "stream", "calm", "appendices", "data world", "data tasks"):
            folder = self.fresh("file")
            path = os.path.join(folder, "out")
            with open(path, "w") as f:
                f.write("a user's file\n")
            run = templm(self._writing(verb, path))
            self.record("output folder", f"{verb} with a file where its folder goes", "a file where a folder is "
                        "expected was unclear in is-eval, stream, calm, appendices", run,
                        "refused naming the file, which is unchanged",
                        {"refused": run.returncode in (1, 2), "names it": path in run.stderr, "clean": run.clean(),
                         "unchanged": digest(path) == {"": hashlib.sha256(b"a user's file\n").hexdigest()}})
        for value in ("", "."):
            cwd = self.fresh("empty_out")
            run = templm(["data", "tasks", f"--out={value}", *TASKS], cwd=cwd)
            self.record("output folder", f"data tasks --out '{value}'", "--out '' refused but --out . not", run,
                        "refused before any work", {"refused": run.returncode in (1, 2), "clean": run.clean(),
                                                    "nothing left": not os.listdir(cwd)})

    def _writing(self, verb: str, out: str) -> List[str]:
        """The smallest command of `verb` writing into `out`."""
        txl = "txl_missing"  # the output folder is refused before the runs are read
        return {
            "is-eval": ["is-eval", f"--out={out}", *IS_EVAL],
            "calm": ["calm", "--gin_file=calm/txl_online.gin", f"--gin.OUT_DIR='{out}'"],
            "appendices": ["appendices", f"--out={out}", "--preset=tiny_test", "--shifts=0,1"],
            "stream": ["stream", "--gin_file=txl/dynamic_eval.gin", f"--gin.OUT_DIR='{out}'",
                       f"--gin.TIME_STRATIFIED_DIR='{txl}'", f"--gin.CONTROL_DIR='{txl}'"],
            "reproduce": ["reproduce", "--preset=tiny_test", f"--out={out}"],
            "data world": ["data", "world", f"--out={out}", *WORLD],
            "data tasks": ["data", "tasks", f"--out={out}", *TASKS],
        }[verb]

    def signals(self) -> None:
        """Class 3: SIGTERM at start, during the final evaluation, during the last save; Ctrl-C alike."""
        data_env = {"TEMPLM_DATA_DIR": f"{self.inputs}/data"}
        for sig, status in ((signal.SIGTERM, 75), (signal.SIGINT, 130)):
            for moment in (0.3, 1.0, 2.5):
                model = os.path.join(self.fresh("start"), "model")
                run = templm(["train", *T5, f"--gin.MODEL_DIR='{model}'", "--gin.TRAIN_STEPS=4"], env=data_env,
                             timer=moment, sig=sig)
                self.record("signals", f"{sig.name} {moment}s after train starts", "SIGTERM while a verb starts "
                            "exited 143 without a word", run, f"exit {status}, one line",
                            {f"exit {status}": run.returncode == status, "clean": run.clean(),
                             "one line": "stopped by" in run.line() or "interrupted" in run.line().lower()})
        # The last step's save and evaluation: a run of 4 steps evaluating every validation example at its last.
        evals = ("--gin.EVAL_PERIOD=4", "--gin.train_eval/templm.DatasetConfig.num_examples=None")
        for delay in (0.0, 1.0, 2.5):
            model = os.path.join(self.fresh("final_eval"), "model")
            args = ["train", *T5, f"--gin.MODEL_DIR='{model}'", "--gin.TRAIN_STEPS=4", *evals]
            run = templm(args, env=data_env, stop=at("step 4/4", delay))
            evaluated = _eval_rows(model)
            self.record("signals", f"SIGTERM {delay}s after the last step's line (its save, its evaluation)",
                        "answered only after the evaluation, the rerun exited 0 without evaluating; dropped during "
                        "the last save", run, "exit 75 within seconds, no evaluation reported",
                        {"exit 75": run.returncode == 75, "clean": run.clean(), "signalled": run.signalled is not None,
                         "no result": evaluated == 0 and not run.stdout.strip(),
                         "within 10 s": run.signalled is not None and run.seconds - run.signalled < 10})
            again = templm(args, env=data_env)
            self.record("signals", f"the rerun after SIGTERM {delay}s after the last step's line", "the rerun "
                        "exited 0 without ever evaluating", again, "exit 0, the last step evaluated",
                        {"exit 0": again.returncode == 0, "evaluated": _eval_rows(model) > 0, "clean": again.clean()})
        # SIGTERM at the knowledge-graph LM's last step, its last save (is-eval --model=kglm went on to train the
        # proposal and wrote results 43 s later, exit 0), and midway.
        for text, delay in (("step 400/400", 0.0), ("step 400/400", 0.3), ("step 400/400", 1.0), ("step 200/", 0.0)):
            out = os.path.join(self.fresh("kglm"), "out")
            run = templm(["is-eval", "--model=kglm", f"--out={out}", "--ks=1,2", "--repeats=2"],
                         stop=at(text, delay))
            self.record("signals", f"is-eval --model=kglm: SIGTERM {delay}s after its model's '{text}' line",
                        "dropped during the last save: the proposal trained, results written 43 s later, exit 0", run,
                        "exit 75 within seconds, no results",
                        {"exit 75": run.returncode == 75, "clean": run.clean(), "signalled": run.signalled is not None,
                         "no results": not os.path.exists(os.path.join(out, "is_eval.json")),
                         "within 10 s": run.signalled is not None and run.seconds - run.signalled < 10})
        if not self.txl_runs:
            self.skip("signals", "stream during dynamic evaluation", "exit 139 (segmentation fault) 5 of 5",
                      "no --txl_runs")
            return
        moments = [("time_stratified static:", d) for d in (0.0, 0.3, 0.6, 1.0, 1.5)] + \
                  [("chosen on the validation stream", d) for d in (0.0, 0.3, 0.6, 1.0, 1.5)]
        for sig, status, chosen in [(signal.SIGTERM, 75, m) for m in moments] + \
                                   [(signal.SIGINT, 130, m) for m in moments[2:8:5]]:
            out = os.path.join(self.fresh("stream"), "out")
            run = templm(["stream", "--gin_file=txl/dynamic_eval.gin", f"--gin.OUT_DIR='{out}'",
                          f"--gin.TIME_STRATIFIED_DIR='{self.txl_runs}/time_stratified'",
                          f"--gin.CONTROL_DIR='{self.txl_runs}/control'", ONE_VARIANT],
                         stop=at(chosen[0], chosen[1]), sig=sig)
            self.record("signals", f"stream: {sig.name} {chosen[1]}s after '{chosen[0]}'", "SIGTERM or Ctrl-C "
                        "during dynamic evaluation: the line, then exit 139", run, f"exit {status}, the line last",
                        {f"exit {status}": run.returncode == status, "clean": run.clean(),
                         "line last": run.line().startswith("templm stream: "),
                         "no results": not os.path.exists(os.path.join(out, "results.json"))})

    def commits(self) -> None:
        """Class 4: a rerun with other settings into a finished study, said before it removes anything."""
        out = os.path.join(self.fresh("reproduce"), "out")
        first = templm(["reproduce", "--preset=tiny_test", "--seed=0", f"--out={out}", "--nostreaming"])
        if first.returncode:
            self.record("commit", "a finished tiny study", "", first, "exit 0", {"exit 0": False})
            return
        run = templm(["reproduce", "--preset=tiny_test", "--seed=1", f"--out={out}", "--nostreaming"],
                     stop=at("train uniform and temporal: starting"))
        said = run.stderr.split("train uniform and temporal: starting")[0]
        results = os.path.exists(os.path.join(out, "results.json"))
        models = os.path.isdir(os.path.join(out, "models", "uniform", "checkpoints"))
        self.record("commit", "reproduce --seed 1 into a finished seed-0 folder, stopped at its first training",
                    "the seed-0 models deleted while its results and report stayed", run,
                    "says what it removes before it does; no results describing models that are gone",
                    {"said first": "remov" in said, "exit 75": run.returncode == 75, "clean": run.clean(),
                     "no orphan results": not results or models})

    def untrusted(self) -> None:
        """Class 5: input that would exhaust the machine or crash it."""
        work = self.fresh("untrusted")
        run = templm(["is-eval", f"--out={work}/a", "--ks=9999999999999"])
        self.record("untrusted input", "is-eval --ks 9999999999999", "aborted after 51 s with a C++ stack (134)",
                    run, "exit 1 within seconds naming --ks", {"exit 1": run.returncode == 1, "quick": run.seconds < 30,
                                                               "names it": "--ks" in run.stderr, "clean": run.clean()})
        run = templm(["is-eval", f"--out={work}/b", "--ks=200000000", "--repeats=64", "--num_docs=64"])
        self.record("untrusted input", "is-eval flags each in range, together past the memory", "exhausted memory",
                    run, "exit 1 naming the flags", {"exit 1": run.returncode == 1, "quick": run.seconds < 30,
                                                     "clean": run.clean()})
        hf = os.path.join(work, "hf")
        os.makedirs(hf)
        _write_hf_claiming_layers(hf, 10_000_000)
        run = templm(["train", *T5, f"--gin.MODEL_DIR='{work}/m'", "--gin.TRAIN_STEPS=2",
                      f"--gin.INITIAL_CHECKPOINT_PATH='{hf}'"], env={"TEMPLM_DATA_DIR": f"{self.inputs}/data"})
        self.record("untrusted input", "a Hugging Face config.json claiming 10^7 layers", "memory grew for minutes",
                    run, "exit 1 within seconds naming config.json",
                    {"exit 1": run.returncode == 1, "quick": run.seconds < 60, "names it": "config.json" in run.stderr,
                     "clean": run.clean(), "small": (run.peak_mib or 0) < 4096})
        nested = "[" * 200_000 + "]" * 200_000
        for verb, path, args in (
                ("data templama", f"{work}/dump.json", ["data", "templama", "--norequire_enwiki",
                                                       f"--dump={work}/dump.json", f"--out={work}/tl"]),
                ("data stats --on_error skip", f"{work}/news.jsonl", ["data", "stats", f"--corpus={work}/news.jsonl",
                                                                      "--on_error=skip"]),
                ("infer", f"{work}/queries.jsonl", ["infer", *T5, f"--gin.MODEL_DIR='{self.inputs}/model'",
                                                    f"--input={work}/queries.jsonl", f"--output={work}/p.jsonl"])):
            with open(path, "w") as f:
                f.write(nested + "\n")
            run = templm(args, env={"TEMPLM_DATA_DIR": f"{self.inputs}/data"})
            expected_ok = run.returncode in (0, 1) if "skip" in verb else run.returncode == 1
            self.record("untrusted input", f"{verb} on JSON nested 200,000 deep", "RecursionError tracebacks", run,
                        "one line naming the file (skipped with --on_error skip)",
                        {"status": expected_ok, "clean": run.clean(), "names it": os.path.basename(path) in run.stderr})
        release = os.path.join(work, "release", "data", "wikidata_big")
        os.makedirs(os.path.join(release, "questions"))
        os.makedirs(os.path.join(release, "kg"))
        with open(os.path.join(release, "kg", "wd_id2entity_text.txt"), "w") as f:
            f.write("Q76\tBarack Obama\n")
        cases = {"lists nested 100,000 deep": b"\x80\x03" + b"(" * 100_000 + b"l" * 100_000 + b".",
                 "bytes claiming 4 GiB": b"\x80\x03B\x00\x00\x00\xff" + b"." * 12,
                 "memo index 2^31": b"\x80\x03j\xff\xff\xff\x7f."}
        for name, payload in cases.items():
            for split in ("train", "valid", "test"):
                with open(os.path.join(release, "questions", f"{split}.pickle"), "wb") as f:
                    f.write(payload if split == "train" else pickle.dumps([], protocol=3))
            run = templm(["data", "cronquestions", f"--release={work}/release", f"--out={work}/cq_{len(name)}"])
            self.record("untrusted input", f"a CronQuestions pickle: {name}", "RecursionError / MemoryError "
                        "tracebacks", run, "exit 1 naming train.pickle",
                        {"exit 1": run.returncode == 1, "names it": "train.pickle" in run.stderr, "clean": run.clean(),
                         "small": (run.peak_mib or 0) < 4096})
        bomb = os.path.join(work, "bomb.jsonl.gz")
        with gzip.open(bomb, "wb", compresslevel=9) as f:
            f.write(b'{"date": "2015-01-01", "text": "fine"}\n')
            block = b"x" * (64 << 20)
            for _ in range(48):  # a 3 GiB line
                f.write(block)
            f.write(b"\n")
        run = templm(["data", "stats", f"--corpus={bomb}", "--on_error=skip"])
        self.record("untrusted input", "a gzip bomb: a 3 GiB line in 3 MB", "the line read whole", run,
                    "the line dropped, memory bounded", {"status": run.returncode in (0, 1), "clean": run.clean(),
                                                         "small": (run.peak_mib or 0) < 2048})

    def messages(self) -> None:
        """Class 6 and the full disk: one line naming the file."""
        work = self.fresh("messages")
        data = os.path.join(work, "data")
        shutil.copytree(f"{self.inputs}/data", data)
        record = sorted(n for n in os.listdir(os.path.join(data, "customnews")) if n.startswith("train"))[0]
        path = os.path.join(data, "customnews", record)
        with open(path, "r+b") as f:
            f.seek(40)
            f.write(b"\xff" * 64)
        run = templm(["train", *T5, f"--gin.MODEL_DIR='{work}/m1'", "--gin.TRAIN_STEPS=2"],
                     env={"TEMPLM_DATA_DIR": data})
        self.record("messages", "a damaged record file of the task data", "a traceback", run, "exit 1 naming it",
                    {"exit 1": run.returncode == 1, "names it": record in run.stderr, "clean": run.clean()})
        for what, value in (("a file", f"{self.inputs}/done"), ("a missing folder", f"{work}/nowhere")):
            run = templm(["train", *T5, f"--gin.MODEL_DIR='{work}/m2'", "--gin.TRAIN_STEPS=2"],
                         env={"TEMPLM_DATA_DIR": value})
            self.record("messages", f"TEMPLM_DATA_DIR is {what}", "a traceback", run, "exit 1 naming it",
                        {"exit 1": run.returncode == 1, "names it": "TEMPLM_DATA_DIR" in run.stderr,
                         "clean": run.clean()})
        out = os.path.join(work, "study")  # a study's folder (templm's marker) whose run.json was cut short
        os.makedirs(out)
        with open(os.path.join(out, ".templm.json"), "w") as f:
            f.write('{"kind": "reproduction", "written_by": "templm"}\n')
        with open(os.path.join(out, "run.json"), "w") as f:
            f.write('{"preset": "tiny_test", "seed": 0, ')
        run = templm(["reproduce", "--preset=tiny_test", f"--out={out}"])
        self.record("messages", "a corrupt run.json", "no file named", run, "exit 1 naming run.json, kept",
                    {"exit 1": run.returncode == 1, "names it": "run.json" in run.stderr, "clean": run.clean(),
                     "kept": os.path.exists(os.path.join(out, "run.json"))})
        run = templm(["plan", *T5, "--gin_file=gin_configs/mesh/gpu_8.gin",
                      "--gin.templm.make_mesh.num_partitions=0", "--devices=8"])
        self.record("messages", "plan with num_partitions=0", "ZeroDivisionError", run, "exit 1 naming the binding",
                    {"exit 1": run.returncode == 1, "names it": "num_partitions" in run.stderr, "clean": run.clean()})
        for binding in ("templm.learning_rate_schedule.base_learning_rate=inf",
                        "templm.learning_rate_schedule.base_learning_rate='fast'", "TRAIN_STEPS=2.5"):
            run = templm(["train", *T5, f"--gin.MODEL_DIR='{work}/m3'", f"--gin.{binding}"],
                         env={"TEMPLM_DATA_DIR": f"{self.inputs}/data"})
            self.record("bindings", f"train --gin.{binding}", "passed, or a traceback", run, "exit 1 naming it",
                        {"exit 1": run.returncode == 1, "names it": binding.split("=")[0].split(".")[-1] in run.stderr,
                         "clean": run.clean(), "nothing trained": not os.path.exists(f"{work}/m3/checkpoints")})
        for binding in ("docs_per_month='x'", "docs_per_month=-1", "subjects_per_relation=2.5", "seed=inf"):
            run = templm(["data", "world", f"--out={work}/w", f"--gin.WorldConfig.{binding}"])
            self.record("bindings", f"data world --gin.WorldConfig.{binding}", "passed, or a traceback", run,
                        "refused naming it", {"refused": run.returncode in (1, 2), "clean": run.clean(),
                                              "names it": binding.split("=")[0] in run.stderr,
                                              "nothing left": not os.path.exists(f"{work}/w")})
        self.full_disk()

    def full_disk(self) -> None:
        mount = os.path.join(self.out, "small_disk")
        os.makedirs(mount, exist_ok=True)
        if subprocess.run(["mount", "-t", "tmpfs", "-o", "size=256k", "tmpfs", mount],
                          capture_output=True).returncode:
            self.skip("full disk", "a real full disk", "full disk not named in data world, calm, cronquestions",
                      "cannot mount a tmpfs (not root?)")
            return
        try:
            texts = os.path.join(self.out, "texts")
            os.makedirs(texts, exist_ok=True)
            with open(os.path.join(texts, "a.txt"), "w") as f:
                f.write("the farm sold wheat at the market.\n" * 20_000)  # 700 KB, more than the disk
            release = os.path.join(self.out, "release", "data", "wikidata_big")
            os.makedirs(os.path.join(release, "questions"), exist_ok=True)
            os.makedirs(os.path.join(release, "kg"), exist_ok=True)
            with open(os.path.join(release, "kg", "wd_id2entity_text.txt"), "w") as f:
                f.write("Q76\tBarack Obama\nQ30\tUnited States\n")
            row = {"question": "Who led United States in 2010", "answers": {"Q76"}, "answer_type": "entity",
                   "template": "Who led {tail} in {time}", "entities": {"Q30"}, "times": {2010},
                   "relations": ["P6"], "type": "simple_entity", "annotation": {"tail": "Q30", "time": 2010},
                   "uniq_id": 1, "paraphrases": []}
            for split in ("train", "valid", "test"):
                with open(os.path.join(release, "questions", f"{split}.pickle"), "wb") as f:
                    pickle.dump([dict(row, uniq_id=i) for i in range(3000)], f, protocol=3)
            filler = os.path.join(mount, "earlier")
            with open(filler, "w") as f:
                f.write("an earlier file\n")
            for verb, args in (("data world", ["data", "world", f"--out={mount}/w", *WORLD]),
                               ("data tasks", ["data", "tasks", f"--out={mount}/t", *TASKS]),
                               ("data calm", ["data", "calm", f"--out={mount}/c", f"--texts={texts}", "--level=char"]),
                               ("data cronquestions", ["data", "cronquestions", f"--release={self.out}/release",
                                                       f"--out={mount}/q"])):
                run = templm(args)
                left = sorted(os.listdir(mount))
                self.record("full disk", f"{verb} onto a 256 KiB tmpfs", "the full disk named in data tasks only",
                            run, "exit 4 naming the file, nothing left",
                            {"exit 4": run.returncode == 4, "names a file": mount in run.stderr, "clean": run.clean(),
                             "nothing left": left == ["earlier"]})
                for name in left:
                    if name != "earlier":
                        shutil.rmtree(os.path.join(mount, name), ignore_errors=True)
        finally:
            subprocess.run(["umount", mount], capture_output=True)


def _train_steps(model: str) -> List[int]:
    """The steps of the training rows of metrics.jsonl after the first run's last (step 4)."""
    path = os.path.join(model, "metrics.jsonl")
    if not os.path.exists(path):
        return []
    with open(path) as f:
        return [row["step"] for row in map(json.loads, f) if row.get("split") == "train" and row["step"] > 4]


def _eval_rows(model: str) -> int:
    path = os.path.join(model, "metrics.jsonl")
    if not os.path.exists(path):
        return 0
    with open(path) as f:
        return sum(1 for row in map(json.loads, f) if row.get("split", "").startswith(("train_eval", "validation")))


def _write_hf_claiming_layers(folder: str, layers: int) -> None:
    import numpy as np
    from safetensors.numpy import save_file

    config = {"architectures": ["T5ForConditionalGeneration"], "model_type": "t5", "d_model": 32, "d_kv": 16,
              "d_ff": 64, "num_heads": 2, "num_layers": layers, "num_decoder_layers": 1, "vocab_size": 300,
              "feed_forward_proj": "gated-gelu", "relative_attention_num_buckets": 32,
              "relative_attention_max_distance": 128, "tie_word_embeddings": False}
    with open(os.path.join(folder, "config.json"), "w") as f:
        json.dump(config, f)
    save_file({"shared.weight": np.zeros((300, 32), np.float32)}, os.path.join(folder, "model.safetensors"))


def markdown(rows: List[Dict[str, object]], out: str, txl_runs: Optional[str]) -> str:
    """The cases as a Markdown table, the campaign's folders named OUT and TXL_RUNS."""
    def plain(text: object) -> str:
        text = str(text).replace(out, "OUT")
        return (text.replace(txl_runs, "TXL_RUNS") if txl_runs else text).replace("|", "/")

    lines = ["| group | case | the campaign's defect | contract | seen | |", "|---|---|---|---|---|---|"]
    for r in rows:
        seen = r.get("note", "") if "returncode" not in r else f"exit {r['returncode']}, {r['seconds']} s: {r['line']}"
        verdict = "skipped" if r["ok"] is None else ("ok" if r["ok"] else "**broken**: " + ", ".join(
            r["failed_checks"]))
        lines.append(f"| {r['group']} | {plain(r['case'])} | {r['defect']} | {r.get('expected', '')} | "
                     f"{plain(seen)[:220]} | {verdict} |")
    return "\n".join(lines)


BEGIN = "<!-- fault_campaign: begin (written by tools/fault_campaign.py) -->"
END = "<!-- fault_campaign: end -->"


def write_page(page: str, table: str, rows: List[Dict[str, object]]) -> None:
    """The table between the page's marker lines, with the commit and machine it ran on and its counts."""
    import platform

    from readme_tables import replace_between, settle  # this folder's; a script's folder is on its path

    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, cwd=REPO)
    broken = sum(r["ok"] is False for r in rows)
    head = (f"{len(rows)} cases, {broken} broken, {sum(r['ok'] is None for r in rows)} skipped: "
            f"`python tools/fault_campaign.py --out OUT --txl_runs TXL_RUNS --page docs/failures.md` at "
            f"{commit.stdout.strip() or '?'} on {platform.machine()} {os.cpu_count()} CPU cores, "
            f"{time.strftime('%Y-%m-%d')}.\n\n")
    with open(page, encoding="utf-8") as f:
        text = f.read()
    settle(page, text, replace_between(text, BEGIN, END, head + table), False, "", "the campaign's table")


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", required=True)
    parser.add_argument("--only", default="resume,output,signals,commit,untrusted,messages")
    parser.add_argument("--txl_runs", default=None)
    parser.add_argument("--page", default=None, help="a page with the marker lines to write the table into "
                                                     "(docs/failures.md)")
    parser.add_argument("--rendered", action="store_true", help="run nothing: the table of OUT/campaign.json")
    args = parser.parse_args(argv)
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    campaign = Campaign(args.out, args.txl_runs)
    if args.rendered:
        with open(os.path.join(campaign.out, "campaign.json")) as f:
            campaign.rows = json.load(f)
    else:
        campaign.build_inputs()
        groups = {"resume": campaign.resume, "output": campaign.output_folders, "signals": campaign.signals,
                  "commit": campaign.commits, "untrusted": campaign.untrusted, "messages": campaign.messages}
        for name in args.only.split(","):
            groups[name]()
        with open(os.path.join(campaign.out, "campaign.json"), "w") as f:
            json.dump(campaign.rows, f, indent=1)
    table = markdown(campaign.rows, campaign.out, args.txl_runs)
    print(table)
    if args.page:
        write_page(args.page, table, campaign.rows)
    broken = [r for r in campaign.rows if r["ok"] is False]
    print(f"{len(campaign.rows)} cases: {len(broken)} broken, "
          f"{sum(r['ok'] is None for r in campaign.rows)} skipped", file=sys.stderr)
    return 1 if broken else 0


if __name__ == "__main__":
    sys.exit(main())
