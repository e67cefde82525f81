"""The DSPy user's script (docs/examples/dspy_user.py) runs as written: dspy.configure(lm=...), CRAG over
the user's own retriever, CRAGOptimizer on lists of Examples, save, load and answer in a fresh process,
and the embedded model is never started."""

import json
import os
import subprocess
import sys
from pathlib import Path

from crag_dspy.program import read_program

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "docs" / "examples" / "dspy_user.py"

# Loaded by every Python process of the run (PYTHONPATH): starting the embedded model fails the script,
# and each process records that the guard was in place.
GUARD = """
import os
import crag_dspy.lm.embedded as embedded
import crag_dspy.lm.factory as factory

def refuse(*args, **kwargs):
    raise SystemExit("the embedded model was started")

embedded.start_embedded_server = factory.start_embedded_server = refuse
with open(os.environ["GUARD_LOG"], "a") as log:
    log.write(f"{os.getpid()}\\n")
"""


def test_the_dspy_users_script_compiles_saves_loads_and_answers_without_the_embedded_model(tmp_path):
    guard = tmp_path / "guard"
    guard.mkdir()
    (guard / "sitecustomize.py").write_text(GUARD)
    env = {k: v for k, v in os.environ.items() if not k.startswith("CRAG_")}  # CRAG_LM unset: embedded
    env |= {"PYTHONPATH": f"{guard}{os.pathsep}{ROOT}", "GUARD_LOG": str(tmp_path / "guarded.log")}
    program = tmp_path / "program.json"
    run = subprocess.run(
        [sys.executable, str(SCRIPT), str(program)],
        check=False,
        capture_output=True,
        text=True,
        env=env,
        cwd=tmp_path,
    )
    assert run.returncode == 0, run.stderr[-2000:]
    *_, summary, answered = run.stdout.strip().splitlines()
    # omega is only on the "web": the loaded program grades the retrieved sheets irrelevant and searches.
    assert json.loads(answered) == {"answer": "W700", "action": "INCORRECT", "k": 5}
    assert summary == "thresholds: defaults, grader kept: zero-shot"
    # Two processes (the compile, the fresh one that loaded and answered), each with the guard in place.
    assert len(set((tmp_path / "guarded.log").read_text().split())) == 2
    document = read_program(program)  # a program file the app reads too
    assert document["metadata"].get("domain") is None and document["grader.calibration"]["slope"] != 1.0
